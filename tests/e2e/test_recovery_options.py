"""Honest recovery, on the real daemon: for each reason a session can be blocked
that a test can bring about with a real program, ``gate`` and ``show`` name the
reason and offer exactly the answers that change something; each offered
``resolve`` changes the session, and each one not offered is refused (exit 1)
saying why and what would help. (The gate-only reasons are covered by the table
in tests/table/test_recovery.py.)"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tests.e2e.harness import Daemon, running, wait_event
from tests.e2e.webclient import WEB, logged_in

ALL = ("rerun", "discard", "accept")


@dataclass(frozen=True)
class Case:
    kind: str  # the cause table.recovery names
    run: str  # the spec's [run] and [policy]
    blocked_by: str  # the event that blocks it
    options: tuple[str, ...]
    answers: tuple[str, ...] = ()
    hint: str = ""  # what a refusal must point to


CASES = [
    Case(
        "approval",
        '[run]\nexec = ["true"]\nretries = 0\n[policy]\nask = ["command"]\n',
        "approval.requested",
        (),  # its wake is pending: a discarded call is asked again at once
        ("approve", "deny"),
        "sessionctl approve",
    ),
    Case(
        "run-failed",
        '[run]\nexec = ["false"]\nretries = 0\n',
        "lifecycle.changed",
        ("rerun", "discard", "accept"),
    ),
    Case(
        "policy-denied",
        '[run]\nexec = ["true"]\nretries = 0\n[policy]\ndeny = ["command"]\n',
        "lifecycle.changed",
        (),  # nothing but a new policy changes it
        (),
        "sessionctl apply",
    ),
]


def _blocked(d: Daemon, name: str, case: Case) -> dict[str, Any]:
    d.write_spec(name, f'name = "{name}"\n{case.run}')
    d.ctl("create", str(d.root / f"{name}.toml"), check=True)
    d.ctl("activate", name)
    wait_event(d, name, "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked")
    shown: dict[str, Any] = d.json("show", name)
    assert shown["state"] == "blocked", shown
    return shown


def _where(shown: dict[str, Any]) -> tuple[Any, ...]:
    return (shown["state"], shown["reason"], shown["runs"], shown["seq"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.kind)
def test_each_block_offers_exactly_what_changes_it(case: Case) -> None:
    with running(WEB) as d:
        probe = _blocked(d, "probe", case)
        if case.kind == "run-failed":  # retries = 0: one failure ("1 times" read badly)
            assert probe["reason"].startswith("run failed once (last: failed (exit 1));"), probe
        gate = d.ctl("--json", "gate", "probe")
        assert gate.returncode == 1, gate.stdout  # blocked is never "ok"
        report = orjson.loads(gate.stdout)
        assert not report["ok"]
        assert [c["kind"] for c in report["causes"]] == [case.kind], report["causes"]
        assert tuple(report["options"]) == case.options
        assert tuple(report["answers"]) == case.answers
        text = d.ctl("gate", "probe").stdout
        assert "the session may continue" not in text
        for option in case.options:
            assert f"--{option}" in text, text
        shown = d.ctl("show", "probe").stdout
        assert f"blocked by: {case.kind}" in shown, shown
        assert "recover:" in shown, shown
        assert "last gate: ok (seq" not in shown or "before the block" in shown, shown
        # the console: its gate is not "ok", and its buttons are exactly the options
        page = logged_in(d).get("/s/probe").body.decode()
        assert '<span class="bad">blocked</span>' in page
        buttons = re.findall(r'class="resolve"[^>]*data-body=\'\{"option": "(\w+)"\}\'', page)
        assert tuple(buttons) == case.options, buttons
        for option in set(ALL) - set(case.options):
            refused = d.ctl("resolve", "probe", f"--{option}")
            assert refused.returncode == 1, (option, refused.stdout, refused.stderr)
            assert "would change nothing" in refused.stderr, refused.stderr
            assert report["causes"][0]["detail"][:40] in refused.stderr  # why
            for other in case.options:
                assert f"--{other}" in refused.stderr, refused.stderr
            if case.hint:
                assert case.hint in refused.stderr, refused.stderr
            assert _where(d.json("show", "probe")) == _where(probe)  # nothing recorded
        for option in case.options:  # each offered answer changes something
            name = f"s-{option}"
            before = _blocked(d, name, case)
            done = d.ctl("resolve", name, f"--{option}")
            assert done.returncode == 0, done.stderr
            after = d.json("show", name)
            assert _where(after)[:3] != _where(before)[:3], (option, after)
        d.stop()


def test_a_policy_that_allows_the_command_now_makes_rerun_an_option() -> None:
    with running() as d:
        case = CASES[2]
        _blocked(d, "p", case)
        allowed = d.write_spec("p2", 'name = "p"\n[run]\nexec = ["true"]\nretries = 0\n')
        d.ctl("apply", "p", str(allowed), check=True)
        report = orjson.loads(d.ctl("--json", "gate", "p").stdout)
        assert report["options"] == ["rerun"], report
        d.ctl("resolve", "p", "--rerun", check=True)
        wait_event(d, "p", "run.finished")
        d.stop()
