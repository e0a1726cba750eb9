"""A program's create and fork cannot widen its policy (sessiond.table.policy.widening)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from sessiond.table.policy import widening
from sessiond.table.policy_rules import decide
from sessiond.table.spec import BadSpec, SessionSpec, parse_spec

CALLER = """name = "caller"
[run]
exec = ["true"]
grants = ["ps", "send", "create"]
[policy]
deny = ["rm_*"]
ask = ["pay", "edit_*"]
allow = ["read_file"]
approval_ttl = "1h"
"""


def spec(text: str) -> SessionSpec:
    return parse_spec(text, base=Path("/tmp"))


def child(policy: str, run: str = '[run]\nexec = ["true"]\ngrants = ["ps"]\n') -> SessionSpec:
    return spec(f'name = "child"\n{run}[policy]\n{policy}')


def test_the_same_or_a_stricter_policy_is_not_wider() -> None:
    caller = spec(CALLER)
    assert widening(caller, caller) == []
    stricter = child('deny = ["rm_*", "pay"]\nask = ["edit_*"]\napproval_ttl = "10m"\n')
    assert widening(stricter, caller) == []


@pytest.mark.parametrize(
    ("policy", "why"),
    [
        ('ask = ["pay", "edit_*"]\nallow = ["read_file"]\n', "does not deny rm_*"),
        ('deny = ["rm_*"]\nask = ["pay"]\n', "does not ask for edit_*"),
        ('deny = ["rm_*"]\nask = ["pay", "edit_*"]\nallow = ["*"]\n', "allows *"),
        ('deny = ["rm_*"]\nask = ["pay", "edit_*"]\napproval_ttl = "2h"\n', "last 7200s"),
    ],
)
def test_a_policy_that_decides_anything_more_leniently_is_wider(policy: str, why: str) -> None:
    problems = widening(child(policy), spec(CALLER))
    assert any(why in p for p in problems), problems


def test_more_grants_or_a_program_where_the_caller_has_none_is_wider() -> None:
    policy = 'deny = ["rm_*"]\nask = ["pay", "edit_*"]\n'
    granted = child(policy, run='[run]\nexec = ["true"]\ngrants = ["ps", "fork"]\n')
    assert any("granted fork" in p for p in widening(granted, spec(CALLER)))
    no_program = spec('name = "caller"\n[policy]\ndeny = ["rm_*"]\nask = ["pay", "edit_*"]\n')
    assert any("has a program" in p for p in widening(child(policy), no_program))


def test_a_compaction_command_is_a_program_where_the_caller_has_none() -> None:
    policy = 'deny = ["rm_*"]\nask = ["pay", "edit_*"]\n'
    compacting = child(policy, run='[compact]\nexec = ["/tmp/summarise.py"]\n')
    no_program = spec('name = "caller"\n[policy]\ndeny = ["rm_*"]\nask = ["pay", "edit_*"]\n')
    problems = widening(compacting, no_program)
    assert any("[compact] exec command, a program too" in p for p in problems), problems
    # a caller with a program of its own may: the command runs confined like its runs
    assert widening(compacting, spec(CALLER)) == []


def test_what_is_not_wider_decides_no_tool_more_leniently() -> None:
    """The rule is sound: for every tool and side effect, a new policy the check
    accepts decides at least as strictly as the caller's."""
    caller = spec(CALLER)
    strict = {"deny": 2, "ask": 1, "allow": 0}
    lists = {"deny": ["rm_*", "pay"], "ask": ["pay", "edit_*", "x"], "allow": ["read_file", "y"]}
    tools = ["rm_rf", "pay", "edit_a", "read_file", "x", "y", "other"]
    effects = ["none", "read", "workspace-write", "external-write"]
    accepted = 0
    for deny_n, ask_n, allow_n in itertools.product(range(3), range(4), range(3)):
        policy = (
            f"deny = {lists['deny'][:deny_n]!r}\nask = {lists['ask'][:ask_n]!r}\n"
            f"allow = {lists['allow'][:allow_n]!r}\n"
        ).replace("'", '"')
        new = child(policy)
        if widening(new, caller):
            continue
        accepted += 1
        for tool, effect in itertools.product(tools, effects):
            mine = decide(caller.policy, tool, effect).decision
            theirs = decide(new.policy, tool, effect).decision
            assert strict[theirs] >= strict[mine], (policy, tool, effect)
    assert accepted > 0


