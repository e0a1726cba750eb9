"""An SDK program that works in steps until asked to stop."""

from __future__ import annotations

import functools
import time
from pathlib import Path

from sessiond.sdk import StopRequested, connect


def work(n: int) -> str:
    Path("started").write_text(str(n))
    time.sleep(0.3)  # a step is never cut in the middle
    return f"step {n} done"


with connect() as run:
    n = 0
    try:
        while True:
            n += 1
            run.step(
                "step", functools.partial(work, n), args={"n": n}, side_effect="none",
                idempotency="safe", resume="replay-from-event",
            )  # fmt: skip
    except StopRequested:
        Path("stopped").write_text(str(n))
