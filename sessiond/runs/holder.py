"""A holder's program: how it starts, and that a cluster node's dies at its lease
deadline, by the kernel's hand.

A holder (runs/spawner.py) starts its program with ``launch`` once the daemon
says go: posix_spawn, or a fork of its own where posix_spawn cannot do what the
program needs (a ``[run] user``, a parent-death signal).

The spawner (runs/spawner.py) is told the deadline after every lease renewal:
last renewal + ``lease_ttl`` - a margin (cluster/lease.py). Checking it in the
spawner's loop is not enough when the whole node is paused: a SIGSTOP of its
process tree, a cgroup freeze of the node, or a machine suspended. Then nothing
of the node runs at the deadline, and at the thaw every process resumes at once:
a program may write before its spawner or holder has looked at any clock (the
holder is one runnable process among many, and may be resumed last).

So each holder arms a POSIX timer (``timer_create``) on ``CLOCK_BOOTTIME`` whose
signal is SIGKILL to the holder itself, at the deadline; every renewal moves it
on. The kernel delivers it at the deadline whether or not the holder runs: a
stopped or frozen process is killed by SIGKILL without running another
instruction. The program is started with ``PR_SET_PDEATHSIG`` = SIGKILL, so the
kernel kills it in the same moment, also while it is stopped; a sandboxed run's
bubblewrap does the same for its whole PID namespace (``--die-with-parent``).
The children of an unsandboxed program are not killed with it, nor the program
if it clears its parent-death signal (any process may): they reparent
to the spawner, which kills them once it runs again, past its own deadline
(milliseconds after a thaw).
``CLOCK_BOOTTIME`` counts the time a machine spends suspended (``CLOCK_MONOTONIC``
does not), so a node resumed after its lease lapsed finds its programs dead.
A paused virtual machine whose clocks do not count the pause is not seen by
any clock inside it: there, the run's fencing token is what refuses its writes.

How the deadline reaches the holders: one shared page (``MAP_SHARED``, made by
the spawner before it forks any holder) holds it, in nanoseconds of
``CLOCK_BOOTTIME``; the spawner writes it, then sends ``FENCE_SIG`` to every
holder, whose loop wakes and re-arms its timer from the page. Standard library
only: the spawner and its holders import nothing else.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import signal
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessiond.runs.spawnproto import SpawnerRequest

KILL_TREE = signal.SIGUSR1  # R's "kill the run's subtree" (runs/spawner.py)
FENCE_SIG = signal.SIGUSR2  # "the deadline moved": a holder's loop wakes and re-arms
PR_SET_PDEATHSIG = 1
_SIGEV_SIGNAL = 0
_TIMER_ABSTIME = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


class _SigEvent(ctypes.Structure):
    # struct sigevent on Linux: the value, signo, notify, then a 48-byte union
    _fields_ = (
        ("value", ctypes.c_void_p),
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("pad", ctypes.c_byte * 48),
    )


class _TimeSpec(ctypes.Structure):
    _fields_ = (("sec", ctypes.c_long), ("nsec", ctypes.c_long))


class _ITimerSpec(ctypes.Structure):
    _fields_ = (("interval", _TimeSpec), ("value", _TimeSpec))


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def boottime_of(monotonic_at: float) -> float:
    """A ``time.monotonic()`` instant (the daemon's deadline) on ``CLOCK_BOOTTIME``."""
    return monotonic_at + (time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic())


class Deadline:
    """The shared page: the node's deadline in ns of CLOCK_BOOTTIME, 0 for none (one
    machine: nothing to fence). An aligned 8-byte store is one write on every
    platform Linux runs this on, so a holder never reads half of one."""

    def __init__(self) -> None:
        self._page = mmap.mmap(-1, mmap.PAGESIZE)  # MAP_SHARED: the holders see the writes
        self._ns = ctypes.c_int64.from_buffer(self._page)

    def set(self, boottime: float) -> None:
        self._ns.value = max(1, int(boottime * 1e9))

    def get(self) -> int:
        return int(self._ns.value)


class KillTimer:
    """A holder's own timer: SIGKILL to itself at the deadline on the page."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self._id: ctypes.c_void_p | None = None
        self._armed = 0
        self.rearm()  # held or running, from now on

    @property
    def fenced(self) -> bool:
        return self.deadline.get() != 0

    def rearm(self) -> None:
        """(Re)arm at the page's deadline when it moved. A deadline already past
        fires at once. Fails closed: when the kernel refuses the timer, the holder
        dies here, as at the deadline (its program with it; the spawner kills the
        rest)."""
        ns = self.deadline.get()
        if ns in (self._armed, 0):
            return
        try:
            self._arm(ns)
        except OSError:
            os.kill(os.getpid(), signal.SIGKILL)
        self._armed = ns

    def _arm(self, ns: int) -> None:
        if self._id is None:
            event = _SigEvent(signo=signal.SIGKILL, notify=_SIGEV_SIGNAL)
            timer = ctypes.c_void_p()
            _check(
                _LIBC.timer_create(
                    ctypes.c_int(time.CLOCK_BOOTTIME), ctypes.byref(event), ctypes.byref(timer)
                ),
                "timer_create",
            )
            self._id = timer
        spec = _ITimerSpec(value=_TimeSpec(sec=ns // 1_000_000_000, nsec=ns % 1_000_000_000))
        _check(
            _LIBC.timer_settime(self._id, _TIMER_ABSTIME, ctypes.byref(spec), None),
            "timer_settime",
        )


def die_with_parent(parent: int) -> None:
    """In a program's process before exec: SIGKILL when its holder dies (set after
    any change of uid: a credential change clears it). If the holder died before
    this, its parent is already someone else: die now."""
    _check(_LIBC.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0), "prctl")
    if os.getppid() != parent:
        os._exit(137)


def exec_path(argv0: str, env: dict[str, str]) -> str:
    """The file ``execvpe`` would run: ``argv0`` itself when it has a slash,
    otherwise the first executable file of that name on the program's PATH."""
    if "/" in argv0:
        return argv0
    last: OSError = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv0)
    for folder in os.get_exec_path(env):
        path = os.path.join(folder, argv0)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            last = PermissionError(errno.EACCES, os.strerror(errno.EACCES), argv0)
    raise last