def test_grants_that_are_a_persons_are_refused_in_a_spec() -> None:
    with pytest.raises(BadSpec, match="'approve': not a method a program may be granted"):
        spec('name = "x"\n[run]\nexec = ["true"]\ngrants = ["send", "approve"]\n')


@pytest.mark.parametrize(
    ("run", "why"),
    [
        ('cwd = "/etc"\n', "it may write /etc (its workspace"),
        ('writable = ["/etc"]\n', "it is writable /etc"),
        ('readable = ["/root"]\n', "it is readable /root"),
        ('secrets = { K = { env = "DSN" } }\n', "its program is given secrets K"),
        ('profile = "premium"\n', "it runs with profile 'premium'"),
        ('network = "host"\n', 'its network is "host"'),
        ("hide = []\n", "it does not hide /srv/private"),
    ],
)
def test_a_run_that_reaches_more_of_the_host_is_wider(run: str, why: str) -> None:
    caller = spec(CALLER.replace("[policy]", 'network = "none"\nhide = ["/srv/private"]\n[policy]'))
    same = "".join(
        line + "\n"
        for line in ('network = "none"', 'hide = ["/srv/private"]')
        if line.split(" ")[0] != run.split(" ", maxsplit=1)[0]
    )
    new = child("", run=f'[run]\nexec = ["true"]\ngrants = ["ps"]\n{same}{run}')
    problems = widening(new, caller)
    assert any(why in p for p in problems), problems


def test_a_run_that_may_write_more_of_the_workspace_is_wider() -> None:
    """The caller's run may write only ``out/`` (``writes``): a session on the same
    workspace that may write all of it, or more than ``out/``, is wider."""
    caller = spec(CALLER.replace("[policy]", 'cwd = "/srv/ws"\nwrites = ["out/*.json"]\n[policy]'))
    policy = (
        'deny = ["rm_*"]\nask = ["pay", "edit_*"]\nallow = ["read_file"]\napproval_ttl = "1h"\n'
    )
    run = '[run]\nexec = ["true"]\ngrants = ["ps"]\ncwd = "/srv/ws"\n'
    assert any("it may write /srv/ws " in p for p in widening(child(policy, run=run), caller))
    narrower = widening(child(policy, run=run + 'writes = ["out/a.json"]\n'), caller)
    assert narrower == [], narrower
    inside = widening(child(policy, run=run.replace("/srv/ws", "/srv/ws/out")), caller)
    assert inside == [], inside


STANDING = 'name = "{name}"\nagent = "{agent}"\npriority = {priority}\n[run]\nexec = ["true"]\n'
STANDING += (
    'grants = ["ps"]\n[policy]\ndeny = ["rm_*"]\nask = ["pay", "edit_*"]\n[budget]\n{budget}\n'
)
BUDGET = "tokens_per_day = 1000\ncost_usd = 2.5"


def standing(agent: str = "scribe", priority: int = 10, budget: str = BUDGET) -> SessionSpec:
    return spec(STANDING.format(name="child", agent=agent, priority=priority, budget=budget))


@pytest.mark.parametrize(
    ("new", "why"),
    [
        (standing(priority=90), "priority 90 is above this session's 10"),
        (standing(agent="someone-else"), "runs as agent 'someone-else'"),
        (standing(agent=""), "runs as agent '(none)'"),
        (standing(budget="cost_usd = 2.5"), "tokens_per_day is unlimited"),
        (standing(budget="tokens_per_day = 5000\ncost_usd = 2"), "is 5000, this session's 1000"),
        (standing(budget="tokens_per_day = 1000"), "cost_usd is unlimited"),
    ],
)
def test_a_session_that_stands_higher_at_the_model_or_spends_more_is_wider(
    new: SessionSpec, why: str
) -> None:
    # a program that creates a session of a higher priority, under another agent's
    # name or without its budget would jump the model's queue or escape the budget
    caller = standing()
    problems = widening(new, caller)
    assert any(why in p for p in problems), problems
    lower = standing(priority=5, budget="tokens_per_day = 800\ncost_usd = 1.5\ntokens = 9")
    assert widening(lower, caller) == []
