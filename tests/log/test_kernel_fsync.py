"""The group commit's fsyncs run by the kernel (sessiond.log.store.kernelfsync).

A log with the plain ``os.fsync`` hands its fsync to the kernel (Linux AIO) and
is told on an eventfd the loop watches. An append is acknowledged only once the
loop has read the kernel's word that its fsync is done; a failure the kernel
reports fails the log as a failed ``os.fsync`` does; four logs' fsyncs are in
flight at once; and where the kernel refuses (another process, a bad fd), the
fsync runs in a thread as before.
"""

from __future__ import annotations

import asyncio
import errno
import multiprocessing
import os
from pathlib import Path

import pytest

from sessiond.errors import LogFailed
from sessiond.log.event_data import MessageReceived
from sessiond.log.store import kernelfsync
from sessiond.log.store.files import FileStore
from sessiond.log.store.kernelfsync import KernelFsync, for_loop
from tests.helpers import arun

pytestmark = pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "aarch64"), reason="Linux AIO numbers known here only"
)


def _event(i: int) -> MessageReceived:
    return MessageReceived(sender="w", text=str(i))


class Held:
    """The loop's reads of the eventfd, held back: the kernel finishes the fsync
    and signals, and the loop does not hear it until the test lets it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reap = KernelFsync._reap
        self.signalled: list[KernelFsync] = []
        monkeypatch.setattr(KernelFsync, "_reap", self.signalled.append)

    async def wait_signalled(self) -> KernelFsync:
        while not self.signalled:  # the kernel's signal, on the loop's next polls
            await asyncio.sleep(0)
        return self.signalled[0]

    def let_through(self) -> None:
        ring = self.signalled.pop()
        self.signalled.clear()
        self.reap(ring)


def test_the_kernel_runs_the_fsync_of_an_append(state_dir: Path) -> None:
    async def go() -> None:
        log = await FileStore(state_dir).create("s")
        records = await asyncio.gather(*(log.append(_event(i)) for i in range(3)))
        ring = for_loop(asyncio.get_running_loop())
        assert ring is not None
        assert ring.completed >= 1  # one fsync (or two) for the three, by the kernel
        assert [r["seq"] for r in records] == [1, 2, 3]
        assert log._synced == os.path.getsize(log.path)  # durable to its end
        await log.close()

    arun(go())


def test_an_append_is_answered_only_after_the_kernel_said_its_fsync_is_done(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = Held(monkeypatch)

    async def go() -> None:
        log = await FileStore(state_dir).create("s")
        append = asyncio.ensure_future(log.append(_event(1)))
        ring = await held.wait_signalled()  # the fsync is done in the kernel ...
        for _ in range(3):
            await asyncio.sleep(0)
        assert not append.done()  # ... but the loop has not read it: no answer yet
        assert len(ring._jobs) == 1
        held.let_through()
        record = await append
        assert record["seq"] == 1
        assert ring.completed == 1
        assert not ring._jobs
        await log.close()

    arun(go())


def test_a_failure_the_kernel_reports_fails_the_log(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = Held(monkeypatch)

    async def go() -> None:
        log = await FileStore(state_dir).create("s")
        append = asyncio.ensure_future(log.append(_event(1)))
        ring = await held.wait_signalled()
        (key,) = ring._jobs
        ring.finish(key, -errno.EIO)  # what io_getevents gives for a failed fsync
        with pytest.raises(LogFailed, match=r"fsync failed.*Input/output error"):
            await append
        with pytest.raises(LogFailed, match="takes no appends"):
            await log.append(_event(2))  # fsyncgate: no append after a failed fsync
        held.let_through()  # (the real completion: nobody waits for it any more)
        await log.close()

    arun(go())


def test_four_logs_fsyncs_are_in_flight_at_once(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = Held(monkeypatch)

    async def go() -> None:
        store = FileStore(state_dir)
        logs = [await store.create(f"s{i}") for i in range(4)]
        ring = for_loop(asyncio.get_running_loop())
        assert ring is not None
        appends = [asyncio.ensure_future(log.append(_event(1))) for log in logs]
        while len(ring._jobs) < 4:  # each submitted without waiting for another's
            await asyncio.sleep(0)
        assert sorted(fd for fd in (job[0].aio_fildes for job in ring._jobs.values())) == sorted(
            log._fd for log in logs
        )
        while ring._jobs:
            await held.wait_signalled()
            held.let_through()
        assert [r["seq"] for r in await asyncio.gather(*appends)] == [1, 1, 1, 1]
        for log in logs:
            await log.close()

    arun(go())


def test_a_refused_submission_runs_the_fsync_in_a_thread(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        ring = for_loop(asyncio.get_running_loop())
        assert ring is not None
        assert not ring.submit(-1, lambda outcome: None)  # EBADF: refused, nothing held
        assert not ring._jobs
        monkeypatch.setattr(KernelFsync, "submit", lambda *_: False)
        log = await FileStore(state_dir).create("s")
        record = await log.append(_event(1))  # committed by a thread instead
        assert record["seq"] == 1
        assert ring.completed == 0
        assert log._synced == os.path.getsize(log.path)
        await log.close()

    arun(go())


def _submit_in_child(ring: KernelFsync, fd: int, out: multiprocessing.Queue[bool]) -> None:
    out.put(ring.submit(fd, lambda outcome: None))


def test_a_forked_child_does_not_use_its_parents_context(state_dir: Path) -> None:
    async def go() -> None:
        ring = for_loop(asyncio.get_running_loop())
        assert ring is not None
        fd = os.open(state_dir / "f", os.O_WRONLY | os.O_CREAT, 0o600)
        ctx = multiprocessing.get_context("fork")
        out: multiprocessing.Queue[bool] = ctx.Queue()
        child = ctx.Process(target=_submit_in_child, args=(ring, fd, out))
        child.start()
        submitted = out.get(timeout=60)
        child.join()
        os.close(fd)
        assert submitted is False
        assert child.exitcode == 0

    state_dir.mkdir(parents=True, exist_ok=True)
    arun(go())


def test_threads_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIOND_FSYNC_THREADS", "1")

    async def go() -> None:
        assert for_loop(asyncio.get_running_loop()) is None

    arun(go())
    assert kernelfsync.MAX_INFLIGHT >= 4