def launch(  # noqa: PLR0917 (one caller)
    path: str, req: SpawnerRequest, out: int, err: int, stdin: int | None, fenced: bool
) -> int:
    """P, started by R once it may go: posix_spawn (vfork and exec, as subprocess
    does), so a start pays no fork of a Python process and no teardown of its
    copied memory. P's pid; raises OSError when exec fails."""
    if req.get("user") or fenced:
        return launch_as(path, req, out, err, stdin, fenced)
    first: tuple[Any, ...] = (
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
        if stdin is None
        else (os.POSIX_SPAWN_DUP2, stdin, 0)
    )
    return os.posix_spawn(
        path,
        req["argv"],
        req["env"],
        file_actions=[
            first,
            (os.POSIX_SPAWN_DUP2, out, 1),
            (os.POSIX_SPAWN_DUP2, err, 2),
        ],
        setsigmask=(),
        # caught signals are reset by exec; ignored ones (Python ignores SIGPIPE) are not
        setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, KILL_TREE),
    )


def launch_as(  # noqa: PLR0917 (one caller)
    path: str, req: SpawnerRequest, out: int, err: int, stdin: int | None, fenced: bool
) -> int:
    """P under ``[run] user``, or fenced (a cluster node's: it dies with R, by the
    kernel's hand, above): posix_spawn can neither change the uid nor set a
    parent-death signal, so R forks and the child drops to the user's uid and gid
    (no supplementary groups) and asks for SIGKILL at R's death before exec; R
    stays the daemon's. An exec that fails is reported back through a close-on-exec
    pipe, as posix_spawn reports it, and raised here."""
    user, holder = req.get("user"), os.getpid()
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # P
        try:
            os.close(report_r)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, KILL_TREE):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.dup2(os.open(os.devnull, os.O_RDONLY) if stdin is None else stdin, 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            if user:
                os.setgroups([])
                os.setgid(user[1])
                os.setuid(user[0])
            if fenced:  # after the uid: a change of credentials clears it
                die_with_parent(holder)
            os.execve(path, req["argv"], req["env"])
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.write(report_w, str(exc.errno or errno.EPERM).encode())
        finally:
            os._exit(127)
    os.close(report_w)
    try:
        failed = os.read(report_r, 16)
    finally:
        os.close(report_r)
    if failed:
        os.waitpid(pid, 0)
        code = int(failed)
        raise OSError(code, os.strerror(code))
    return pid
