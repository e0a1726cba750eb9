"""One session's event log as a file: ``events.jsonl``, one framed event a line.

It is separate from the store (files.py) because it is the one part with a
lifetime and a state: it holds the log's single writer lock, the position of its
last whole line, and the group commit that makes appends durable.

Group commit: appends write their lines at once (in call order, in the event
loop) and then wait for durability. One fsync runs at a time per log, in a
worker thread of the store; every append written before it started is covered
by it, and appends written while it ran share the next one.

In ``os`` mode an append does not wait for the disk, but the log still syncs:
the first write after a sync arms a timer of ``sync_interval`` seconds, and
when it fires one fsync covers everything written until then, so a power cut
loses at most about ``sync_interval`` of events (docs/design.md section 9).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sessiond.codec import Clock, decode_line
from sessiond.errors import LogCorrupt, LogFailed, LogLocked, NoSuchSession, StorageFull
from sessiond.log.event_data import EventData, LogRepaired
from sessiond.log.store.base import (
    START,
    Draft,
    Durability,
    EventLog,
    LogPosition,
    Pending,
    PositionMismatch,
    Record,
    Repair,
)
from sessiond.log.store.durable import planted_error, write_all
from sessiond.log.store.integrity import LogIdentity, check_log, identity_of
from sessiond.log.store.lines import RecordBuilder, ScanEnd, classify_tail, scan

if TYPE_CHECKING:
    from sessiond.log.store.kernelfsync import KernelFsync


@dataclass(frozen=True)
class IOHooks:
    """The system calls the log makes, replaceable by tests (fault injection, counting)."""

    fsync: Callable[[int], None] = os.fsync
    write: Callable[[int, bytes], None] = write_all
    # Told (session, offset) each time a log is durable up to offset, before any
    # append up to there is acknowledged (the power-cut simulation of the tests).
    synced: Callable[[str, int], None] | None = None
    # Told the seconds each group commit's fsync took, from its start to the loop
    # hearing it is done, wherever it ran (the kernel or a thread): the daemon's
    # metrics. (Not a wrapper of ``fsync``: that would keep the fsync in a thread.)
    fsync_seconds: Callable[[float], None] | None = None


def _fsync_job(
    fsync: Callable[[int], None],
    fd: int,
    loop: asyncio.AbstractEventLoop,
    flushed: Callable[[BaseException | None], None],
) -> None:
    """Runs in a worker thread: one fsync, then one wake-up of the loop with its
    outcome, straight into the log's ``_flushed`` (no future, no task between: the
    batch's waiters are woken by that one callback)."""
    outcome: BaseException | None = None
    try:
        fsync(fd)
    except BaseException as exc:  # the waiters get it, whatever it is
        outcome = exc
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
        loop.call_soon_threadsafe(flushed, outcome)


def _timed(
    flushed: Callable[[BaseException | None], None], observe: Callable[[float], None]
) -> Callable[[BaseException | None], None]:
    started = time.perf_counter()

    def done(outcome: BaseException | None) -> None:
        observe(time.perf_counter() - started)
        flushed(outcome)

    return done


def _kernel_fsync(loop: asyncio.AbstractEventLoop) -> KernelFsync | None:
    # imported at the first fsync, not with the log: ctypes is not needed to serve
    # the first requests (the start-up path's imports are counted)
    from sessiond.log.store.kernelfsync import for_loop

    return for_loop(loop)


READ_STEP = 256 << 10  # bytes a read of recover() takes at most


