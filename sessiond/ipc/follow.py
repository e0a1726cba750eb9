"""The ``log`` method: a session's events at once, or ``log --follow`` as a stream.

It is apart from the dispatch because it is the one method that is not one
request, one answer: following holds the connection open, listens to the table
for new events and writes ``{"id": ..., "stream": record}`` frames until the
client goes away (it never sends a final answer; the client closes).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from sessiond.errors import InvalidInput
from sessiond.ipc.frames import reply
from sessiond.ipc.params import LogParams
from sessiond.log.events import EVENT_TYPES
from sessiond.syscalls.kernel import Kernel
from sessiond.wire import encode


class LogStream:
    """Answers ``log`` requests from the kernel's logs and the table's listeners."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    async def serve(self, request_id: Any, p: LogParams, writer: asyncio.StreamWriter) -> None:
        unknown = set(p.types) - set(EVENT_TYPES)
        if unknown:
            raise InvalidInput(f"unknown event type(s) {', '.join(sorted(unknown))}")
        if p.name is None and not p.follow:
            raise InvalidInput("name a session, or follow every session with --all --follow")
        if not p.follow:
            assert p.name is not None
            records = await self.kernel.log_(p.name, p.since, p.types, p.limit)
            await reply(writer, {"id": request_id, "ok": True, "result": records})
            return
        await self._follow(request_id, p, writer)

    async def _follow(self, request_id: Any, p: LogParams, writer: asyncio.StreamWriter) -> None:
        # Bounded: a follower that cannot keep up misses events; the daemon's memory
        # does not grow for it.
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=10_000)
        wanted = set(p.types)

        def listener(name: str, record: dict[str, Any]) -> None:
            if (p.name is None or name == p.name) and (not wanted or record["type"] in wanted):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait((name, record))

        last = 0
        if p.name is not None:
            self.kernel.table.get(p.name)  # an unknown session fails before anything is sent
        # Listen first, then read the log: an event appended in between is queued, and
        # the seq check below drops those the log already held.
        unsubscribe = self.kernel.table.listen(listener)
        try:
            if p.name is not None:
                for record in await self.kernel.log_(p.name, p.since, p.types):
                    last = record["seq"]
                    writer.write(encode({"id": request_id, "stream": record}))
                await writer.drain()
            while True:
                _, record = await queue.get()
                if p.name is not None and record["seq"] <= last:
                    continue  # already sent from the log
                writer.write(encode({"id": request_id, "stream": record}))
                await writer.drain()
        finally:
            unsubscribe()
