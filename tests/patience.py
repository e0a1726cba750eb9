"""How long a judge waits for the daemon: a bound that only catches a hang.

Used by the kill -9 campaign's judges (tests/faults/) and the end-to-end
harness's waits on the daemon's own log lines and events (tests/e2e/harness.py).

A judge that waits N seconds of wall clock fails on good code when the machine
is busy: the daemon did nothing wrong, it was not given a CPU. (``make faults``
under load once reported "no gate verdict after the restart" that way.) So the
time a judge gives the daemon counts only the seconds in which the daemon could
have run:

- the seconds its threads waited for a CPU (the run-queue wait the kernel keeps
  per thread, ``/proc/PID/task/TID/schedstat``) do not count;
- the count starts again whenever the daemon shows progress (what ``progress``
  returns changes: the size of its logs, the rows of a table), up to a limit
  (ten times the bound) past which busy is no excuse;
- a daemon that is gone will not answer: the wait ends at once.

What remains is a hang: a daemon that could run and did nothing for ``quiet``
seconds. The bound is generous (a minute by default) because it no longer needs
to be tight to keep the campaign fast: an answer ends the wait as soon as it is
there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path


def slow_factor(
    environ: Mapping[str, str] = os.environ,
    load: Callable[[], tuple[float, float, float]] = os.getloadavg,
    cpus: int | None = os.cpu_count(),
) -> float:
    """How much slower than a quiet machine the tests should allow for: the one
    factor every test's timing allowance is multiplied by (the cluster tests'
    leases that are let lapse, their "within so many seconds" checks).

    ``SESSIOND_TEST_SLOW`` says it (at least 1); otherwise 3 under ``CI=true``
    (a CI runner is shared and may run two suites at once) or when the machine
    already has more runnable processes than CPUs (the 1-minute load average
    above the CPU count), else 1. Only allowances scale with it: what a test
    checks does not change, and an answer that comes early ends a wait early."""
    said = environ.get("SESSIOND_TEST_SLOW")
    if said:
        try:
            return max(1.0, float(said))
        except ValueError:
            raise ValueError(f"SESSIOND_TEST_SLOW={said!r}: give a number, e.g. 3") from None
    if environ.get("CI") == "true" or load()[0] > (cpus or 1):
        return 3.0
    return 1.0


# Read once a test process: the allowances of one run do not change under it.
SLOW = slow_factor()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that may still act (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def run_queue_wait(pid: int) -> dict[int, int]:
    """Nanoseconds each thread of ``pid`` has waited for a CPU (tid -> ns)."""
    waits: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return waits
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                waits[int(tid)] = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return waits


def log_sizes(sessions: Path) -> int:
    """The total size of the session logs (``sessions/*/events.jsonl``): they grow
    as the daemon works."""
    total = 0
    try:
        names = os.listdir(sessions)
    except OSError:
        return 0  # a power cut took the folder's entry
    for name in names:
        try:
            total += os.stat(sessions / name / "events.jsonl").st_size
        except OSError:
            continue
    return total


class Patience:
    """While a judge should wait for the daemon(s) ``pids``: see the module."""

    def __init__(
        self,
        pids: int | Iterable[int],
        *,
        quiet: float = 60.0,
        progress: Callable[[], object] | None = None,
        limit: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pids = [pids] if isinstance(pids, int) else list(pids)
        self.quiet = quiet
        self.progress = progress
        # Progress extends the wait, never past this many seconds the daemon could
        # run (ten times ``quiet`` unless given): a daemon busy with other work that
        # never gives the answer waited for is a failure too, not a reason to wait
        # forever.
        self.limit = 10 * quiet if limit is None else limit
        self.clock = clock
        self.began = clock()
        self.waited: dict[tuple[int, int], int] = {}  # (pid, tid) -> run-queue ns seen
        self._read_waits()
        self.last = progress() if progress is not None else None
        self.since = clock()
        self.held_back = 0.0  # seconds of the count spent waiting for a CPU
        self.held_total = 0.0  # and since the start

    def _read_waits(self) -> float:
        """Seconds the daemons waited for a CPU since the last read: the longest wait
        of any one thread (threads wait side by side, so a sum could pass the wall
        clock, and the event loop's thread is the one that answers)."""
        most = 0
        for pid in self.pids:
            for tid, ns in run_queue_wait(pid).items():
                before = self.waited.get((pid, tid), ns)
                most = max(most, ns - before)
                self.waited[(pid, tid)] = ns
        return most / 1e9

    def waited_for(self) -> float:
        """The seconds counted so far: the wall clock since the last progress, less
        the daemons' time waiting for a CPU."""
        held = self._read_waits()
        self.held_back += held
        self.held_total += held
        if self.progress is not None:
            now = self.progress()
            if now != self.last:
                self.last, self.since, self.held_back = now, self.clock(), 0.0
        return self.clock() - self.since - self.held_back

    def waiting(self) -> bool:
        """True while the answer may still come: a daemon lives, and none of them
        hung (could run, made no progress) for ``quiet`` seconds."""
        return self.left() > 0

    def left(self) -> float:
        """The seconds still to give (0 once a daemon died or all hung): a bound for
        one wait on a condition, after which the judge looks again."""
        if not any(alive(pid) for pid in self.pids):
            return 0.0
        quiet_left = self.quiet - self.waited_for()
        limit_left = self.limit - (self.clock() - self.began - self.held_total)
        return max(0.0, min(quiet_left, limit_left))

    def pause(self, seconds: float = 0.05) -> None:
        """Between two looks at what the judge waits for."""
        time.sleep(seconds)
