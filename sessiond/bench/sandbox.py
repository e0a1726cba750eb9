"""The sandbox's cost (``--sandbox-only``): a wake to its program's first
instruction with runs confined and without (sessiond.bench.daemon), beside the
floor: starting ``true`` bare, and inside bubblewrap alone with the mounts a run
gets (the private /tmp, a fresh /dev and /proc, its own pid namespace), as the
spawner's holder starts it (``posix_spawn`` and wait)."""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from sessiond.bench import daemon


def _spawn_ms(argv: list[str], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, dict(os.environ))
        os.waitpid(pid, 0)
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 3)


def floor(quick: bool) -> dict[str, float]:
    """``true`` bare and under bubblewrap alone (ms, median)."""
    n = 50 if quick else 300
    true = shutil.which("true") or "/bin/true"
    result = {"spawn_true_p50_ms": _spawn_ms([true], n)}
    bwrap = shutil.which("bwrap")
    if bwrap is not None:
        box = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
        box += ["--new-session", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        box += ["--perms", "1777", "--tmpfs", "/tmp", "--", true]
        result["spawn_bwrap_true_p50_ms"] = _spawn_ms(box, n)
    return result


def measure(work: Path, quick: bool, say: Callable[[str], None]) -> dict[str, float]:
    say("measuring spawn_true_p50_ms, spawn_bwrap_true_p50_ms ...")
    results = floor(quick)
    say("measuring wake_to_exec_p50_ms with the sandbox and without ...")
    n = 20 if quick else 100
    confined, _ = daemon._wake(work / "wake", n)
    unconfined, _ = daemon._wake(work / "wake-off", n, config='[run]\nsandbox = "off"\n')
    results["wake_to_exec_p50_ms"] = confined
    results["wake_to_exec_unconfined_p50_ms"] = unconfined
    results["sandbox_wake_overhead_ms"] = round(confined - unconfined, 2)
    return results
