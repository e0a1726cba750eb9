"""A write nobody waits for (a step's end: docs/design.md section 8, "One commit per
step") is made durable by the next durable write, or by the journal's own flush
within its bound; either way it is told to the log's followers only once durable."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sessiond.log.event_data import LifecycleChanged, MessageReceived
from sessiond.log.journal import Journal
from sessiond.log.store.base import Draft, Record
from sessiond.log.store.files import FileStore, IOHooks
from tests.helpers import arun


def test_a_write_not_waited_for_is_flushed_within_its_bound_then_published(
    tmp_path: Path,
) -> None:
    synced: list[int] = []
    store = FileStore(tmp_path, hooks=IOHooks(synced=lambda _s, offset: synced.append(offset)))

    async def go() -> None:
        await (await store.create("s")).close()
        journal = await Journal.open(store, "s")
        told: list[Record] = []
        published = asyncio.Event()

        def listener(record: Record) -> None:
            told.append(record)
            published.set()

        journal.listeners.append(listener)
        [end] = await journal.append_many([Draft(MessageReceived(sender="x", text="done"))],
                                          durable=False)  # fmt: skip
        assert told == []  # written and folded, not durable: told to nobody yet
        assert journal.state.seq == end["seq"]
        assert max(synced, default=0) < journal.log.position.offset
        journal.flush_within(0.001)
        await asyncio.wait_for(published.wait(), 60)  # (a bound for a hang only)
        assert [r["seq"] for r in told] == [end["seq"]]
        assert max(synced) == journal.log.position.offset
        await journal.close()

    arun(go())


def test_the_next_durable_write_covers_a_write_not_waited_for_with_one_fsync(
    tmp_path: Path,
) -> None:
    fsyncs: list[int] = []

    def counting(fd: int) -> None:
        fsyncs.append(fd)
        os.fsync(fd)

    store = FileStore(tmp_path, hooks=IOHooks(fsync=counting))

    async def go() -> None:
        await (await store.create("s")).close()
        journal = await Journal.open(store, "s")
        before = len(fsyncs)
        await journal.append_many([Draft(MessageReceived(sender="x", text="end"))], durable=False)
        journal.flush_within(3600)  # far off: the next start comes first
        await journal.append(LifecycleChanged(to="ready"))  # the next step's start
        assert len(fsyncs) - before == 1  # one commit for both
        await journal.close()  # the flush armed is dropped with the journal

    arun(go())
