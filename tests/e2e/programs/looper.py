"""An SDK program that works in tool blocks until asked to stop."""

from __future__ import annotations

import time
from pathlib import Path

from sessiond.sdk import StopRequested, connect

with connect() as run:
    n = 0
    try:
        while True:
            n += 1
            with run.tool("step", {"n": n}, side_effect="none", idempotency="safe") as call:
                Path("started").write_text(str(n))
                time.sleep(0.3)  # a block is never cut in the middle
                call.finish(observation=f"step {n} done")
    except StopRequested:
        Path("stopped").write_text(str(n))
