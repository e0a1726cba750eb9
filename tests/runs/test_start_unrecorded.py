"""A run whose ``run.started`` could not be recorded (sessiond/runs/start.py).

The bug: a ``run.started`` that failed validation (a run kind its event did not
know yet) had its program stopped by the daemon, which reads as
``interrupted``: a stop someone asked for, counted against no retry. The session
was retried every 0.5 s forever, its reason "retry 0 of 0". Now the run fails,
with why, and follows ``retries``, then blocks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from sessiond.runs.program import Outcome
from sessiond.runs.settle import Settler
from sessiond.runs.start import Starter
from tests.helpers import arun


class Program:
    """The stopped program: its end reads as the daemon's own stop."""

    def __init__(self) -> None:
        self.stopped: list[str] = []
        self.proc_start = 42

    async def stop(self, reason: str) -> None:
        self.stopped.append(reason)

    async def wait(self) -> Outcome:
        return Outcome("interrupted", None, 15, 3, b"", b"", 0, 0)


class Table:
    def __init__(self) -> None:
        self.appended: list[Any] = []

    async def append(self, s: Any, data: Any, **_: Any) -> None:
        self.appended.append(data)


def _starter(table: Table) -> Any:
    return cast(Any, Starter(cast(Any, SimpleNamespace(table=table)), *[cast(Any, None)] * 3))


def _spec(kind: str) -> Any:
    return SimpleNamespace(run=SimpleNamespace(kind=kind, profile="default"))


def test_a_run_started_that_fails_validation_fails_the_run_with_why() -> None:
    table = Table()
    starter = _starter(table)
    program = Program()
    session = SimpleNamespace(name="job")
    recorded = arun(
        starter._record_start(
            session, spec=_spec("no-such-kind"), program=program, run_id="r1", pid=123,
            wakes=[], cause=None, turn=1,
        )
    )  # fmt: skip
    assert recorded is False
    assert table.appended == []
    assert program.stopped == ["run.started could not be recorded"]  # never let go

    outcome = arun(starter._unrecorded(program, "r1"))
    assert outcome.status == "failed"  # not "interrupted": it counts against the retries
    assert outcome.error.startswith("run.started could not be recorded: ")
    assert "kind" in outcome.error  # the field that failed
    assert "\n" not in outcome.error
    assert starter.unrecorded == {}


def test_the_same_start_recorded_is_let_go() -> None:
    table = Table()
    program = Program()
    recorded = arun(
        _starter(table)._record_start(
            SimpleNamespace(name="job"), spec=_spec("sdk"), program=program, run_id="r1",
            pid=123, wakes=[], cause=None, turn=1,
        )
    )  # fmt: skip
    assert recorded is True
    assert [type(d).__name__ for d in table.appended] == ["RunStarted"]
    assert program.stopped == []


def _after_run(outcome: Outcome, *, failures: int, retries: int) -> list[tuple[str, str]]:
    """What the session does after the run: (state, reason) of each transition."""
    moves: list[tuple[str, str]] = []

    async def transition(_s: Any, to: str, **kw: Any) -> None:
        moves.append((to, kw["reason"]))

    session = SimpleNamespace(
        name="job",
        spec=SimpleNamespace(
            run=SimpleNamespace(kind="sdk", retries=retries),
            budget=SimpleNamespace(seconds_per_run=None),
            has_triggers=False,
        ),
        journal=SimpleNamespace(
            state=SimpleNamespace(failures_in_a_row=failures, pending_wakes=[])
        ),
    )
    settler = cast(Any, object.__new__(Settler))
    settler.ctx = SimpleNamespace(transition=transition)
    settler._schedule_retry = lambda *_: None
    arun(settler.after_run(session, outcome))
    return moves


def test_the_failed_run_blocks_once_its_retries_are_spent_and_says_why() -> None:
    why = "run.started could not be recorded: 1 validation error for RunStarted kind"
    failed = Outcome("failed", None, 15, 3, b"", b"", 0, 0, error=why)
    # as the log counts it: run.finished "failed" adds one failure in a row
    [(state, reason)] = _after_run(failed, failures=1, retries=0)
    assert state == "blocked"
    assert why in reason
    assert "retry" not in reason.split(";")[0]
    [(state, reason)] = _after_run(failed, failures=1, retries=2)
    assert state == "sleeping"
    assert "retry 1 of 2 in 1s" in reason
    assert why in reason
