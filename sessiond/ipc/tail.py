"""``log S --follow`` on a cluster node: the events read from the store by seq,
whichever node runs S (docs/design.md section 10, "any node's socket serves the whole
cluster").

The events table is the truth, so a follower reads it, a batch at a time, from
the seq after the last one it dealt with: it gets every committed event once,
in order, and a take-over changes nothing for it (the new owner appends the
next seqs to the same table). What wakes it is a hint, never the data: this
node's own appends (the table's listeners) and, for a session another node
runs, that node's NOTIFY (``Hints``: sessiond.cluster.follows); a lost hint costs
at most one poll (``POLL``), the backstop.

Unlike the owner's in-memory follow (sessiond.ipc.follow) it never falls
behind: it reads at the pace its client takes the frames. It ends when the
client goes away, seen at once (end of file on the connection), not only at the
next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from sessiond.errors import SessiondError
from sessiond.ipc.frames import Frames
from sessiond.ipc.params import LogParams
from sessiond.log.store.base import Record
from sessiond.syscalls.kernel import Kernel
from sessiond.wire import encode

log = structlog.get_logger(__name__)

POLL = 1.0  # seconds: the most a lost hint delays an event
OUTAGE = 60.0  # seconds of failed reads (the database away) a follow waits out
BATCH = 1000  # events read in one go


class Hints(Protocol):
    """Tells a follower that a session another node runs may have new events."""

    def watch(self, session: str, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` (in the loop) on each hint for ``session``; returns the unwatch."""
        ...


class Tail:
    """Follows one session's log from the store (set on a cluster node's LogStream)."""

    def __init__(self, kernel: Kernel, hints: Hints, poll: float = POLL) -> None:
        self.kernel = kernel
        self.hints = hints
        self.poll = poll

    async def serve(
        self, request_id: Any, p: LogParams, writer: asyncio.StreamWriter, frames: Frames | None
    ) -> None:
        assert p.name is not None
        name = p.name
        query = self.kernel.inspection.query(p.since, p.types, p.grep)
        woke = asyncio.Event()
        # Listen before the first read: a commit in between only wakes it once more.
        unlisten = self.kernel.table.listen(lambda who, _r: woke.set() if who == name else None)
        unwatch = self.hints.watch(name, woke.set)
        gone = asyncio.ensure_future(_until_eof(frames)) if frames is not None else None
        why = "the client went away"
        try:
            after = max(query.first_seq - 1, (p.after or {}).get(name, 0))
            if p.limit:  # the last N of what the log holds now, then everything new
                kept: deque[Record] = deque(maxlen=p.limit)
                while batch := await self._read(name, after + 1):
                    kept.extend(r for r in batch if query.match(r))
                    after = batch[-1]["seq"]
                for record in kept:
                    await _send(writer, request_id, record)
            while True:
                woke.clear()  # before the read: a hint from now on is not lost
                batch = await self._read(name, after + 1)
                for record in batch:
                    if query.match(record):
                        await _send(writer, request_id, record)
                    after = record["seq"]
                if batch:
                    continue
                if await self._idle(woke, gone):
                    break
        except (ConnectionError, asyncio.CancelledError):
            why = "the connection closed"
            raise
        except Exception as exc:
            why = f"an error: {exc}"
            raise
        finally:
            unlisten()
            unwatch()
            if gone is not None:
                gone.cancel()
            log.info("follow.ended", session=name, reason=why)

    async def _idle(self, woke: asyncio.Event, gone: asyncio.Future[None] | None) -> bool:
        """Wait for a hint, the poll or the client's going; True once it has gone."""
        hinted = asyncio.ensure_future(woke.wait())
        waits: set[asyncio.Future[Any]] = {hinted} if gone is None else {hinted, gone}
        try:
            await asyncio.wait(waits, timeout=self.poll, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hinted.cancel()
        return gone is not None and gone.done()

    async def _read(self, name: str, since: int) -> list[Record]:
        """Up to BATCH events from seq ``since`` (NoSuchSession once it is gone).

        The database away for a moment (a restart, a failover of its own) is
        waited out, for up to ``OUTAGE``: the follow resumes where it was. A
        SessiondError (no such session, a corrupt line) ends it with that error."""
        store = self.kernel.store

        def batch() -> list[Record]:
            events = store.read(name, since=since)
            try:
                return list(itertools.islice(events, BATCH))
            finally:
                getattr(events, "close", lambda: None)()

        failing_since: float | None = None
        while True:
            try:
                return await asyncio.to_thread(batch)
            except SessiondError:
                raise
            except Exception as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > OUTAGE:
                    raise
                log.warning("follow.read_failed", session=name, error=repr(exc))
                await asyncio.sleep(self.poll)


async def _until_eof(frames: Frames) -> None:
    """Returns when the client closes its end (what it sends meanwhile is dropped:
    a following connection takes no other request)."""
    with contextlib.suppress(ConnectionError):
        while await frames.next() is not None:
            pass


async def _send(writer: asyncio.StreamWriter, request_id: Any, record: Record) -> None:
    # one frame, then wait while the socket is full: a slow reader slows only the reads
    writer.write(encode({"id": request_id, "stream": record}))
    await writer.drain()
