"""How long does the daemon's loop go without serving anyone, while it works?

The ping figures (sessiond.bench.loop) are wall-clock: on a shared machine they
follow the load more than the code (an idle ping's p99 was 16 ms at a load of 12
on two cores). This measures what the code holds: the daemon's own parts, in one
process, work through a 100,000-event session (``replay`` of the messages view,
``fork``) while a task of the same loop notes the gap between its turns, in CPU
time of the loop's thread — time the OS gave to other processes is not counted.
``loop_<op>_hold_max_ms`` is the worst gap: the longest the loop was held.

Each measure runs in a child process (``PYTHONPATH`` = a baseline's tree, for
``--baseline``), on the daemon's loop (uvloop).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

# The child: load the state dir, then time the loop's gaps during one syscall.
CHILD = r"""
import asyncio, gc, sys, time
from pathlib import Path
import orjson, uvloop
from sessiond.config import DaemonConfig
from sessiond.daemon.service import Daemon

root, op = Path(sys.argv[1]), sys.argv[2]

async def main():
    d = Daemon(DaemonConfig(state_dir=root / "state", socket=root / "s.sock"), {})
    await d.table.load()
    gc.collect()
    gc.freeze()  # as the daemon does after loading
    gaps, done = [], False

    async def ticker():
        last = time.thread_time()
        while not done:
            await asyncio.sleep(0)
            now = time.thread_time()
            gaps.append((now - last) * 1000)
            last = now

    task = asyncio.ensure_future(ticker())
    # The answer is kept until the gaps are counted: the daemon frees it while it
    # sends it, a batch at a time (ipc.frames), which is not measured here.
    if op == "replay":
        answer = await d.kernel.replay("big", None, "messages")
    else:
        answer = await d.kernel.fork("big", "child")
    done = True
    await task
    del answer
    await d.table.close()
    print(orjson.dumps({"max": max(gaps), "turns": len(gaps)}).decode())

uvloop.run(main())
"""

OPS = ("replay", "fork")


def hold_ms(state_root: Path, op: str, source: Path | None = None) -> dict[str, float]:
    """The worst gap of the loop (ms of its thread's CPU time) during ``op``."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(state_root), op],
        env=env,
        capture_output=True,
        timeout=600,
        check=True,
    )
    figures: dict[str, float] = orjson.loads(done.stdout.splitlines()[-1])  # max, turns
    return figures


def measure(state_root: Path, source: Path | None, repeats: int = 3) -> dict[str, float]:
    """``loop_<op>_hold_max_ms``: the median of ``repeats`` runs' worst gaps."""
    results: dict[str, float] = {}
    for op in OPS:
        worst = []
        for _ in range(repeats):
            child = state_root / "state" / "sessions" / "child"
            if child.exists():
                import shutil

                shutil.rmtree(child)
            for snap in (state_root / "state" / "sessions" / "big" / "snapshots").glob("*"):
                snap.unlink()  # each run folds the whole log, as the first one did
            worst.append(hold_ms(state_root, op, source)["max"])
        results[f"loop_{op}_hold_max_ms"] = round(sorted(worst)[len(worst) // 2], 2)
    return results
