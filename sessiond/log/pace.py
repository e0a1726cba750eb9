"""Long work in the event loop, in slices: the loop is given back every half millisecond.

The daemon is one event loop. Work over a whole log (``log``, ``replay``, a fork's
copy, an export, a session's opening) used to run in one piece, and every other
request waited behind it: a ping took a quarter of a second while a 15,000-event
session was forked. Such work now goes through a :class:`Pacer`: between two
items it checks the clock, and once a slice (0.5 ms) is spent it yields to the loop
(``asyncio.sleep(0)``), which serves whatever is ready and comes back.

Why slices in the loop rather than a thread: reading and parsing a log is Python
code, which holds the GIL; a thread doing it would take the GIL from the loop for
the interpreter's switch interval (5 ms) at a time. Threads are used only for
what releases the GIL for long (compression, hashing of large blobs, fsync, big
writes): sessiond.log.bundle, sessiond.log.store.files. And for reads that wait on
another server (a PostgreSQL log, :class:`OffLoop`): a query a lock or a silent
server holds would hold the loop, and a cluster node's lease with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, TypeVar

import orjson

T = TypeVar("T")

# Seconds of work between two yields to the loop. A request waits about two
# slices (a turn to read it, one to answer); under load the daemon gets part of a
# core, so a slice costs more wall time: 0.5 ms met the 10 ms target for log and
# export on the loaded 2-core VM where 1 ms did not (bench/README.md).
SLICE = 0.0005
BATCH = 256  # items a batch (a fold, an encoding) takes at once: well under a slice


class Pacer:
    """Says when a slice is spent; ``tick`` yields to the loop then."""

    __slots__ = ("deadline", "slice")

    def __init__(self, slice_s: float = SLICE) -> None:
        self.slice = slice_s
        self.deadline = time.perf_counter() + slice_s

    def due(self) -> bool:
        return time.perf_counter() >= self.deadline

    async def pause(self) -> None:
        # Twice: a request needs a turn to read its frame and one to answer it.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.deadline = time.perf_counter() + self.slice

    async def tick(self) -> None:
        if time.perf_counter() >= self.deadline:
            await self.pause()


async def collect(items: Iterable[T], pacer: Pacer | None = None) -> list[T]:
    """``list(items)``, yielding to the loop between slices."""
    pacer = pacer or Pacer()
    out: list[T] = []
    append = out.append
    due = pacer.due
    for item in items:
        append(item)
        if due():
            await pacer.pause()
    return out


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cyclic garbage collection while a big structure is built a slice
    at a time: each collection would walk what is built so far (a state folded from
    100,000 events is some 200,000 objects), holding the loop for milliseconds. What
    is built is freed by reference counting, which this leaves alone. Nested or
    overlapping pauses end with the collector enabled if the outermost found it so."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


async def encode_paced(obj: Any, pacer: Pacer | None = None) -> bytes:
    """``orjson.dumps(obj)`` for a dataclass (a session's state), a field at a time and
    a long list or dict a batch at a time, yielding between slices: one dumps of a
    long session's state held the loop for ten milliseconds. The caller checks that
    ``obj`` did not change meanwhile."""
    pacer = pacer or Pacer()
    parts: list[bytes] = []
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if isinstance(value, list) and len(value) > BATCH:
            pieces = []
            for start in range(0, len(value), BATCH):
                pieces.append(orjson.dumps(value[start : start + BATCH])[1:-1])
                await pacer.tick()
            encoded = b"[" + b",".join(pieces) + b"]"
        elif isinstance(value, dict) and len(value) > BATCH:
            pieces, items = [], iter(value.items())
            while chunk := dict(itertools.islice(items, BATCH)):
                pieces.append(orjson.dumps(chunk)[1:-1])
                await pacer.tick()
            encoded = b"{" + b",".join(pieces) + b"}"
        else:
            encoded = orjson.dumps(value)
        parts.append(orjson.dumps(field.name) + b":" + encoded)
        await pacer.tick()
    return b"{" + b",".join(parts) + b"}"


async def release(items: list[T], pacer: Pacer | None = None) -> None:
    """Empty ``items`` a batch at a time, yielding between slices. Dropping a list of
    tens of thousands of dicts at once frees them all in one go, which held the loop
    for several milliseconds (a replay's transcript, a long answer)."""
    pacer = pacer or Pacer()
    while items:
        del items[-BATCH:]
        await pacer.tick()


class OffLoop(Iterator[T]):
    """Items whose next one may wait on another server: a database's query, which a
    lock or a silent server can hold for as long as it likes. :func:`batches` and
    :func:`fetched` take them in a worker thread, a page at a time, so the loop
    (and a cluster node's lease) is never held by such a wait; iterated plainly,
    they are the items."""

    def __init__(self, items: Iterator[T]) -> None:
        self._items = items

    def __iter__(self) -> OffLoop[T]:
        return self

    def __next__(self) -> T:
        return next(self._items)

    def close(self) -> None:
        getattr(self._items, "close", lambda: None)()


PAGE = 1000  # items an OffLoop gives a thread call (a database reader's page)


async def fetched(items: Iterable[T]) -> AsyncIterator[T]:
    """``items`` one by one; an :class:`OffLoop`'s taken a page at a time off the loop."""
    if not isinstance(items, OffLoop):
        for item in items:
            yield item
        return
    async for page in _pages(items):
        for item in page:
            yield item


async def batches(
    items: Iterable[T], size: int = BATCH, pacer: Pacer | None = None
) -> AsyncIterator[list[T]]:
    """``items`` in lists of at most ``size``; the loop gets a turn between slices
    (while the items are made, and after each batch is used). An :class:`OffLoop`'s
    are fetched in a worker thread."""
    pacer = pacer or Pacer()
    if isinstance(items, OffLoop):
        async for item_page in _pages(items):
            for start in range(0, len(item_page), size):
                yield item_page[start : start + size]
                await pacer.tick()
        return
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
            await pacer.tick()
        elif pacer.due():
            await pacer.pause()
    if batch:
        yield batch


async def _pages(items: OffLoop[T]) -> AsyncIterator[list[T]]:
    while page := await asyncio.to_thread(lambda: list(itertools.islice(items, PAGE))):
        yield page
