"""The judges wait on the daemon's progress, not on the wall clock
(tests/patience.py, checks.first_verdict).

Under load ``make faults FAULT_ROUNDS=8`` once reported "no gate verdict after
the restart" on good code: the judge had waited 30 s of wall clock while the
daemon waited for a CPU. The waits below run on a manual clock, with the
daemon's run-queue wait scripted: how busy the machine is, as numbers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sessiond.codec import encode_line
from tests import patience as patience_module
from tests.faults.checks import cut_off_calls, first_verdict
from tests.patience import SLOW, Patience, alive, slow_factor


class Machine:
    """A manual clock, and how long the daemon's one thread waited for a CPU."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        self.starved_ns = 0
        monkeypatch.setattr(patience_module, "run_queue_wait", lambda pid: {pid: self.starved_ns})

    def clock(self) -> float:
        return self.now

    def busy(self, seconds: float) -> None:
        """``seconds`` pass, all of them spent waiting for a CPU."""
        self.now += seconds
        self.starved_ns += int(seconds * 1e9)


def verdict(seq: int) -> bytes:
    data: dict[str, Any] = {"ok": False, "outcome": "blocked", "options": ["rerun"]}
    return encode_line({"seq": seq, "type": "gate.evaluated", "data": data})


def test_a_daemon_kept_off_the_cpu_is_waited_for_past_any_wall_clock_bound(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The verdict comes after 10 minutes of a machine too busy to run the
    daemon: it is found, not reported missing."""
    machine = Machine(monkeypatch)
    log = tmp_path / "events.jsonl"
    log.write_bytes(verdict(3))  # the one before the restart
    patience = Patience(os.getpid(), quiet=60, clock=machine.clock)
    looks = 0

    def pause(seconds: float = 0.05) -> None:
        nonlocal looks
        looks += 1
        machine.busy(5)
        if machine.now >= 600:
            with log.open("ab") as f:
                f.write(verdict(4))

    monkeypatch.setattr(patience, "pause", pause)
    found = first_verdict(log, 3, patience)
    assert found is not None
    assert found["seq"] == 4
    assert looks == 120


def test_a_daemon_that_could_run_and_did_nothing_is_a_hang(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine = Machine(monkeypatch)
    log = tmp_path / "events.jsonl"
    log.write_bytes(verdict(3))
    patience = Patience(os.getpid(), quiet=60, clock=machine.clock)
    looks = 0

    def pause(seconds: float = 0.05) -> None:
        nonlocal looks
        looks += 1
        machine.now += 5  # a CPU free all along, and no verdict

    monkeypatch.setattr(patience, "pause", pause)
    assert first_verdict(log, 3, patience) is None
    assert looks == 12  # 60 s of a daemon that could run


def test_progress_starts_the_count_again(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = Machine(monkeypatch)
    size = [0]
    patience = Patience(os.getpid(), quiet=60, progress=lambda: size[0], clock=machine.clock)
    for _ in range(10):  # ten minutes, each minute some work done
        machine.now += 59
        size[0] += 1
        assert patience.waiting()
    machine.now += 61  # then nothing
    assert not patience.waiting()


def test_progress_on_other_work_extends_the_wait_only_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon busy with other sessions that never gives the answer waited for
    is a failure too (a first version waited forever on such a daemon)."""
    machine = Machine(monkeypatch)
    size = [0]
    patience = Patience(os.getpid(), quiet=60, progress=lambda: size[0], clock=machine.clock)
    looks = 0
    while patience.waiting():
        looks += 1
        machine.now += 30
        size[0] += 1  # always some work
        assert looks < 100, "waited forever"
    assert machine.now == 600  # ten times the bound


def test_a_session_blocked_at_the_kill_has_no_call_this_kill_cut_off(tmp_path: Path) -> None:
    """Its calls were cut off by an earlier kill and judged then: the restart
    gives no new verdict (the session waits for a person), so none is awaited."""
    log = tmp_path / "events.jsonl"
    lines = [
        {"seq": 1, "type": "tool.intent", "data": {"call": "r1.command", "risk": {}}},
        {"seq": 2, "type": "tool.started", "data": {"call": "r1.command"}},
    ]
    log.write_bytes(b"".join(encode_line(r) for r in lines))
    assert cut_off_calls(log) == {"r1.command": "safe/rerun-after-check/workspace-write"}
    blocked = {"seq": 4, "type": "lifecycle.changed", "data": {"from": "sleeping", "to": "blocked"}}
    with log.open("ab") as f:
        f.write(verdict(3) + encode_line(blocked))
    assert cut_off_calls(log) == {}


def test_a_dead_daemon_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = Machine(monkeypatch)
    child = subprocess.Popen(["true"])
    # exited, not reaped: a zombie is no daemon that may still answer
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert not alive(child.pid)
    assert not Patience(child.pid, clock=machine.clock).waiting()
    child.wait()
    assert not alive(child.pid)
    assert alive(os.getpid())


def test_the_allowances_grow_under_ci_and_under_load_and_as_said() -> None:
    """SESSIOND_TEST_SLOW says the factor; without it, CI or a load above the
    CPU count makes it 3; a quiet machine keeps 1."""

    def quiet() -> tuple[float, float, float]:
        return (0.5, 0.5, 0.5)

    def busy() -> tuple[float, float, float]:
        return (17.0, 9.0, 5.0)

    assert slow_factor({}, quiet, 2) == 1.0
    assert slow_factor({}, busy, 2) == 3.0
    assert slow_factor({"CI": "true"}, quiet, 2) == 3.0
    assert slow_factor({"SESSIOND_TEST_SLOW": "5"}, quiet, 2) == 5.0
    assert slow_factor({"SESSIOND_TEST_SLOW": "1", "CI": "true"}, busy, 2) == 1.0
    assert slow_factor({"SESSIOND_TEST_SLOW": "0.1"}, busy, 2) == 1.0  # never tighter
    with pytest.raises(ValueError, match="SESSIOND_TEST_SLOW='fast': give a number"):
        slow_factor({"SESSIOND_TEST_SLOW": "fast"}, quiet, 2)


def test_a_tests_hang_bound_grows_with_the_factor(request: pytest.FixtureRequest) -> None:
    """tests/conftest.py raises pyproject's pytest-timeout bound by SLOW."""
    mark = request.node.get_closest_marker("timeout")
    bound = float(request.config.getini("timeout"))
    if SLOW == 1:
        assert mark is None or float(mark.args[0]) == bound
    else:
        assert mark is not None
        assert float(mark.args[0]) == bound * SLOW
