"""``python -m sessiond.bench``: the performance figures of sessiond.

Targets live here and in ``bench/``, never in timed unit tests. Every figure is
measured in one run on one machine; ratios are taken between figures measured
side by side in that run.
"""

from __future__ import annotations

import asyncio
import os
import platform
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run_async(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run one benchmark coroutine on uvloop, the loop the daemon uses."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro_fn())


def machine() -> dict[str, str | int | None]:
    """What the figures were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
