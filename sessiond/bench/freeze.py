"""How long does a frozen cluster node's program act after its node is resumed?

``python -m sessiond.bench.freeze [--rounds 5] [--baseline SRC]``

A node's whole process tree (here: a spawner, its holder and a program) is
stopped with SIGSTOP past the node's lease deadline (the ``fence`` a renewal
gives the spawner), then SIGCONTed, the program first: the worst order a thaw
may take (a VM or cgroup thaw resumes everything at once, in no order). The
program writes the machine's monotonic time every millisecond. Measured, per
round: ``freeze_acted_ms``, how long after the resume its last line was written
(0: nothing was written after it), and ``freeze_lines_after``, how many lines
were. With ``--baseline SRC`` (``git archive COMMIT | tar -x -C SRC``), the
baseline's spawner (``SRC/sessiond/runs/spawner.py``) is measured too, round
by round alternately. ``fenced_start_ms`` / ``plain_start_ms``: a ``true``
program's spawn to exit, with and without a deadline (a fenced program is forked
by its holder to get its parent-death signal; an unfenced one is posix_spawned).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sessiond.runs import spawner_client
from sessiond.runs.spawner_client import SpawnerClient

WRITER = """import sys, time
with open(sys.argv[1], "a", buffering=1) as f:
    while True:
        f.write(f"{time.monotonic()!r}\\n")
        time.sleep(0.001)
"""


def _tree(root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(p) for p in f.read().split()]
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _lines(path: Path) -> list[float]:
    return [float(x) for x in path.read_text().split()] if path.exists() else []


async def _freeze_once(spawner_py: Path, folder: Path) -> tuple[float, int]:
    spawner_client.SPAWNER = spawner_py  # this tree's spawner, or a baseline's
    ledger = folder / f"ledger-{time.monotonic_ns()}"
    spawner = SpawnerClient()
    spawner.start()
    assert spawner.pid is not None
    spawner.fence(time.monotonic() + 1.0)  # the node's deadline, never renewed
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        held = await spawner.spawn(
            [sys.executable, "-c", WRITER, str(ledger)],
            cwd=str(folder),
            env={"PATH": os.environ.get("PATH", os.defpath)},
            stdout=null,
            stderr=null,
        )
    finally:
        os.close(null)
    spawner.go(held)
    while len(_lines(ledger)) < 3:
        await asyncio.sleep(0.01)
    pids = _tree(spawner.pid)
    _signal(pids, signal.SIGSTOP)
    await asyncio.sleep(2.0)  # the whole node paused well past its deadline
    resumed = time.monotonic()
    _signal(list(reversed(pids)), signal.SIGCONT)  # leaves first
    while spawner.proc is not None and spawner.proc.poll() is None:
        await asyncio.sleep(0.01)
    await spawner.close()
    after = [t for t in _lines(ledger) if t >= resumed]
    return (max(after) - resumed) * 1000 if after else 0.0, len(after)


async def _start_ms(folder: Path, fenced: bool, count: int) -> float:
    spawner_client.SPAWNER = Path(spawner_client.__file__).with_name("spawner.py")
    spawner = SpawnerClient()
    spawner.start()
    if fenced:
        spawner.fence(time.monotonic() + 3600)
    took = []
    null = os.open(os.devnull, os.O_WRONLY)
    for _ in range(count):
        started = time.perf_counter()
        held = await spawner.spawn(
            ["true"], cwd=str(folder), env={"PATH": os.defpath}, stdout=null, stderr=null
        )
        spawner.go(held)
        await held.exited
        took.append((time.perf_counter() - started) * 1000)
    os.close(null)
    await spawner.close()
    return statistics.median(took)


async def measure(rounds: int, baseline: Path | None) -> dict[str, float]:
    here = Path(spawner_client.__file__).with_name("spawner.py")
    kinds = {"": here} | ({"baseline_": baseline / "sessiond/runs/spawner.py"} if baseline else {})
    acted: dict[str, list[float]] = {k: [] for k in kinds}
    lines: dict[str, list[int]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for kind, path in kinds.items():  # alternately, side by side
                ms, n = await _freeze_once(path, Path(tmp))
                acted[kind].append(ms)
                lines[kind].append(n)
        out: dict[str, float] = {}
        for kind in kinds:
            out[f"{kind}freeze_acted_ms_max"] = max(acted[kind])
            out[f"{kind}freeze_acted_ms_median"] = statistics.median(acted[kind])
            out[f"{kind}freeze_lines_after_max"] = max(lines[kind])
        out["fenced_start_ms"] = await _start_ms(Path(tmp), True, rounds * 10)
        out["plain_start_ms"] = await _start_ms(Path(tmp), False, rounds * 10)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessiond.bench.freeze", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.rounds, args.baseline))
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    for name, value in figures.items():
        print(f"{name:<36} {value:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
