"""A cluster node's programs die at its lease deadline even while the whole node
is paused (sessiond/runs/holder.py): real spawner, holder and program, the whole
tree SIGSTOPped past the deadline and SIGCONTed leaves first."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from sessiond.bench.freeze import measure
from sessiond.runs.spawner_client import SpawnerClient
from tests.e2e.harness import alive, wait_for
from tests.freeze import freeze, frozen, state, thaw, tree

# The program's own ledger: its pid once, then the machine's monotonic time, as
# often as it can write it (a write right after any resume).
WRITER = """import os, sys, time
with open(sys.argv[1], "a", buffering=1) as f:
    f.write(f"pid {os.getpid()}\\n")
    while True:
        f.write(f"{time.monotonic()!r}\\n")
        time.sleep(0.005)
"""


def lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def test_a_frozen_nodes_program_is_dead_before_its_thaw(tmp_path: Path) -> None:
    (tmp_path / "writer.py").write_text(WRITER)
    ledger = tmp_path / "ledger"

    async def main() -> tuple[list[int], float, int]:
        spawner = SpawnerClient()
        spawner.start()
        assert spawner.pid is not None
        # The node's deadline, as a lease renewal tells it: a few seconds from now,
        # never moved again (the daemon that would move it is paused with the rest).
        spawner.fence(time.monotonic() + 5)
        out_r, out_w = os.pipe()
        try:
            held = await spawner.spawn(
                ["python3", "writer.py", str(ledger)],
                cwd=str(tmp_path),
                env={"PATH": os.environ["PATH"]},
                stdout=out_w,
                stderr=out_w,
            )
        finally:
            os.close(out_w)
        spawner.go(held)
        wait_for(lambda: len(lines(ledger)) >= 3, what="the program writing")
        program = int(lines(ledger)[0].split()[1])

        pids = freeze(spawner.pid)
        assert program in pids
        assert held.pid in pids
        wait_for(lambda: frozen(pids), what="the whole tree stopped")
        # Nothing of the node runs now. At its deadline the kernel kills the holder
        # and, with it, the program: a stopped process dies of SIGKILL as it is.
        wait_for(lambda: state(program) in ("Z", ""), what="the program killed while stopped")
        assert not alive(held.pid)
        thawed = time.monotonic()
        thaw(pids)  # the program (were it alive) first: the worst order
        wait_for(lambda: spawner.proc is not None and spawner.proc.poll() is not None,
                 what="the spawner's end: past its deadline, it kills all and exits")  # fmt: skip
        left = [p for p in tree(os.getpid()) if p in pids and alive(p)]
        os.close(out_r)
        await spawner.close()
        return left, thawed, program

    left, thawed, program = asyncio.run(main())
    assert left == []
    written = [float(t) for t in lines(ledger)[1:]]
    assert written
    assert max(written) < thawed  # nothing written once the node resumed
    assert not alive(program)


def test_the_freeze_benchmark_runs_and_finds_nothing_written_after_the_resume() -> None:
    figures = asyncio.run(measure(1, None))
    assert figures["freeze_lines_after_max"] == 0
    assert figures["freeze_acted_ms_max"] == 0
    assert figures["fenced_start_ms"] > 0


def test_a_fenced_program_under_a_run_user_runs_as_that_user(tmp_path: Path) -> None:
    """The fenced start forks (for the parent-death signal) and drops to ``[run]
    user`` first: the signal is asked for after the uid change, which clears it."""
    if os.geteuid() != 0:
        pytest.skip("changing the uid needs root")
    tmp_path.chmod(0o777)

    async def main() -> int:
        spawner = SpawnerClient()
        spawner.start()
        spawner.fence(time.monotonic() + 3600)
        out_r, out_w = os.pipe()
        try:
            held = await spawner.spawn(
                ["sh", "-c", "id -u"], cwd=str(tmp_path), env={"PATH": os.defpath},
                stdout=out_w, stderr=out_w, user=(65534, 65534),
            )  # fmt: skip
        finally:
            os.close(out_w)
        spawner.go(held)
        status = await asyncio.wait_for(held.exited, 30)
        with os.fdopen(out_r) as f:
            printed = f.read()
        await spawner.close()
        assert os.waitstatus_to_exitcode(status) == 0, printed
        return int(printed)

    assert asyncio.run(main()) == 65534


def test_a_renewed_deadline_keeps_the_program_running_and_a_lapsed_one_ends_it(
    tmp_path: Path,
) -> None:
    """Each renewal moves every holder's timer on (FENCE_SIG): the program outlives
    its first deadline while renewals come, and dies once they stop."""
    (tmp_path / "writer.py").write_text(WRITER)
    ledger = tmp_path / "ledger"

    async def main() -> tuple[bool, int]:
        spawner = SpawnerClient()
        spawner.start()
        first = time.monotonic() + 1.5
        spawner.fence(first)
        out_r, out_w = os.pipe()
        try:
            held = await spawner.spawn(
                ["python3", "writer.py", str(ledger)], cwd=str(tmp_path),
                env={"PATH": os.environ["PATH"]}, stdout=out_w, stderr=out_w,
            )  # fmt: skip
        finally:
            os.close(out_w)
        spawner.go(held)
        wait_for(lambda: len(lines(ledger)) >= 2, what="the program writing")
        program = int(lines(ledger)[0].split()[1])
        # renewed as a lease is, each time the program has written 40 more lines,
        # until well past the first deadline
        while time.monotonic() < first + 1.0:
            seen = len(lines(ledger))
            wait_for(lambda s=seen: len(lines(ledger)) >= s + 40, what="the program going on")
            spawner.fence(time.monotonic() + 1.5)
        survived = alive(program)
        status = await asyncio.wait_for(held.exited, 60)  # no renewal now: it lapses
        os.close(out_r)
        await spawner.close()
        return survived, status

    survived, status = asyncio.run(main())
    assert survived  # past its first deadline, renewed
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGKILL  # the holder's timer, then the spawner


# A hostile unsandboxed program: it clears the parent-death signal its holder
# asked for (any process may), then writes as WRITER does.
ESCAPER = """import ctypes, os, sys, time
ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG: none
with open(sys.argv[1], "a", buffering=1) as f:
    f.write(f"pid {os.getpid()}\\n")
    while True:
        f.write(f"{time.monotonic()!r}\\n")
        time.sleep(0.005)
