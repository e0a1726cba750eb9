"""The hostile programs' containment checks see a violation when there is one
(tests/faults/contain.py), and the workload covers what the issue lists."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from sessiond.log.event_data import Idempotency, ResumeRule, SideEffect
from tests.e2e.harness import wait_for
from tests.faults import contain, workload
from tests.faults.tally import Tally


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger"
    path.touch()
    return path


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def tick(ledger: Path, who: str) -> None:
    with open(ledger, "a") as f:
        f.write(f"tick {who} {2**22 + 1}\n")  # no such pid


def test_a_ticker_seen_before_a_kill_that_ticks_after_the_restart_settled_is_late(
    ledger: Path,
) -> None:
    tally = Tally()
    c = contain.Containment(ledger, tally)
    tick(ledger, "escape 1")
    tick(ledger, "term 2")
    c.stopping()  # the kill
    tick(ledger, "escape 1")  # dying, before the restart settled: allowed
    c.settled("the restart")
    assert tally.late_work == []
    tick(ledger, "holder 3")  # a new run's ticker after the restart: allowed
    tick(ledger, "escape 1")  # lives on after the restart settled: a violation
    c.settled("the restart")
    assert tally.late_work == [
        f"round 0: ticker escape 1 (pid {2**22 + 1}) ticked after the restart"
    ]
    tick(ledger, "holder 3")  # seen after the last kill, before the next: allowed
    c.check_late("the daemon stopped")
    assert len(tally.late_work) == 1


def test_a_marked_process_left_after_a_stop_or_outside_the_daemon_is_counted_and_killed(
    ledger: Path, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    tally = Tally()
    c = contain.Containment(ledger, tally)
    # one process carrying the mark: a shell's `sleep` child outlived the shell's kill
    argv = [sys.executable, "-c", "import time; time.sleep(600)", c.mark]
    procs.append(subprocess.Popen(argv))
    wait_for(lambda: procs[0].pid in contain.running(c.mark), what="the exec")
    c.orphans(daemon_pid=os.getpid() + 10**6, timeout=0.2)  # not its ancestor
    assert len(tally.orphans) == 1
    assert c.mark in tally.orphans[0]
    assert procs[0].wait(10) == -9
    procs.append(subprocess.Popen(argv))
    wait_for(lambda: procs[1].pid in contain.running(c.mark), what="the exec")
    c.orphans(daemon_pid=os.getpid(), timeout=0.2)  # inside "the daemon's" tree: fine
    assert len(tally.orphans) == 1
    c.after_stop(tmp_path / "state", timeout=0.2)
    assert len(tally.left_after_stop) == 1
    assert tally.stops == 1
    assert procs[1].wait(10) == -9
    assert "processes left after a clean stop" in tally.violations()


def test_the_hostile_programs_leave_their_children_and_tick(
    ledger: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Each program as the daemon would start it: what it leaves carries the
    marker (so the checks can find it) and its ticker writes to the ledger."""
    mark = contain.mark_for(ledger)
    env = {**os.environ, "LEDGER": str(ledger), "SESSIOND_TURN": "1"}
    try:
        for text in contain.specs(ledger).values():
            argv = tomllib.loads(text)["run"]["exec"]
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL))
        kinds = {name.removeprefix("h-") for name in contain.PROGRAMS}

        def ticked() -> set[str]:
            lines = ledger.read_text().splitlines()
            return {line.split()[1] for line in lines if line.startswith("tick ")}

        wait_for(lambda: ticked() == kinds, 30, what="a tick of every hostile program")
        # the bomb's 24, the escapee, holder and term children: more than the leaders
        wait_for(lambda: len(contain.running(mark)) > 24 + len(kinds), what="the bomb's")
        # the escapee carries no marker: only its ticks (and its ledger argument) show it
        escapee = contain.running("\0escapee\0")  # the ticker, its $0
        assert escapee
        assert not set(escapee) & set(contain.running(mark))
    finally:
        contain.Containment(ledger, Tally()).power_off()


def test_the_workload_covers_every_risk_contract_value_and_trigger(tmp_path: Path) -> None:
    specs = workload.specs(sys.executable, tmp_path / "ledger", tmp_path / "sock")
    runs = [tomllib.loads(text) for text in specs.values()]
    seen = {key: {r["run"].get(key) for r in runs if "run" in r}
            for key in ("idempotency", "resume", "side_effect")}  # fmt: skip
    assert set(get_args(Idempotency)) <= seen["idempotency"]
    assert set(get_args(ResumeRule)) <= seen["resume"]
    assert set(get_args(SideEffect)) <= seen["side_effect"]
    triggers = {t["type"] for r in runs for t in r.get("trigger", [])}
    assert {"cron", "every", "watch", "git", "message"} <= triggers
    assert {"h-holder", "h-term", "h-escape", "h-bomb", "h-flood", "hostile"} <= set(specs)
