"""The group commit's fsyncs run by the kernel (sessiond.log.store.kernelfsync).

A log with the plain ``os.fsync`` hands its fsync to the kernel (io_uring) and
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
from typing import Any

import pytest

from sessiond.errors import LogFailed
from sessiond.log.event_data import MessageReceived
from sessiond.log.store import kernelfsync
from sessiond.log.store.filelog import FileEventLog
from sessiond.log.store.files import FileStore, IOHooks
from sessiond.log.store.kernelfsync import KernelFsync, for_loop
from tests.e2e.harness import wait_for
from tests.helpers import arun


def _io_uring_off() -> bool:
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            return f.read().strip() != "0"
    except OSError:
        return False  # (a kernel before the switch: io_uring is on)


pytestmark = [
    pytest.mark.skipif(
        os.uname().machine != "x86_64", reason="the kernel's fsync is used on x86-64 only"
    ),
    pytest.mark.skipif(_io_uring_off(), reason="io_uring is turned off on this machine"),
]


def _event(i: int) -> MessageReceived:
    return MessageReceived(sender="w", text=str(i))


class Held:
    """The loop's reads of the eventfd, held back: the kernel finishes the fsync
    and signals, and the loop does not hear it until the test lets it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reap = KernelFsync._reap
        self.signalled: list[KernelFsync] = []
        # (a function: the class binds it to the ring, as it binds _reap)
        monkeypatch.setattr(KernelFsync, "_reap", lambda ring: self.signalled.append(ring))  # noqa: PLW0108

    async def wait_signalled(self) -> KernelFsync:
        while not self.signalled:  # the kernel's signal, on the loop's next polls
            await asyncio.sleep(0)
        return self.signalled[0]

    async def one_append(
        self, state_dir: Path
    ) -> tuple[FileEventLog, asyncio.Future[Any], KernelFsync]:
        """A new log, one append to it, and the ring once the kernel signalled its fsync."""
        log = await FileStore(state_dir).create("s")
        append = asyncio.ensure_future(log.append(_event(1)))
        return log, append, await self.wait_signalled()

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
        log, append, ring = await held.one_append(state_dir)  # done in the kernel ...
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
        log, append, ring = await held.one_append(state_dir)
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
        assert not held.signalled or len(ring._jobs) == 4  # none settled meanwhile
        while ring._jobs:
            await held.wait_signalled()
            held.let_through()
        assert [r["seq"] for r in await asyncio.gather(*appends)] == [1, 1, 1, 1]
        for log in logs:
            await log.close()

    arun(go())


def test_the_kernels_error_reaches_the_caller() -> None:
    """What the kernel answers for an fsync it could not do is the caller's
    ``OSError``, as ``os.fsync`` would raise it."""
    outcomes: list[BaseException | None] = []

    async def go() -> None:
        ring = for_loop(asyncio.get_running_loop())
        assert ring is not None
        assert ring.submit(-1, outcomes.append)  # a bad fd: the kernel's answer says so
        while not outcomes:
            await asyncio.sleep(0)
        assert not ring._jobs

    arun(go())
    (outcome,) = outcomes
    assert isinstance(outcome, OSError)
    assert outcome.errno == errno.EBADF


