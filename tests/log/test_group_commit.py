"""Group commit of the files backend: one future a batch, and what each batch covers.

Appends written while an fsync runs wait for the next one; a wait for what the
running fsync covers waits for that one only; a waiter cancelled meanwhile takes
nobody else's commit with it; a failed fsync fails every waiter, none hangs.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

from sessiond.errors import LogFailed
from sessiond.log.event_data import LifecycleChanged, MessageReceived
from sessiond.log.store.base import Draft, Pending
from sessiond.log.store.filelog import FileEventLog
from sessiond.log.store.files import FileStore, IOHooks
from tests.helpers import arun


class Gate:
    """An fsync that waits, one call at a time, until the test lets it through."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls = 0
        self.entered = threading.Semaphore(0)
        self.release = threading.Semaphore(0)

    def fsync(self, fd: int) -> None:
        self.calls += 1
        self.entered.release()
        self.release.acquire(timeout=10)
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    async def wait_entered(self) -> None:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, self.entered.acquire, True, 10)


async def _open(state_dir: Path, gate: Gate) -> FileStore:
    await (await FileStore(state_dir).create("s")).close()
    return FileStore(state_dir, hooks=IOHooks(fsync=gate.fsync))


def _event(i: int) -> MessageReceived:
    return MessageReceived(sender="w", text=str(i))


def test_appends_written_during_an_fsync_share_the_next_one(state_dir: Path) -> None:
    gate = Gate()

    async def go() -> None:
        log = await (await _open(state_dir, gate)).open_log("s")
        list(log.recover())
        first = asyncio.ensure_future(log.append(_event(0)))
        await gate.wait_entered()  # fsync 1 runs, covering event 1 only
        later = [asyncio.ensure_future(log.append(_event(i))) for i in range(1, 6)]
        await asyncio.sleep(0)
        covered = log.sync(Pending([], log.position))  # what is written by now
        gate.release.release()
        assert (await asyncio.wait_for(first, 10))["seq"] == 1
        await gate.wait_entered()  # fsync 2, for the five written meanwhile
        assert not any(f.done() for f in later)
        gate.release.release()
        records = await asyncio.wait_for(asyncio.gather(*later), 10)
        await asyncio.wait_for(covered, 10)
        assert [r["seq"] for r in records] == [2, 3, 4, 5, 6]
        assert gate.calls == 2
        assert log.synced_offset == log.position.offset
        await log.close()

    arun(go())


def test_a_wait_for_what_the_running_fsync_covers_needs_no_later_one(state_dir: Path) -> None:
    gate = Gate()

    async def go() -> None:
        log = await (await _open(state_dir, gate)).open_log("s")
        list(log.recover())
        pending = log.write_many([])  # nothing: a position only
        first = log.write_many([Draft(_event(0))])
        waiting = asyncio.ensure_future(log.sync(first))
        await gate.wait_entered()  # fsync 1 covers event 1
        again = asyncio.ensure_future(log.sync(first))  # covered by the running one
        second = asyncio.ensure_future(log.append(_event(1)))  # needs fsync 2
        await asyncio.sleep(0)
        gate.release.release()
        await asyncio.wait_for(asyncio.gather(waiting, again), 10)
        assert not second.done()  # fsync 2 has not run yet
        await gate.wait_entered()
        gate.release.release()
        assert (await asyncio.wait_for(second, 10))["seq"] == 2
        await log.sync(pending)
        await log.close()

    arun(go())


def test_a_cancelled_waiter_takes_no_other_appends_commit_with_it(state_dir: Path) -> None:
    gate = Gate()

    async def go() -> None:
        log = await (await _open(state_dir, gate)).open_log("s")
        list(log.recover())
        tasks = [asyncio.ensure_future(log.append(_event(i))) for i in range(4)]
        await gate.wait_entered()  # one fsync for all four
        tasks[1].cancel()
        await asyncio.sleep(0)
        gate.release.release()
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert isinstance(done[1], asyncio.CancelledError)
        assert [r["seq"] for i, r in enumerate(done) if i != 1] == [1, 3, 4]  # type: ignore[index]
        # the cancelled append was written and is durable all the same
        assert log.synced_offset == log.position.offset
        assert log.position.seq == 4
        await log.close()

    arun(go())


def test_a_failed_fsync_fails_the_running_batch_and_the_next(state_dir: Path) -> None:
    gate = Gate(fail=True)

    async def go() -> None:
        log = await (await _open(state_dir, gate)).open_log("s")
        list(log.recover())
        first = asyncio.ensure_future(log.append(_event(0)))
        await gate.wait_entered()
        later = asyncio.ensure_future(log.append(_event(1)))  # waits for the next batch
        await asyncio.sleep(0)
        gate.release.release()
        for waiter in (first, later):
            with pytest.raises(LogFailed, match="fsync failed"):
                await asyncio.wait_for(waiter, 10)
        with pytest.raises(LogFailed):
            await log.append(LifecycleChanged(to="ready"))
        await log.close()

    arun(go())


def test_the_group_commit_runs_no_task_of_its_own(state_dir: Path) -> None:
    """The flush is driven by loop callbacks and the fsync thread's wake-up: while
    four appends wait on their fsync, the only tasks are the four writers (each
    task a group commit ran cost the loop its own iterations per commit)."""
    gate = Gate()

    async def go() -> None:
        log = await (await _open(state_dir, gate)).open_log("s")
        list(log.recover())
        tasks = [asyncio.ensure_future(log.append(_event(i))) for i in range(4)]
        await gate.wait_entered()  # one fsync for all four, under way
        assert asyncio.all_tasks() == {asyncio.current_task(), *tasks}
        gate.release.release()
        done = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert [r["seq"] for r in done] == [1, 2, 3, 4]
        assert gate.calls == 1
        assert log.synced_offset == log.position.offset
        await log.close()

    arun(go())


def test_a_log_asks_for_its_loop_once_and_again_in_a_new_one(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In Python 3.11 ``asyncio.get_running_loop()`` is a getpid system call: a log
    asks once, at its first commit, and keeps the loop while it runs; a log used
    in another loop later asks again there."""
    asked: list[int] = []
    real = asyncio.get_running_loop

    def counted() -> asyncio.AbstractEventLoop:
        asked.append(1)
        return real()

    async def first() -> FileEventLog:
        log = await FileStore(state_dir).create("s")
        monkeypatch.setattr(asyncio, "get_running_loop", counted)
        for i in range(3):
            await log.append(_event(i))
        monkeypatch.undo()
        return log

    log = arun(first())
    assert asked == [1]

    async def second() -> None:
        record = await log.append(_event(3))
        assert record["seq"] == 4
        assert log.synced_offset == log.position.offset
        await log.close()

    arun(second())
