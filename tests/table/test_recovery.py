"""Honest recovery, the whole table: for every reason a session can be blocked,
the gate names it (never "ok" while it stands), offers exactly the resolve options
that change it, and ``refusal`` turns every other option away naming why and what
would help. The reasons a real daemon can be brought to are also driven end to
end (tests/e2e/test_recovery_options.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sessiond.log.event_data import RiskContract
from sessiond.table import recovery
from sessiond.table.gate import GateVerdict, evaluate
from sessiond.table.spec import parse_spec
from tests.table.test_gate import H_BEFORE, H_BOUND, H_OTHER, NOW, SPEC, _events, _state

OK_DISK = {"out.txt": H_BEFORE, "bound.txt": H_BOUND}
ALL = ("rerun", "discard", "accept")


def _spec(extra: str) -> Any:
    return parse_spec(f'name = "s"\n{extra}', base=Path("/"))


def _verdict(events: str, **kw: Any) -> GateVerdict:
    risk = kw.pop("risk", RiskContract())
    state = _state(_events(events, risk) if events else [])
    for key, value in kw.pop("state", {}).items():
        setattr(state, key, value)
    disk = kw.pop("disk", OK_DISK)
    spec = kw.pop("spec", SPEC)
    now = kw.pop("now", NOW)
    return evaluate(state, spec, now=now, hash_file=disk.get, has_artifact=lambda r: True, **kw)


DIVERGENCE = {
    "ordinal": 2,
    "key": None,
    "recorded": {"kind": "step", "name": "fetch", "digest": None, "slot": "2"},
    "asked": {"kind": "step", "name": "charge", "digest": None, "slot": "2"},
}
FAILED_STEP = {
    "2": {"slot": "2", "ordinal": 2, "name": "charge", "call": "r1.2", "kind": "step",
          "status": "error", "error": "execution", "risk": {"idempotency": "unsafe"}},
}  # fmt: skip


def _turn(**kw: Any) -> dict[str, Any]:
    return {"n": 1, "runs": 1, "wakes": [], "steps": {}, "calls": {}, "divergence": None, **kw}


# reason -> (how to bring it about, the resolve options that change it, other answers)
CASES: dict[str, tuple[Callable[[], GateVerdict], tuple[str, ...], tuple[str, ...]]] = {
    "approval": (lambda: _verdict("approval"), ("discard",), ("approve", "deny")),
    "divergence": (
        lambda: _verdict("", state={"turn": _turn(divergence=DIVERGENCE)}),
        ("discard", "accept"),
        (),
    ),
    "cut-off": (
        lambda: _verdict("started", risk=RiskContract(idempotency="unsafe")),
        ALL,
        (),
    ),
    "failed-step": (lambda: _verdict("", state={"turn": _turn(steps=FAILED_STEP)}), ALL, ()),
    "expired": (lambda: _verdict("approved", now="2026-06-01T13:00:01Z"), ("discard",), ()),
    "denied-now": (
        lambda: _verdict("approved", spec=_spec('[policy]\ndeny = ["edit_*"]\n')),
        ("discard",),
        (),
    ),
    "workspace": (lambda: _verdict("", state={"bound": {"bound.txt": H_OTHER}}), ("accept",), ()),
    "artifacts": (
        lambda: _verdict(
            "",
            state={"last_run": {"run": "r1", "stdout": {"ref": "a" * 64, "name": "stdout"}}},
            check_artifact=lambda ref: "missing",
        ),
        (),
        (),
    ),
    "log": (lambda: _verdict("", log_error="line 7 is corrupt"), (), ()),
    "run-failed": (
        lambda: _verdict(
            "",
            state={
                "state": "blocked",
                "reason": "run failed 4 times in a row (last: exit 1)",
                "turn": _turn(),
            },
        ),
        ("rerun", "discard"),
        (),
    ),
    "blocked": (
        lambda: _verdict(
            "",
            state={
                "state": "blocked",
                "reason": "the end of run r1 could not be recorded: x",
                "turn": _turn(),
            },
        ),
        ("rerun", "discard"),
        (),
    ),
    "policy-denied": (
        lambda: _verdict(
            "",
            spec=_spec('[run]\nexec = ["true"]\n[policy]\ndeny = ["command"]\n'),
            state={"state": "blocked", "reason": "policy denies the command (deny: command)"},
        ),
        (),
        (),
    ),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_every_block_reason_offers_exactly_the_options_that_change_it(kind: str) -> None:
    make, options, answers = CASES[kind]
    verdict = make()
    assert verdict.outcome == "blocked", verdict.checks  # the reason and the verdict agree
    assert not verdict.ok
    assert [c.kind for c in verdict.causes] == [kind], verdict.causes
    assert set(verdict.options) == set(options)
    assert recovery.answers_of(verdict.causes) == answers
    for option in ALL:
        why = recovery.refusal("s", option, verdict.causes)
        if option in options:
            assert why is None
            continue
        assert why is not None
        assert f"resolve --{option} would change nothing: session 's' is blocked: " in why
        assert verdict.causes[0].detail in why  # why it is blocked
        for other in options:  # and what would change it
            assert f"'sessionctl resolve s --{other}'" in why
        for answer in answers:
            assert f"'sessionctl {answer} s'" in why
        if not options and not answers:
            assert "no answer changes it: " + verdict.causes[0].todo in why


def test_the_table_covers_every_kind() -> None:
    # arriving and held are not the gate's (a hand-over, a disk that refused the block):
    # sessiond.syscalls.views.causes_of names them
    assert set(CASES) | {"arriving", "held", "budget"} == set(recovery.KINDS)


def test_a_run_failed_with_a_failed_step_may_also_take_it_as_done() -> None:
    verdict = _verdict(
        "",
        state={"state": "blocked", "reason": "run failed (exit 1); not retried: x",
               "turn": _turn(steps={"2": {**FAILED_STEP["2"], "risk": {}}})},
    )  # fmt: skip
    assert set(verdict.options) == set(ALL)


def test_a_denied_command_may_run_again_once_the_policy_allows_it() -> None:
    verdict = _verdict(
        "",
        spec=_spec('[run]\nexec = ["true"]\n'),
        state={"state": "blocked", "reason": "policy denies the command (deny: command)"},
    )
    assert verdict.options == ("rerun",)


def test_a_spent_budget_beside_another_cause_is_named_with_what_to_do() -> None:
    spec = _spec("[budget]\ntokens = 10\n")
    verdict = _verdict("", spec=spec, state={"tokens_in": 11, "bound": {"bound.txt": H_OTHER}})
    assert [c.kind for c in verdict.causes] == ["workspace", "budget"]
    assert verdict.options == ("accept",)
    alone = _verdict("", spec=spec, state={"tokens_in": 11})
    assert alone.outcome == "suspended"
    assert [c.kind for c in alone.causes] == ["budget"]
    assert "apply" in alone.causes[0].todo


def test_a_session_that_is_not_blocked_by_anything_has_nothing_to_resolve() -> None:
    verdict = _verdict("")
    assert verdict.ok
    assert not verdict.causes
    assert verdict.options == ()
    why = recovery.refusal("s", "rerun", verdict.causes)
    assert why is not None
    assert "nothing holds it" in why