def test_a_refused_submission_runs_the_fsync_in_a_thread(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        ring = for_loop(asyncio.get_running_loop())
        assert ring is not None
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


def test_timed_fsyncs_still_run_in_the_kernel(state_dir: Path) -> None:
    """The daemon's metrics time each fsync without taking it back to a thread."""
    seconds: list[float] = []

    async def go() -> None:
        log = await FileStore(state_dir, hooks=IOHooks(fsync_seconds=seconds.append)).create("s")
        await log.append(_event(1))
        await log.append(_event(2))
        ring = for_loop(asyncio.get_running_loop())
        assert ring is not None
        assert ring.completed == 2
        await log.close()

    arun(go())
    assert len(seconds) == 2
    assert all(s > 0 for s in seconds)


def test_a_submit_makes_no_getpid_call(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forked-child check reads a pid kept by an at-fork hook: ``os.getpid()``
    is a system call, and a submit is made once a `send` (the child's refusal:
    test_a_forked_child_does_not_use_its_parents_context)."""
    calls: list[int] = []
    real = os.getpid

    def counted() -> int:
        calls.append(1)
        return real()

    async def go() -> None:
        loop = asyncio.get_running_loop()
        ring = for_loop(loop)
        assert ring is not None
        fd = os.open(state_dir / "f", os.O_WRONLY | os.O_CREAT, 0o600)
        done: asyncio.Future[BaseException | None] = loop.create_future()
        monkeypatch.setattr(os, "getpid", counted)
        assert ring.submit(fd, done.set_result)
        monkeypatch.undo()
        assert await done is None
        os.close(fd)

    state_dir.mkdir(parents=True, exist_ok=True)
    arun(go())
    assert calls == []


def _kept_aside(ring: KernelFsync) -> bool:
    """The kernel holds completions on its overflow list (IORING_SQ_CQ_OVERFLOW)."""
    return bool(kernelfsync._U32.unpack_from(ring._ring, ring._sq_flags)[0] & 2)


async def _overflowed_ring(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[KernelFsync, list[asyncio.Future[BaseException | None]], int]:
    """A ring of 4 completion slots, 6 fsyncs submitted while the loop does not
    read its eventfd: 4 completions in the ring, 2 on the kernel's overflow list."""
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(kernelfsync, "MAX_INFLIGHT", 2)  # 2 submission slots, 4 completion
    ring = KernelFsync(loop)
    monkeypatch.setattr(kernelfsync, "MAX_INFLIGHT", 64)
    loop.remove_reader(ring._efd)
    fd = os.open(state_dir / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    waits: list[asyncio.Future[BaseException | None]] = []
    for _ in range(6):
        os.write(fd, b"x\n")
        waits.append(loop.create_future())
        assert ring.submit(fd, waits[-1].set_result)
    # the kernel's workers finish them: the last two find the ring full
    wait_for(lambda: _kept_aside(ring), what="completions kept aside")
    return ring, waits, fd


def test_completions_the_kernel_kept_aside_are_taken(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Completions beyond the ring's room wait on the kernel's overflow list and
    bring no eventfd signal of their own: the reap that empties the ring moves
    them in and settles them (they stayed in flight for good before)."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        ring, waits, fd = await _overflowed_ring(state_dir, monkeypatch)
        try:
            loop.add_reader(ring._efd, ring._reap)  # the eventfd says: 4 in the ring
            done = await asyncio.wait_for(asyncio.gather(*waits), 30)
            assert done == [None] * 6
            assert ring.overflowed >= 1
            assert not _kept_aside(ring)
        finally:
            os.close(fd)
            ring.close()

    state_dir.mkdir(parents=True, exist_ok=True)
    arun(go())


def test_completions_kept_aside_are_found_without_a_signal(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While fsyncs are in flight the loop looks for completions kept aside on
    its own (``_watched``), should no eventfd signal ever come for them."""

    async def go() -> None:
        ring, waits, fd = await _overflowed_ring(state_dir, monkeypatch)
        try:  # the eventfd is never read: only the watch finds them
            done = await asyncio.wait_for(asyncio.gather(*waits), 30)
            assert done == [None] * 6
            assert ring.completed == 6
        finally:
            os.close(fd)
            ring.close()

    state_dir.mkdir(parents=True, exist_ok=True)
    arun(go())


class _Said:
    """What the kernel fsyncs tell the daemon's log, kept (the warning is said once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lines: list[tuple[str, str, dict[str, object]]] = []
        monkeypatch.setattr(kernelfsync, "log", self, raising=False)

    def warning(self, event: str, **fields: object) -> None:
        self.lines.append(("warning", event, fields))

    def error(self, event: str, **fields: object) -> None:
        self.lines.append(("error", event, fields))


def _posted(ring: KernelFsync) -> bool:
    """A completion is in the ring that the loop has not read."""
    head, tail = (
        kernelfsync._U32.unpack_from(ring._ring, at)[0] for at in (ring._cq_head, ring._cq_tail)
    )
    return bool(head != tail)


async def _unanswered(state_dir: Path, held: Held) -> tuple[FileEventLog, KernelFsync, int]:
    """One append whose fsync the kernel took and whose completion the loop never
    hears (held), with a bound the test makes small: the ring is retired."""
    ring = for_loop(asyncio.get_running_loop())
    assert ring is not None
    ring.stall_seconds = 0.01  # (a parameter: the test waits on conditions below)
    log = await FileStore(state_dir).create("s")
    append = asyncio.ensure_future(log.append(_event(1)))
    while not ring._jobs:  # submitted to the kernel ...
        await asyncio.sleep(0)
    (key,) = ring._jobs
    while not _posted(ring):  # ... which finished it; the loop does not hear it (held)
        await asyncio.sleep(0)
    await asyncio.wait([append], timeout=30)  # (it waited for good before)
    waited_for_good = not append.done()
    if waited_for_good:  # let it end, so that the test fails rather than hangs
        held.let_through()
    record = await append
    assert not waited_for_good
    assert record["seq"] == 1
    assert ring.retired
    assert log._synced == os.path.getsize(log.path)  # the thread's fsync covered it
    assert ring.completed == 0  # not the kernel's word
    assert not ring._jobs
    return log, ring, key


def test_an_fsync_the_kernel_never_answers_is_run_again_in_a_thread(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync the kernel took and never answered: within the bound it is run
    again by a thread (the append is acknowledged on that thread's word), the
    ring takes no more fsyncs (the log's next ones run in threads) and the
    daemon's log says so once."""
    held = Held(monkeypatch)
    said = _Said(monkeypatch)

    async def go() -> None:
        log, ring, _ = await _unanswered(state_dir, held)
        fd = os.open(state_dir / "other", os.O_WRONLY | os.O_CREAT, 0o600)
        assert ring.submit(fd, lambda outcome: None) is False  # retired
        os.close(fd)
        records = await asyncio.gather(*(log.append(_event(i)) for i in range(2, 5)))
        assert [r["seq"] for r in records] == [2, 3, 4]  # committed by threads
        assert log._synced == os.path.getsize(log.path)
        assert ring.completed == 0
        await log.close()

    arun(go())
    ((level, event, fields),) = said.lines
    assert (level, event) == ("warning", "fsync.kernel_unanswered")
    assert fields["unanswered"] == 1
    assert fields["sq_head"] == fields["cq_tail"]  # (here the kernel did post it: held)


def test_the_late_answer_of_an_fsync_run_again_is_ignored(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's completion of an fsync already settled by its thread, when it
    comes at last, settles nothing again and leaves the log as it was; a late
    failure is said loudly (its appends were answered on the thread's word)."""
    held = Held(monkeypatch)
    said = _Said(monkeypatch)

    async def go() -> None:
        log, ring, key = await _unanswered(state_dir, held)
        held.let_through()  # the kernel's completion, read at last
        assert ring.completed == 0
        assert log._failed is None
        record = await log.append(_event(2))
        assert record["seq"] == 2
        ring.finish(key, -errno.EIO)  # had it said EIO: nothing to settle, said
        assert log._failed is None
        await log.close()

    arun(go())
    assert [(level, event) for level, event, _ in said.lines] == [
        ("warning", "fsync.kernel_unanswered"),
        ("error", "fsync.kernel_late_failure"),
    ]