"""


def test_an_unsandboxed_program_that_drops_its_death_signal_ends_with_the_spawner(
    tmp_path: Path,
) -> None:
    """Outside the sandbox a program may clear its own parent-death signal: the
    holder's kernel timer then kills the holder alone. It outlives the freeze
    (its children would too; README, "Fencing"), but not the thaw for long: the
    spawner, past its deadline, kills everything under it and exits."""
    (tmp_path / "escaper.py").write_text(ESCAPER)
    ledger = tmp_path / "ledger"

    async def main() -> tuple[list[int], int]:
        spawner = SpawnerClient()
        spawner.start()
        assert spawner.pid is not None
        spawner.fence(time.monotonic() + 5)
        out_r, out_w = os.pipe()
        try:
            held = await spawner.spawn(
                ["python3", "escaper.py", str(ledger)],
                cwd=str(tmp_path),
                env={"PATH": os.environ["PATH"]},
                stdout=out_w,
                stderr=out_w,
            )
        finally:
            os.close(out_w)
        spawner.go(held)
        wait_for(lambda: len(lines(ledger)) >= 3, what="the program writing")
        program = int(lines(ledger)[0].split()[1])
        pids = freeze(spawner.pid)
        assert program in pids
        wait_for(lambda: frozen(pids), what="the whole tree stopped")
        wait_for(lambda: not alive(held.pid), what="the holder killed at the deadline")
        assert state(program) == "T"  # no death signal: stopped, alive
        thaw(pids)  # the program first
        wait_for(lambda: spawner.proc is not None and spawner.proc.poll() is not None,
                 what="the spawner's end: past its deadline, it kills all and exits")  # fmt: skip
        left = [p for p in pids if alive(p)]
        os.close(out_r)
        await spawner.close()
        return left, program

    left, program = asyncio.run(main())
    assert left == []
    assert not alive(program)
