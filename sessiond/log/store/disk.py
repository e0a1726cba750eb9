"""Threads for work that waits on the disk: the fsyncs of durable writes.

The loop's default executor has as many threads as the machine has cores plus
four (six here), and everything the daemon hands off shares it. A durable write
does not compute: it waits for the disk, and fsyncs of different files that
wait at the same time are made durable by one journal commit of the file
system. So the durable writes of many sessions' steps at once get threads of
their own, enough for each to wait beside the others, instead of queueing six
at a time behind each other and behind the daemon's other work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Threads that mostly sleep in fsync: started on demand, idle ones reused.
DISK_THREADS = 64

_threads: ThreadPoolExecutor | None = None


def disk_threads() -> ThreadPoolExecutor:
    """The daemon's threads for durable writes (started on first use)."""
    global _threads  # noqa: PLW0603 (one pool for the process, made on first use)
    if _threads is None:
        _threads = ThreadPoolExecutor(max_workers=DISK_THREADS, thread_name_prefix="disk")
    return _threads


def _job(fn: Callable[[], T], loop: asyncio.AbstractEventLoop, done: asyncio.Future[T]) -> None:
    try:
        value = fn()
    except BaseException as exc:  # the waiter gets it, whatever it is
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            loop.call_soon_threadsafe(_fail, done, exc)
        return
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_succeed, done, value)


def _succeed(done: asyncio.Future[T], value: T) -> None:
    if not done.done():
        done.set_result(value)


def _fail(done: asyncio.Future[T], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)


async def on_disk(fn: Callable[[], T]) -> T:
    """``fn()`` in a disk thread, with one wake-up of the loop when it is done
    (``asyncio.to_thread`` chains two futures and copies the context)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    disk_threads().submit(_job, fn, loop, done)
    return await done
