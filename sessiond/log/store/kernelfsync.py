"""Group-commit fsyncs the kernel runs for the event loop (Linux AIO, ``IOCB_CMD_FSYNC``).

A log's fsync must not block the loop, so it ran in a thread: the loop woke the
thread, the thread took the GIL to start, dropped it around ``fsync``, took it
again to wake the loop (``call_soon_threadsafe``), and the loop took it back.
With four clients each sending to a session of its own that was about 70 µs of
CPU a ``send`` in the threads and the locks, and GIL hand-offs the loop waited
on (bench/README.md, "the kernel runs the fsync"). Here the loop submits the
fsync to the kernel (``io_submit``, which queues it to a kernel worker and
returns at once) and the kernel signals its completion on an eventfd the loop
watches: no Python thread, no GIL to pass. The fsync is the same ``vfs_fsync``
as ``os.fsync``'s, and its result (0 or a negative errno) comes back with it: a
failure is reported as ``os.fsync``'s ``OSError`` would be.

Used only where it is certain to work: Linux on x86-64 or arm64, an AIO context
the kernel grants, the process that made it (a forked child has none), at most
``MAX_INFLIGHT`` fsyncs at once. Anything else (a refused ``io_setup`` or
``io_submit``, a file system without fsync for AIO) makes ``submit`` say no and
the caller runs the fsync in a thread as before.
"""

from __future__ import annotations

import ctypes
import os
import sys
import weakref
from asyncio import AbstractEventLoop
from collections.abc import Callable

# (io_setup, io_destroy, io_getevents, io_submit): the generic table (arm64) and x86-64's
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
_IOCB_CMD_FSYNC = 2
_IOCB_FLAG_RESFD = 1
# One fsync a log at a time; as many logs at once as the fsync threads would run.
MAX_INFLIGHT = 64
_REAP = 64  # completions read by one io_getevents


class _Iocb(ctypes.Structure):
    """``struct iocb`` (linux/aio_abi.h), little-endian field order."""

    _fields_ = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class _IoEvent(ctypes.Structure):
    """``struct io_event``."""

    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


Done = Callable[[BaseException | None], None]


class KernelFsync:
    """One AIO context and its eventfd, read by one loop. ``submit(fd, done)``
    starts an fsync of ``fd``; ``done(None)`` or ``done(error)`` runs in the loop
    once the kernel finished it."""

    def __init__(self, loop: AbstractEventLoop, numbers: tuple[int, int, int, int]) -> None:
        self._setup, self._destroy, self._getevents, self._submit = numbers
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = self._libc.syscall
        self._syscall.restype = ctypes.c_long
        self._ctx = ctypes.c_ulong(0)
        if self._syscall(self._setup, MAX_INFLIGHT, ctypes.byref(self._ctx)) != 0:
            raise OSError(ctypes.get_errno(), "io_setup refused")
        self._pid = os.getpid()
        self._efd = -1
        self._loop: weakref.ref[AbstractEventLoop] | None = None
        try:
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            loop.add_reader(self._efd, self._reap)
        except BaseException:
            self.close()
            raise
        # weakly: the loop's finalizer closes this (a strong one would keep both alive)
        self._loop = weakref.ref(loop)
        # the iocbs in flight (the kernel reads them until it completes) and their callers
        self._jobs: dict[int, tuple[_Iocb, Done]] = {}
        self._next_key = 0
        self._events = (_IoEvent * _REAP)()
        self._one = (ctypes.POINTER(_Iocb) * 1)()
        self.completed = 0  # fsyncs the kernel ran for this loop (tests, benchmarks)

    def submit(self, fd: int, done: Done) -> bool:
        """Start an fsync of ``fd``; False if it was not started (run it another way)."""
        if self._efd < 0 or len(self._jobs) >= MAX_INFLIGHT or os.getpid() != self._pid:
            return False
        self._next_key += 1
        key = self._next_key
        iocb = _Iocb(aio_data=key, aio_lio_opcode=_IOCB_CMD_FSYNC, aio_fildes=fd,
                     aio_flags=_IOCB_FLAG_RESFD, aio_resfd=self._efd)  # fmt: skip
        self._one[0] = ctypes.pointer(iocb)
        if self._syscall(self._submit, self._ctx, 1, self._one) != 1:
            return False  # (EINVAL: no AIO fsync on this file system; EAGAIN: full)
        self._jobs[key] = (iocb, done)
        return True

    def _reap(self) -> None:
        """The eventfd is readable: settle every fsync the kernel has finished."""
        try:  # noqa: SIM105 - (suppress() is a context manager a wake-up: slower)
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        while self._jobs:
            n = self._syscall(self._getevents, self._ctx, 0, _REAP, self._events, None)
            if n <= 0:
                return
            for i in range(n):
                event = self._events[i]
                self.finish(event.data, event.res)
            if n < _REAP:
                return

    def finish(self, key: int, res: int) -> None:
        """Fsync ``key`` ended with ``res`` (0, or minus an errno): tell its caller."""
        job = self._jobs.pop(key, None)
        if job is None:
            return
        self.completed += 1
        outcome = None if res == 0 else OSError(-res, os.strerror(-res))
        try:
            job[1](outcome)
        except Exception as exc:  # one caller's bug must not strand the others
            loop = self._loop() if self._loop is not None else None
            if loop is not None:
                loop.call_exception_handler(
                    {"message": "an fsync's completion callback failed", "exception": exc}
                )

    def close(self) -> None:
        """Forget the context (the kernel finishes what is in flight first)."""
        if self._efd >= 0:
            loop = self._loop() if self._loop is not None else None
            if loop is not None and not loop.is_closed():
                loop.remove_reader(self._efd)
            os.close(self._efd)
            self._efd = -1
        if self._ctx.value and os.getpid() == self._pid:
            self._syscall(self._destroy, self._ctx)
        self._ctx = ctypes.c_ulong(0)


_by_loop: weakref.WeakKeyDictionary[AbstractEventLoop, KernelFsync | None] = (
    weakref.WeakKeyDictionary()
)


def for_loop(loop: AbstractEventLoop) -> KernelFsync | None:
    """The loop's kernel fsyncs, made on first use; None where they cannot be had
    (then fsyncs run in threads). ``SESSIOND_FSYNC_THREADS=1`` says threads always
    (to compare the two)."""
    try:
        return _by_loop[loop]
    except KeyError:
        pass
    ring: KernelFsync | None = None
    numbers = _SYSCALLS.get(os.uname().machine)
    if (
        sys.platform == "linux"
        and sys.byteorder == "little"
        and numbers is not None
        and os.environ.get("SESSIOND_FSYNC_THREADS") != "1"
    ):
        try:
            ring = KernelFsync(loop, numbers)
        except (OSError, AttributeError, NotImplementedError, RuntimeError):
            ring = None  # no AIO here (a sandbox's seccomp, a loop without readers)
    _by_loop[loop] = ring
    if ring is not None:
        weakref.finalize(loop, ring.close)
    return ring
