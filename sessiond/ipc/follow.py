"""The ``log`` method: a session's events at once, or ``log --follow`` as a stream.

It is apart from the dispatch because it is the one method that is not one
request, one answer: following holds the connection open, listens to the table
for new events and writes ``{"id": ..., "stream": record}`` frames until the
client goes away.

A follower gets every event, in order, or is told exactly where it stopped: the
events appended while it is busy wait in a buffer of ``follow_buffer`` entries;
when a reader is so slow that the buffer is full, the buffer is dropped and the
stream ends with one final ``fell_behind`` error whose ``last_seq`` names, per
session, the seq up to which every event was dealt with. The client reads the
rest from the log and follows again (``after``; sessiond.logquery.follow does).
So the appender never waits for a reader, and a reader costs the daemon at most
its buffer plus what the socket holds.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from typing import Any

import structlog

from sessiond.errors import FellBehind, InvalidInput
from sessiond.ipc.frames import Frames, error, reply, reply_encoded
from sessiond.ipc.params import LogParams
from sessiond.ipc.tail import Hints, Tail
from sessiond.log.events import EVENT_TYPES
from sessiond.log.store.base import Record
from sessiond.syscalls.kernel import Kernel
from sessiond.wire import encode

log = structlog.get_logger(__name__)


class Buffer:
    """What the table has appended and a follower has not taken yet, bounded.

    Fed from the table's listener, so it never blocks nor awaits. Once it would go
    past ``bound`` it holds nothing more: it remembers, per session, the first seq
    it did not keep (``missed``), which is all the error needs.
    """

    def __init__(self, bound: int, name: str | None) -> None:
        self.bound = bound
        self.name = name  # None: every session
        self.pending: deque[tuple[str, Record]] = deque()
        self.missed: dict[str, int] | None = None
        self.ready = asyncio.Event()

    def push(self, name: str, record: Record) -> None:
        if self.name is not None and name != self.name:
            return
        if self.missed is None and len(self.pending) < self.bound:
            self.pending.append((name, record))
        else:
            if self.missed is None:  # behind from now on: drop what is held
                self.missed = {}
                for held_name, held in self.pending:
                    self.missed.setdefault(held_name, held["seq"])
                self.pending.clear()
            self.missed.setdefault(name, record["seq"])
        self.ready.set()

    async def next(self) -> tuple[str, Record] | None:
        """The next event, or None once the follower has fallen behind."""
        while not self.pending and self.missed is None:
            self.ready.clear()
            await self.ready.wait()
        return None if self.missed is not None else self.pending.popleft()


class LogStream:
    """Answers ``log`` requests from the kernel's logs and the table's listeners."""

    def __init__(self, kernel: Kernel, hints: Hints | None = None) -> None:
        self.kernel = kernel
        # a cluster node's (its hints given): one session is followed from the
        # database, wherever it runs, and across a take-over (sessiond.ipc.tail)
        self.tail = Tail(kernel, hints) if hints is not None else None

    async def serve(
        self,
        request_id: Any,
        p: LogParams,
        writer: asyncio.StreamWriter,
        frames: Frames | None = None,
    ) -> None:
        unknown = set(p.types) - set(EVENT_TYPES)
        if unknown:
            raise InvalidInput(f"unknown event type(s) {', '.join(sorted(unknown))}")
        if p.name is None and not p.follow:
            raise InvalidInput("name a session, or follow every session with --all --follow")
        if p.until is not None and p.follow:
            raise InvalidInput("until (the end of a window) goes without follow")
        if p.first and (p.follow or p.limit):
            raise InvalidInput("first (a page from since) goes with neither follow nor limit")
        if not p.follow:
            assert p.name is not None
            after = (p.after or {}).get(p.name, 0)
            lines = await self.kernel.inspection.log_encoded(
                p.name,
                p.since,
                p.types,
                p.limit,
                grep=p.grep,
                after=after,
                first=p.first,
                until=p.until,
            )
            await reply_encoded(writer, request_id, lines)
            return
        if self.tail is not None and p.name is not None:
            await self.tail.serve(request_id, p, writer, frames)
            return
        await self._follow(request_id, p, writer)

    async def _follow(self, request_id: Any, p: LogParams, writer: asyncio.StreamWriter) -> None:
        query = self.kernel.inspection.query(p.since, p.types, p.grep)
        if p.name is not None:
            self.kernel.table.get(p.name)  # an unknown session fails before anything is sent
        else:  # every session's: the ones not opened yet too
            await self.kernel.table.ensure_all()
        buffer = Buffer(self.kernel.config.follow_buffer, p.name)
        # Per session, the seq up to which every event was sent or did not match.
        dealt: dict[str, int] = {}
        # Listen first, then read the log: an event appended in between is buffered,
        # and `sent` (the last seq the backlog sent) drops those the log already held.
        unsubscribe = self.kernel.table.listen(buffer.push)
        try:
            # What each session holds now was the log's, not this stream's, to send.
            # (An append still waiting for its fsync at this instant is counted in;
            # it reaches the buffer once durable, and only if the stream had ended
            # before that would `last_seq` overstate it: a window of one fsync.)
            for s in self.kernel.table:
                if s.journal_or_none is not None and (p.name is None or s.name == p.name):
                    dealt[s.name] = s.journal.state.seq
            sent: dict[str, int] = {}
            for name, record in await self._backlog(p):
                sent[name] = record["seq"]
                await self._send(writer, request_id, record)
            while (item := await buffer.next()) is not None:
                name, record = item
                if record["seq"] <= sent.get(name, 0):
                    continue  # already sent from the log
                dealt[name] = record["seq"]
                if record["seq"] > (p.after or {}).get(name, 0) and query.match(record):
                    await self._send(writer, request_id, record)
            assert buffer.missed is not None
            last = {**dealt, **{n: seq - 1 for n, seq in buffer.missed.items()}}
            last = {n: max(seq, sent.get(n, 0)) for n, seq in last.items()}
        finally:
            unsubscribe()
        behind = FellBehind(
            f"this reader fell more than {buffer.bound} events behind, so the daemon "
            "ended the stream; every event up to "
            + ", ".join(f"{n} seq {seq}" for n, seq in sorted(last.items()))
            + " was sent; read the rest with 'log' (after those seqs) and follow again "
            "(sessionctl log -f does this by itself)",
            last,
        )
        log.warning("follow.fell_behind", bound=buffer.bound, last_seq=last)
        frame = error(request_id, behind.code, str(behind), behind.exit_code)
        frame["error"]["last_seq"] = behind.last_seq
        await reply(writer, frame)

    async def _backlog(self, p: LogParams) -> list[tuple[str, Record]]:
        """What the log already holds that the follow asked for, before the new events.

        One session: from ``since`` (the last ``limit``). Every session: nothing
        (only new events), unless ``since`` is a time, ``limit`` is set or the follow
        resumes (``after``); then each session's, merged in time order.
        """
        after = p.after or {}
        if p.name is not None:
            records = await self.kernel.log_(
                p.name, p.since, p.types, p.limit, grep=p.grep, after=after.get(p.name, 0)
            )
            return [(p.name, r) for r in records]
        if p.after is None and not p.limit and not isinstance(p.since, str):
            return []
        each = []
        for s in sorted(self.kernel.table, key=lambda s: s.name):
            if s.journal_or_none is None:
                continue  # a broken log; `show` says why
            records = await self.kernel.log_(
                s.name, p.since, p.types, 0, grep=p.grep, after=after.get(s.name, 0)
            )
            each.append([(r["ts"], s.name, r) for r in records])
        merged = [(name, r) for _, name, r in heapq.merge(*each, key=lambda t: t[0])]
        return merged[-p.limit :] if p.limit else merged

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, request_id: Any, record: Record) -> None:
        # One frame, then wait while the socket is full: the socket's buffer is the
        # only place a slow reader's frames pile up, and it is bounded.
        writer.write(encode({"id": request_id, "stream": record}))
        await writer.drain()
