"""Group-commit fsyncs run by the kernel for the event loop (io_uring, ``IORING_OP_FSYNC``).

A log's fsync must not block the loop, so it ran in a Python thread: the loop
woke the thread, the thread took the GIL to start, dropped it around ``fsync``,
took it again to wake the loop (``call_soon_threadsafe``), and the loop took it
back. Here the loop writes the fsync into an io_uring's submission ring and
enters it (one system call); the kernel runs it on one of its io-wq workers
(threads of this process that never take the GIL, placed by the scheduler on
any core, so the fsync's CPU does not run in series with the loop), and posts
the result in the completion ring, signalled on an eventfd the loop watches.
The fsync is the same ``vfs_fsync`` as ``os.fsync``'s, and its result (0 or a
negative errno) is reported as ``os.fsync``'s ``OSError`` would be
(bench/README.md, "the fsync on io_uring").

(Linux AIO's ``IOCB_CMD_FSYNC`` was measured first and dropped: the kernel runs
it on a worker of the submitting core, in series with the loop.)

Used only where it is certain to work: Linux on x86-64 (whose stores and loads
the kernel sees in program order: the rings are shared memory read without
barriers here), an io_uring the kernel grants (``kernel.io_uring_disabled``, a
container's seccomp), the process that made it (a forked child does not use
its parent's), at most ``MAX_INFLIGHT`` fsyncs at once. Anything else makes
``submit`` say no and the caller runs the fsync in a thread as before.

An fsync the kernel took and never answered must not stall the loop: a bench
daemon under four clients was found with four fsyncs taken (``SqHead`` four
past ``CqTail`` in its fdinfo) and no completion ever posted, its sessions'
appends waiting for good and its shutdown with them (bench/README.md, "an
fsync the kernel never answered"). So every fsync in flight is bounded: one
the kernel has not answered within ``STALL_SECONDS`` is run again by
``os.fsync`` in a thread (same fd, so it covers everything the first would
have) and settled by that thread's result; the late completion, if it ever
comes, is ignored; and the ring takes no more fsyncs (``submit`` says no, the
loop's logs use threads) and says so once in the daemon's log.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import struct
import sys
import time
import weakref
from asyncio import AbstractEventLoop, Future, TimerHandle
from collections.abc import Callable

import structlog

_SETUP, _ENTER, _REGISTER = 425, 426, 427  # x86-64's io_uring_setup, _enter, _register
_OP_FSYNC = 3
_REGISTER_EVENTFD = 4
_ENTER_GETEVENTS = 1
_SQ_CQ_OVERFLOW = 2  # IORING_SQ_CQ_OVERFLOW, in the submission ring's flags
# While fsyncs are in flight, how often the loop looks for completions the
# kernel kept aside (see ``_reap``) though no eventfd signal came (seconds).
WATCH_EVERY = 0.05
_FEAT_SINGLE_MMAP = 1
_OFF_SQES = 0x10000000
# One fsync a log at a time; as many logs at once as the fsync threads would run.
MAX_INFLIGHT = 64
_U32 = struct.Struct("I")
_SQE = struct.Struct("BBHiQQIIQQQQ")  # struct io_uring_sqe, 64 bytes: opcode ... user_data
_CQE = struct.Struct("QiI")  # struct io_uring_cqe: user_data, res, flags

# The longest the kernel may take to answer an fsync before it is taken as lost
# and run again in a thread (seconds). Generous: an fsync on a busy disk takes
# milliseconds to a second or two; a false alarm costs one extra fsync and the
# io_uring's saving for the rest of the loop's life, never durability.
STALL_SECONDS = 5.0

Done = Callable[[BaseException | None], None]

# This process's pid, kept up to date in a forked child: ``os.getpid()`` is a
# system call (glibc caches it no more), once a ``submit``, i.e. once a `send`.
_pid = os.getpid()


def _forked() -> None:
    global _pid  # noqa: PLW0603 - the one pid of this process, set again in a child
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


log = structlog.get_logger(__name__)


class KernelFsync:
    """One io_uring and its eventfd, read by one loop. ``submit(fd, done)``
    starts an fsync of ``fd``; ``done(None)`` or ``done(error)`` runs in the loop
    once the kernel finished it."""

    def __init__(self, loop: AbstractEventLoop) -> None:
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        self._syscall.restype = ctypes.c_long
        params = ctypes.create_string_buffer(120)  # struct io_uring_params
        fd = self._syscall(_SETUP, MAX_INFLIGHT, params)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "io_uring_setup refused")
        self._rfd, self._efd = fd, -1
        self._watch: TimerHandle | None = None
        self._pid = _pid
        self.retired = False  # an fsync went unanswered: no more fsyncs here
        self.stall_seconds = STALL_SECONDS  # (tests set it small)
        self._loop: weakref.ref[AbstractEventLoop] | None = None
        try:
            sq_entries, cq_entries, _, _, _, features = struct.unpack_from("6I", params, 0)
            sq = struct.unpack_from("8I", params, 40)  # struct io_sqring_offsets
            cq = struct.unpack_from("8I", params, 80)  # struct io_cqring_offsets
            if not features & _FEAT_SINGLE_MMAP:
                raise OSError(0, "io_uring without a single mapping of its rings")
            size = max(sq[6] + sq_entries * 4, cq[5] + cq_entries * 16)
            rw = mmap.PROT_READ | mmap.PROT_WRITE
            self._ring = mmap.mmap(fd, size, mmap.MAP_SHARED, rw, offset=0)
            self._sqes = mmap.mmap(fd, sq_entries * 64, mmap.MAP_SHARED, rw, offset=_OFF_SQES)
            self._sq_tail, self._sq_array, self._sq_flags = sq[1], sq[6], sq[4]
            self._sq_head = sq[0]  # (read once, for the warning of an unanswered fsync)
            self._smask = _U32.unpack_from(self._ring, sq[2])[0]
            self._cq_head, self._cq_tail, self._cqes = cq[0], cq[1], cq[5]
            self._cmask = _U32.unpack_from(self._ring, cq[2])[0]
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            efd = ctypes.c_int(self._efd)
            if self._syscall(_REGISTER, fd, _REGISTER_EVENTFD, ctypes.byref(efd), 1) != 0:
                raise OSError(ctypes.get_errno(), "io_uring refused the eventfd")
            loop.add_reader(self._efd, self._reap)
        except BaseException:
            self.close()
            raise
        # weakly: the loop's finalizer closes this (a strong one would keep both alive)
        self._loop = weakref.ref(loop)
        # the fsyncs in flight, by their user_data: who waits, the fd, when it went
        self._jobs: dict[int, tuple[Done, int, float]] = {}
        self._next_key = 0
        self.completed = 0  # fsyncs the kernel ran for this loop (tests, benchmarks)
        self.overflowed = 0  # times completions were found kept aside (tests)

    def submit(self, fd: int, done: Done) -> bool:
        """Start an fsync of ``fd``; False if it was not started (run it another way)."""
        if self._efd < 0 or self.retired or len(self._jobs) >= MAX_INFLIGHT or _pid != self._pid:
            return False
        self._next_key += 1
        key = self._next_key
        ring = self._ring
        tail = _U32.unpack_from(ring, self._sq_tail)[0]
        index = tail & self._smask
        _SQE.pack_into(self._sqes, index * 64, _OP_FSYNC, 0, 0, fd, 0, 0, 0, 0, key, 0, 0, 0)
        _U32.pack_into(ring, self._sq_array + index * 4, index)
        _U32.pack_into(ring, self._sq_tail, (tail + 1) & 0xFFFFFFFF)
        if self._syscall(_ENTER, self._rfd, 1, 0, 0, None, 0) != 1:
            _U32.pack_into(ring, self._sq_tail, tail)  # not taken: withdrawn
            return False
        self._jobs[key] = (done, fd, time.monotonic())
        if self._watch is None and self._loop is not None:
            loop = self._loop()
            if loop is not None:
                self._watch = loop.call_later(WATCH_EVERY, self._watched)
        return True

    def _watched(self) -> None:
        """While fsyncs are in flight, every ``WATCH_EVERY``: completions the kernel
        kept aside (their eventfd signal may never come) are taken now, not never;
        and the oldest fsync still unanswered past ``stall_seconds`` retires the ring."""
        self._watch = None
        if self._efd < 0 or not self._jobs:
            return
        if _U32.unpack_from(self._ring, self._sq_flags)[0] & _SQ_CQ_OVERFLOW:
            self._reap()
        if not self._jobs:
            return
        waited = time.monotonic() - min(sent for _, _, sent in self._jobs.values())
        if waited >= self.stall_seconds:
            self._retire(waited)
        elif self._loop is not None and (loop := self._loop()) is not None:
            self._watch = loop.call_later(WATCH_EVERY, self._watched)

    def _retire(self, waited: float) -> None:
        """An fsync went unanswered for ``waited`` seconds: take what the kernel
        kept aside, run every fsync still unanswered again in a thread, and take
        no more fsyncs on this ring."""
        self.retired = True
        ring = self._ring
        sq_head, cq_tail = (_U32.unpack_from(ring, at)[0] for at in (self._sq_head, self._cq_tail))
        # what the kernel kept aside settles with its own result (see _reap)
        self._reap()
        log.warning(
            "fsync.kernel_unanswered",
            waited=round(waited, 3),
            unanswered=len(self._jobs),
            sq_head=sq_head,
            cq_tail=cq_tail,
            then="fsyncs of this loop in threads",
        )
        loop = self._loop() if self._loop is not None else None
        for key, (done, fd, _) in list(self._jobs.items()):
            del self._jobs[key]  # its late completion, if any, finds nobody
            if loop is None or loop.is_closed():
                self._settle(done, RuntimeError("the loop closed before its fsync was done"))
                continue
            try:
                again = loop.run_in_executor(None, os.fsync, fd)
            except RuntimeError as exc:  # the executor is shut down: not durable
                self._settle(done, exc)
                continue
            again.add_done_callback(functools.partial(self._settled_again, done))

    def _reap(self) -> None:
        """The eventfd is readable: settle every fsync the kernel has finished.

        A completion the kernel could not post in the ring when it came is kept
        on its overflow list (``IORING_SQ_CQ_OVERFLOW`` set), and so is every one
        after it until the list is moved into the ring by an ``io_uring_enter``
        with ``GETEVENTS``; the eventfd is signalled only when the ring's tail
        moves, so nothing else would tell the loop. A daemon under four
        clients' sends was found with four such completions kept aside and their
        sessions' appends waiting for good; ``_watched`` looks for them as well."""
        try:  # noqa: SIM105 - (suppress() is a context manager a wake-up: slower)
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        ring = self._ring
        for _ in range(3):  # (a flush that left some aside: the watch takes them)
            head = _U32.unpack_from(ring, self._cq_head)[0]
            while head != _U32.unpack_from(ring, self._cq_tail)[0]:
                key, res, _ = _CQE.unpack_from(ring, self._cqes + (head & self._cmask) * 16)
                head = (head + 1) & 0xFFFFFFFF
                _U32.pack_into(ring, self._cq_head, head)  # the entry is ours: its slot is free
                self.finish(key, res)
                if self._efd < 0:  # closed by a caller's callback
                    return
            if not _U32.unpack_from(ring, self._sq_flags)[0] & _SQ_CQ_OVERFLOW:
                return
            # the ring has room now: the kernel moves what it kept aside into it
            self.overflowed += 1
            self._syscall(_ENTER, self._rfd, 0, 0, _ENTER_GETEVENTS, None, 0)

    def finish(self, key: int, res: int) -> None:
        """Fsync ``key`` ended with ``res`` (0, or minus an errno): tell its caller."""
        job = self._jobs.pop(key, None)
        if job is None:
            if res < 0 and res != -errno.ECANCELED and self.retired:
                # run again in a thread and answered by it; this one's failure can
                # no longer be reported to its appends: it is said, loudly
                log.error("fsync.kernel_late_failure", error=os.strerror(-res))
            return
        self.completed += 1
        self._settle(job[0], None if res == 0 else OSError(-res, os.strerror(-res)))

    def _settled_again(self, done: Done, again: Future[None]) -> None:
        """The fsync run again in a thread is done: its result is the job's."""
        if again.cancelled():
            self._settle(done, RuntimeError("the fsync run again in a thread was cancelled"))
        else:
            self._settle(done, again.exception())

    def _settle(self, done: Done, outcome: BaseException | None) -> None:
        try:
            done(outcome)
        except Exception as exc:  # one caller's bug must not strand the others
            loop = self._loop() if self._loop is not None else None
            if loop is not None:
                loop.call_exception_handler(
                    {"message": "an fsync's completion callback failed", "exception": exc}
                )

    def close(self) -> None:
        """Forget the ring (the kernel finishes what is in flight first)."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._efd >= 0:
            loop = self._loop() if self._loop is not None else None
            if loop is not None and not loop.is_closed():
                loop.remove_reader(self._efd)
            os.close(self._efd)
            self._efd = -1
        if self._rfd >= 0:
            for mapped in ("_sqes", "_ring"):
                m = self.__dict__.pop(mapped, None)
                if m is not None:
                    m.close()
            os.close(self._rfd)
            self._rfd = -1


_by_loop: weakref.WeakKeyDictionary[AbstractEventLoop, KernelFsync | None] = (
    weakref.WeakKeyDictionary()
)


def for_loop(loop: AbstractEventLoop) -> KernelFsync | None:
    """The loop's kernel fsyncs, made on first use; None where they cannot be had
    (then fsyncs run in threads)."""
    try:
        return _by_loop[loop]
    except KeyError:
        pass
    ring: KernelFsync | None = None
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        try:
            ring = KernelFsync(loop)
        except (OSError, AttributeError, NotImplementedError, RuntimeError, ValueError):
            ring = None  # no io_uring here (turned off, a sandbox's seccomp)
    _by_loop[loop] = ring
    if ring is not None:
        weakref.finalize(loop, ring.close)
    return ring