@dataclass
class FileEventLog(EventLog):
    """The open log of one session: recovery of what is on disk (a torn tail cut
    and recorded), appends of whole lines, and their group commit. One writer per
    log, held by an exclusive flock for as long as it is open."""

    path: Path
    session: str
    durability: Durability
    clock: Clock
    hooks: IOHooks = field(default_factory=IOHooks)
    sync_on_recover: bool = True
    # Where fsyncs run; the store's own threads (open_log), the loop's default
    # executor when None.
    fsync_threads: Executor | None = None
    # ``os`` mode: the longest a written line waits for its fsync (seconds).
    sync_interval: float = 1.0

    def __post_init__(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NoSuchSession(
                f"no session {self.session!r}: {self.path} does not exist"
            ) from None
        except OSError as exc:
            raise planted_error(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLocked(
                f"the log of session {self.session!r} ({self.path}) is open by another writer; "
                "stop the daemon that holds it (one writer per log)"
            ) from None
        self._fd = fd
        self._identity: LogIdentity = identity_of(fd)
        self._builder = RecordBuilder(self.session, self.clock)
        self._pos = START
        self._recovered = False
        self._repair: Repair | None = None
        self._failed: str | None = None
        self._synced = 0
        # Group commit: every append waits on the commit of its batch, one future a
        # batch (not one an append): the batch of the fsync under way (and the offset
        # it covers), and the batch of the next one, which every append written
        # meanwhile joins.
        self._inflight: _Batch | None = None
        self._inflight_target = 0
        self._next: _Batch | None = None
        self._closing = False
        # A flush is due (a loop callback queued) or under way: no other one starts.
        self._flushing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._verified = START  # lines up to here checked out (recovery, then verify())
        self._sync_timer: asyncio.TimerHandle | None = None  # os mode: the next sync

    # --- reading ------------------------------------------------------------------

    def _read(self, size: int, offset: int) -> bytes:
        return os.pread(self._fd, size, offset)

    @property
    def position(self) -> LogPosition:
        return self._pos

    @property
    def synced_offset(self) -> int:
        """Bytes known durable (fsync mode). Used by the power-cut simulation in tests."""
        return self._synced

    @property
    def repair(self) -> Repair | None:
        return self._repair

    def recover(self, after: LogPosition = START) -> Iterator[Record]:
        if self._recovered:
            raise RuntimeError("recover() runs once per open log")
        if after.seq:
            self._check_position(after)
        end = ScanEnd(after)
        # A quarter of a MB a read: the daemon folds a long log a slice at a time
        # (sessiond.log.pace), and one step that split 8 MB would stall it.
        yield from scan(lambda size, at: self._read(min(size, READ_STEP), at), after, end)
        size = os.fstat(self._fd).st_size
        bad = classify_tail(self._read, end, size)
        if bad is not None:
            self._failed = f"line {bad.line} is corrupt"
            raise LogCorrupt(str(self.path), bad.line, bad.offset, bad.why)
        self._pos = end.position
        if end.tail_bytes:
            # Cut the torn tail and record the cut in one durable step: a crash
            # between the two must not lose the record of what was dropped.
            self._repair = Repair(
                dropped_bytes=end.tail_bytes,
                at_offset=end.position.offset,
                last_good_seq=end.position.seq,
                reason=end.tail_reason,
            )
            os.ftruncate(self._fd, end.position.offset)
            event = LogRepaired(
                dropped_bytes=end.tail_bytes,
                at_offset=end.position.offset,
                last_good_seq=end.position.seq,
                reason=end.tail_reason,
            )
            records, buf = self._builder.build(self._pos.seq, [Draft(event)])
            self.hooks.write(self._fd, buf)
            self.hooks.fsync(self._fd)
            self._pos = LogPosition(
                records[0]["seq"], self._pos.offset + len(buf), records[0]["id"]
            )
            yield records[0]
        elif self.durability == "fsync" and self.sync_on_recover and self._pos.offset:
            # What a crashed writer left in the page cache is durable from now on,
            # before anyone acts on it. (The daemon syncs the whole file system
            # once instead, and sets sync_on_recover False.)
            try:
                self.hooks.fsync(self._fd)
            except OSError as exc:
                self._failed = f"fsync failed: {exc}"
                raise LogFailed(f"{self.path}: {self._failed}") from exc
        self._synced = self._pos.offset
        if self.hooks.synced is not None:
            self.hooks.synced(self.session, self._synced)
        # Recovery read every line after `after` with its checksum and seq, and
        # the ones before it were the snapshot's: the daemon's own end from here.
        self._verified = self._pos
        self._recovered = True

    def verify(self) -> str | None:
        """Is the file at ``path`` still the one this log appends to, exactly as long
        as its own end, with every line since the last check good? (The gate's "log
        intact"; see integrity.py.) Only the lines written since the last check are
        read."""
        if not self._recovered or self._fd < 0:
            return None  # nothing of ours to vouch for yet (or any more)
        problem, self._verified = check_log(
            self.path, self._fd, self._identity, self._pos, self._verified
        )
        return problem

    def _check_position(self, after: LogPosition) -> None:
        check_position(self._read, os.fstat(self._fd).st_size, after)

    # --- writing ------------------------------------------------------------------

    def write_many(self, drafts: Sequence[Draft]) -> Pending:
        if not self._recovered:
            raise RuntimeError("recover() the log before appending to it")
        if self._closing:
            raise LogFailed(f"the log of session {self.session!r} is closed; nothing was written")
        if self._failed is not None:
            raise LogFailed(
                f"the log of session {self.session!r} takes no appends: {self._failed}; "
                "restart the daemon to re-read it from disk"
            )
        records, buf = self._builder.build(self._pos.seq, drafts)
        if not records:
            return Pending([], self._pos)
        try:
            self.hooks.write(self._fd, buf)
        except OSError as exc:
            self._undo_partial_write(exc)
        last = records[-1]
        self._pos = LogPosition(last["seq"], self._pos.offset + len(buf), last["id"])
        if self._sync_timer is None and self.durability == "os":
            self._arm_sync()
        return Pending(records, self._pos)

    def _arm_sync(self) -> None:
        """``os`` mode: sync what was just written within ``sync_interval``."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # written outside a loop (a tool, a test): close() syncs it
        self._sync_timer = loop.call_later(self.sync_interval, self._sync_due)

    def _sync_due(self) -> None:
        self._sync_timer = None
        if self._failed is None and self._synced < self._pos.offset:
            self._request_sync(self._pos.offset).add_done_callback(_quiet)

    def _undo_partial_write(self, exc: OSError) -> None:
        """Cut a partly written batch so the log stays a sequence of whole lines."""
        try:
            os.ftruncate(self._fd, self._pos.offset)
        except OSError as cut_exc:
            self._failed = f"a write failed ({exc}) and cutting it back failed ({cut_exc})"
            raise LogFailed(f"{self.path}: {self._failed}") from exc
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFull(
                f"{self.path}: no space left on the device; nothing was written. Free space "
                "in the state dir and try again"
            ) from exc
        self._failed = f"a write failed: {exc}"
        raise LogFailed(f"{self.path}: {self._failed}") from exc

    async def sync(self, pending: Pending) -> None:
        waiter = self._waiter(pending.position.offset)
        if waiter is not None:
            await waiter

    # append and append_many are the base class's, written out flat: one coroutine
    # frame less per append is measurable when many writers share a log.

    async def append_many(self, drafts: Sequence[Draft]) -> list[Record]:
        pending = self.write_many(drafts)
        waiter = self._waiter(pending.position.offset)
        if waiter is not None:
            await waiter
        return pending.records

    async def append(
        self, data: EventData, *, causation: str | None = None, correlation: str | None = None
    ) -> Record:
        # write_many for one event, inline: no draft, list or Pending per append
        # (the path of many writers sharing a log's group commit).
        if not self._recovered or self._closing or self._failed is not None:
            return (await self.append_many((Draft(data, causation, correlation),)))[0]
        pos = self._pos
        record, buf = self._builder.build_one(pos.seq, data, causation, correlation)
        try:
            self.hooks.write(self._fd, buf)
        except OSError as exc:
            self._undo_partial_write(exc)
        end = pos.offset + len(buf)
        self._pos = LogPosition(record["seq"], end, record["id"])
        if self.durability == "os":
            if self._sync_timer is None:
                self._arm_sync()
        elif self._synced < end:
            await self._request_sync(end)
        return record

    def _waiter(self, target: int) -> asyncio.Future[None] | None:
        """A future done once the log is durable up to byte ``target`` (None: already is)."""
        if self.durability == "os" or self._synced >= target:
            return None
        return self._request_sync(target)

    def _request_sync(self, target: int) -> asyncio.Future[None]:
        """A future done once the log is durable up to byte ``target`` (group commit)."""
        if self._failed is not None:
            raise LogFailed(f"{self.path}: {self._failed}")
        inflight = self._inflight
        if inflight is not None and target <= self._inflight_target:
            return inflight
        batch = self._next
        if batch is None:
            loop = self._loop
            if loop is None or not loop.is_running():
                # the loop of the first batch, asked again only if it stopped: in
                # Python 3.11 ``get_running_loop()`` is a getpid system call
                loop = self._loop = asyncio.get_running_loop()
            batch = self._next = _Batch(loop=loop)
            if not self._flushing:
                # The flush starts from a loop callback queued behind everything
                # ready now: every writer that runs in this loop iteration joins it.
                self._flushing = True
                loop.call_soon(self._flush)
        return batch

    def _flush(self) -> None:
        """Group commit, driven by loop callbacks (no task): start one fsync covering
        every append written so far; ``_flushed`` settles its batch when it is done and
        queues the next flush if anyone joined meanwhile. One fsync at a time."""
        batch, self._next = self._next, None
        if batch is None or self._loop is None:
            self._flushing = False
            return
        target = self._pos.offset
        self._inflight, self._inflight_target = batch, target
        loop = self._loop
        flushed: Callable[[BaseException | None], None] = self._flushed
        if self.hooks.fsync_seconds is not None:
            flushed = _timed(flushed, self.hooks.fsync_seconds)
        try:
            if self.hooks.fsync is os.fsync:
                # the kernel runs it (io_uring) and wakes the loop: no Python thread, no GIL
                # (kernelfsync.py); where it cannot, a thread as below
                kernel = _kernel_fsync(loop)
                if kernel is not None and kernel.submit(self._fd, flushed):
                    return
            if self.fsync_threads is None:
                loop.run_in_executor(
                    None, _fsync_job, self.hooks.fsync, self._fd, loop, flushed
                ).add_done_callback(_quiet)
            else:
                self.fsync_threads.submit(_fsync_job, self.hooks.fsync, self._fd, loop, flushed)
        except BaseException as exc:  # a closed executor: not durable either
            self._flushed(exc)
            if not isinstance(exc, Exception):
                raise

    def _flushed(self, outcome: BaseException | None) -> None:
        """The fsync of the batch in flight is done (a loop callback from its thread)."""
        batch = self._inflight
        self._inflight = None
        if batch is None:  # (cannot happen: one fsync at a time)
            self._flushing = False
            return
        if outcome is not None:
            # fsyncgate: after a failed fsync the kernel may have dropped the dirty
            # pages, so a later fsync can succeed without the data. Stop writing; a
            # restart re-reads what is really on disk. Any other failure is the same
            # to the waiters: not durable. Nobody is left waiting.
            self._failed = f"fsync failed: {outcome!r}"
            error = LogFailed(f"{self.path}: {self._failed}")
            for waiting in (batch, self._next):
                if waiting is not None:
                    waiting.settle(error)
            self._next = None
            self._flushing = False
            return
        self._synced = max(self._synced, self._inflight_target)
        if self.hooks.synced is not None:
            self.hooks.synced(self.session, self._synced)
        # Wake the waiters first, then queue the next flush behind them: the writers
        # just acknowledged write their next events before it starts and join it
        # (no timer, no delay beyond the work already queued). Nobody joined: idle.
        batch.settle(None)
        if self._next is not None and self._loop is not None:
            self._loop.call_soon(self._flush)
        else:
            self._flushing = False

    async def close(self) -> None:
        """Refuse new appends, wait until every written append is durable, close."""
        if self._fd < 0:
            return
        self._closing = True
        if self._sync_timer is not None:
            self._sync_timer.cancel()
            self._sync_timer = None
        if self.durability == "os" and self._failed is None and self._synced < self._pos.offset:
            # What the timer would have synced: a clean stop keeps the same bound.
            with contextlib.suppress(LogFailed, RuntimeError):
                self._request_sync(self._pos.offset).add_done_callback(_quiet)
        while (batch := self._inflight or self._next) is not None:
            await asyncio.wait([batch])
        os.close(self._fd)
        self._fd = -1


class _Batch(asyncio.Future[None]):
    """The appends one fsync commits, waiting together on one future.

    Each waiter is a task of its own; a task cancelled while it waits must not
    cancel the commit for the others (as it would cancel a future of its own), so
    the batch refuses to be cancelled: the task is cancelled once the commit is
    settled (asyncio cancels a task whose awaited future refused at its next
    step)."""

    def cancel(self, msg: object = None) -> bool:  # noqa: ARG002 - asyncio passes it
        return False

    def settle(self, error: BaseException | None) -> None:
        if error is None:
            self.set_result(None)
        else:
            self.set_exception(error)
            self.exception()  # retrieved: the waiters (if any are left) get it


def _quiet(done: asyncio.Future[None]) -> None:
    """Nobody awaits a background sync: its failure fails the log (the next append
    says so), not a stray "exception was never retrieved"."""
    if not done.cancelled():
        done.exception()


def check_position(read: Callable[[int, int], bytes], size: int, after: LogPosition) -> None:
    """Is the line that ends at ``after.offset`` event ``after.seq`` with ``after.last_id``?
    (:class:`PositionMismatch` if not.) ``read(size, offset)`` reads the file."""
    if not 0 < after.offset <= size:
        raise PositionMismatch(f"offset {after.offset} is outside the log ({size} bytes)")
    span = 1 << 12
    while True:
        start = max(0, after.offset - span)
        tail = read(after.offset - start, start)
        if not tail.endswith(b"\n"):
            raise PositionMismatch("no line ends at the position's offset")
        cut = tail.rfind(b"\n", 0, len(tail) - 1)
        if cut >= 0 or start == 0:
            break
        span *= 4
    record = decode_line(tail[cut + 1 : -1])
    if record is None or record.get("seq") != after.seq or record.get("id") != after.last_id:
        raise PositionMismatch(f"the line before offset {after.offset} is not seq {after.seq}")
