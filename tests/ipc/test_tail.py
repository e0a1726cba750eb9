"""The cluster's `log --follow` (sessiond.ipc.tail), on a scripted store: the
backlog and filters, woken by a hint (not the poll), ended by the client's
going, waiting out a database away for a moment, ended by a session gone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from sessiond.errors import NoSuchSession
from sessiond.ipc.frames import Frames
from sessiond.ipc.params import LogParams
from sessiond.ipc.tail import Tail
from sessiond.logquery import LogQuery

TS = "2026-12-01T09:00:00.000000Z"


def event(seq: int, etype: str = "message.received") -> dict[str, Any]:
    data = {"sender": "x", "text": f"m{seq}"} if etype == "message.received" else {}
    return {"seq": seq, "id": f"e{seq}", "type": etype, "ts": TS, "session": "s", "v": 1,
            "data": data}  # fmt: skip


class Store:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.failures = 0  # the next reads that fail as a database away would
        self.gone = False

    def read(self, name: str, *, since: int = 1, upto: int | None = None) -> Iterator[Any]:
        assert upto is None
        if self.failures:
            self.failures -= 1
            raise OSError("connection refused")
        if self.gone or name != "s":
            raise NoSuchSession(f"no session {name!r}")
        return iter([r for r in self.records if r["seq"] >= since])


class Table:
    def listen(self, _fn: Callable[[str, Any], None]) -> Callable[[], None]:
        return lambda: None


class Inspection:
    def query(self, since: int | str, types: list[str] | None, grep: str | None) -> LogQuery:
        return LogQuery.of(since, list(types or ()), grep, time.time_ns())


class Kernel:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.table = Table()
        self.inspection = Inspection()


class Hints:
    def __init__(self) -> None:
        self.wakes: list[Callable[[], None]] = []

    def watch(self, session: str, wake: Callable[[], None]) -> Callable[[], None]:
        assert session == "s"
        self.wakes.append(wake)
        return lambda: self.wakes.remove(wake)

    def hint(self) -> None:
        for wake in list(self.wakes):
            wake()


class Writer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.wrote = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.sent.append(orjson.loads(data)["stream"])
        self.wrote.set()

    async def drain(self) -> None:
        return None

    async def until(self, count: int) -> None:
        while len(self.sent) < count:
            self.wrote.clear()
            await asyncio.wait_for(self.wrote.wait(), 5)


def serve(
    tail: Tail, p: LogParams, writer: Writer, reader: asyncio.StreamReader
) -> asyncio.Task[None]:
    frames = Frames(reader, 1 << 20)
    return asyncio.ensure_future(tail.serve(1, p, writer, frames))  # type: ignore[arg-type]


def test_backlog_filters_then_a_hint_wakes_it_and_the_clients_going_ends_it() -> None:
    async def main() -> None:
        store, hints, writer = Store(), Hints(), Writer()
        store.records = [event(1, "session.created"), event(2), event(3), event(4, "run.started")]
        tail = Tail(Kernel(store), hints, poll=3600)  # type: ignore[arg-type]
        reader = asyncio.StreamReader()
        p = LogParams(name="s", follow=True, limit=1, types=["message.received"])
        task = serve(tail, p, writer, reader)
        await writer.until(1)
        assert [r["seq"] for r in writer.sent] == [3]  # -n 1 of what matched
        store.records += [event(5, "run.started"), event(6)]
        hints.hint()  # the poll is an hour away: only the hint can wake it
        await writer.until(2)
        assert [r["seq"] for r in writer.sent] == [3, 6]
        reader.feed_eof()  # the client goes
        await asyncio.wait_for(task, 5)
        assert hints.wakes == []

    asyncio.run(main())


def test_a_database_away_for_a_moment_is_waited_out_and_a_session_gone_ends_it() -> None:
    async def main() -> None:
        store, hints, writer = Store(), Hints(), Writer()
        store.records = [event(1), event(2)]
        store.failures = 2
        tail = Tail(Kernel(store), hints, poll=0.01)  # type: ignore[arg-type]
        task = serve(
            tail, LogParams(name="s", follow=True, since=2), writer, asyncio.StreamReader()
        )
        await writer.until(1)
        assert [r["seq"] for r in writer.sent] == [2]
        store.gone = True
        try:
            await asyncio.wait_for(task, 5)
        except NoSuchSession:
            pass
        else:
            raise AssertionError("a follow of a session gone went on")

    asyncio.run(main())
