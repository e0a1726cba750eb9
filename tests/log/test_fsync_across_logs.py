"""Group commit is per log; logs do not wait for each other: the fsyncs of four
sessions' logs run at the same time, each in a thread of its own (one fsync per
log at a time, many logs at once), so four clients each sending to a session of
its own are not queued behind one thread."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from sessiond.log.event_data import MessageReceived
from sessiond.log.store.files import FileStore, IOHooks
from tests.helpers import arun

LOGS = 4


def test_the_fsyncs_of_four_logs_run_at_once(state_dir: Path) -> None:
    """Each fsync waits until all four are in flight: were they run one after
    another (one thread, or one log behind another), the first would wait for
    the others forever, and the barrier would break (its timeout bounds only a
    failure)."""
    armed = threading.Event()
    together = threading.Barrier(LOGS, timeout=120)
    inside: list[int] = []

    def fsync(fd: int) -> None:
        if armed.is_set():
            inside.append(fd)
            together.wait()
        os.fsync(fd)

    store = FileStore(state_dir, hooks=IOHooks(fsync=fsync))

    async def go() -> None:
        logs = [await store.create(f"s{i}") for i in range(LOGS)]
        armed.set()
        records = await asyncio.gather(
            *(log.append(MessageReceived(sender="x", text="hi")) for log in logs)
        )
        armed.clear()
        assert [r["type"] for r in records] == ["message.received"] * LOGS
        for log in logs:
            await log.close()

    arun(go())
    assert len(set(inside)) == LOGS  # one fsync a log, all four at once
