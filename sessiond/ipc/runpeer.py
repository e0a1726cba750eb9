"""Is the peer on the control socket an operator? (docs/design.md section 8)

No process of a run is an operator: on the control socket a peer that belongs
to a run of *any* local sessiond, at any depth, gets only ``ping``, and so does
a peer that cannot be proven an operator. The process that connected is
examined in full at the connection's first request that needs it (below), and
at every later request only asked whether it is still that same live process
(see :class:`Examiner` for why that is as safe as a full examination each time).
How it is told:

- **The uid of a run.** ``[run] user`` and the dynamic uids runs are given
  (sessiond.ipc.peers): no process of them is an operator.
- **Its namespaces.** A process in another pid namespace than the daemon's (a
  sandboxed run's; the kernel's ``NSpid`` has more levels), or in another user
  namespace (its ``uid_map`` differs), is no operator.
- **Its ancestry.** Every run process descends from a spawner (each daemon has
  one) and its run's holder: both are child subreapers, so an orphan — a
  double fork, a ``setsid`` helper — reparents to one of them, never to PID 1.
  The daemon is a subreaper too (sessiond.runs.subreaper): a process left by a
  run that killed its holder and spawner reparents to the daemon. Walking the
  PPid chain from the peer up to PID 1, a process whose command line runs
  ``sessiond/runs/spawner.py`` (the spawner, and the holders forked from it),
  or this daemon itself, marks the peer as a run's.
- **Its own marks.** ``SESSIOND_RUN_MARK`` in its environment (every run process
  inherits it), and a run cgroup (``sessiond-<id>-…``) where runs have one.

It fails closed: a peer that cannot be examined (gone, exited and not yet
reaped, in another pid namespace so the kernel reports pid 0, /proc
unreadable) gets only ``ping`` too, with the reason. The process that connected
is pinned for the connection's life by a pidfd (``SO_PEERPIDFD``, Linux 6.5+)
and its start time: if it is gone when a request comes, the request is refused,
and if it goes while it is read, what was read may be another's, so it counts
as not examined. A connection refused once stays refused.

What this does not prove: a run that shares the operator's uid, with the
sandbox off and no run cgroup, can reach the daemon by other means (ptrace it,
ask a service manager to start a process outside its tree, kill the daemon too
so that what it left is outside every tree after the restart). The sandbox (its
pid namespace and a uid of the run's own) or ``[run] user`` is the boundary
there (README.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import select
import signal
import socket
import sys
from collections.abc import Container

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Python 3.11 lacks the constant
SPAWNER_FILE = b"sessiond/runs/spawner.py"
MARK = b"SESSIOND_RUN_MARK="
RUN_CGROUP = re.compile(rb"/sessiond-[0-9a-f]{12}-")
MAX_DEPTH = 4096  # a PPid chain is finite; this only bounds a /proc that lies
# Processes (pid, start time) whose whole parent chain has no spawner. That
# cannot change while they live: an orphan reparents to a subreaper among its
# ancestors, or to PID 1, and no process gains a spawner above it. So a walk
# stops at the first one (an operator's shell, say): a few /proc reads a
# connection instead of two per ancestor.
_CLEAN: set[tuple[int, bytes]] = set()
CLEAN_KEEP = 4096
ONLY_PING = (
    "this connection may only ping: {why}. The control socket is for people "
    "(operators); a session's program talks to the daemon through the program "
    "endpoint it is given as SESSIOND_SOCKET (with its SESSIOND_TOKEN), where its "
    "spec's [run] grants say what it may call"
)


def _read(pid: int | str, name: str) -> bytes:
    """/proc/PID/NAME, whole (plain os calls: several times cheaper than open())."""
    fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
        return data
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[bytes, int, bytes]:
    """State, PPid and start time of ``pid`` (/proc/PID/stat fields 3, 4 and 22)."""
    stat = _read(pid, "stat")
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0], int(fields[1]), fields[19]


def _ns_levels(status: bytes) -> int:
    """How many pid namespaces deep a process is, seen from this /proc (its NSpid)."""
    for line in status.split(b"\n"):
        if line.startswith(b"NSpid:"):
            return len(line.split()) - 1
    return 1  # a kernel without NSpid (before 4.1): one level is all it shows


@functools.cache
def _own_namespaces() -> tuple[int, bytes]:
    """The daemon's own pid namespace depth and user namespace map."""
    return _ns_levels(_read("self", "status")), _read("self", "uid_map")


def _other_namespace(pid: int) -> str | None:
    """Why ``pid`` is in other namespaces than the daemon, or None. Read from
    files any uid may read (``/proc/PID/ns/*`` would need ptrace rights)."""
    levels, uid_map = _own_namespaces()
    if _ns_levels(_read(pid, "status")) != levels:
        return "it runs in another pid namespace than the daemon's (as a sandboxed run does)"
    if _read(pid, "uid_map") != uid_map:
        return "it runs in another user namespace than the daemon's (as a sandboxed run does)"
    return None


def _is_spawner(pid: int) -> bool:
    argv = _read(pid, "cmdline").split(b"\0")
    # the spawner is started as `python -I …/sessiond/runs/spawner.py FD`; its
    # holders are its forks, with the same command line
    return any(arg.endswith(SPAWNER_FILE) for arg in argv[1:4])


def _mark(environ: bytes) -> str | None:
    """The run a SESSIOND_RUN_MARK names ("run R of session 'S'"), if it carries one."""
    for item in environ.split(b"\0"):
        if item.startswith(MARK):
            value = item[len(MARK) :].decode(errors="replace")
            _daemon, _, rest = value.partition(":")
            session, _, run = rest.rpartition(":")
            return f"a run (run {run} of session {session!r})" if session and run else "a run"
    return None


def _environ(pid: int, uid: int) -> bytes:
    try:
        return _read(pid, "environ")
    except PermissionError:
        # The kernel shows a process's environment only to its own uid and root:
        # another allowed user's shell is judged by its ancestry alone.
        if os.geteuid() == 0 or uid == os.geteuid():
            raise
        return b""


def _why_run(pid: int, uid: int, run_uids: Container[int]) -> tuple[str | None, bytes]:
    """Why ``pid`` (of ``uid``) is no operator (None: nothing says so), and its
    start time. OSError: it cannot be examined (ProcessLookupError: it is gone)."""
    if uid in run_uids:
        return f"uid {uid} is a run's uid (the [run] user, or one a session's runs get)", b""
    state, ppid, started = _stat(pid)
    if state in (b"Z", b"X"):
        raise ProcessLookupError("it has exited")
    other = _other_namespace(pid)
    if other is not None:
        return other, started
    run = _mark(_environ(pid, uid))
    if run is not None:
        return f"it is a process of {run}: it carries SESSIOND_RUN_MARK", started
    with contextlib.suppress(FileNotFoundError):  # a kernel without cgroups
        if RUN_CGROUP.search(_read(pid, "cgroup")):
            return "it is in a run's cgroup: it is a process of a run", started
    current, since = pid, started
    walked: list[tuple[int, bytes]] = []
    for _ in range(MAX_DEPTH):
        if walked and current == os.getpid():
            # started by this daemon for a session, or left by a run whose holder
            # and spawner died (the daemon is their subreaper: sessiond.runs.subreaper)
            return "it descends from the sessiond daemon itself: it is a process of a run", started
        if (current, since) in _CLEAN:
            break
        if _is_spawner(current):
            return f"it descends from a sessiond spawner: {_which(walked, uid)}", started
        walked.append((current, since))
        current = ppid
        if current <= 1:
            break
        _, ppid, since = _stat(current)
    else:
        raise OSError("the parent chain does not end")
    if len(_CLEAN) + len(walked) > CLEAN_KEEP:
        _CLEAN.clear()
    _CLEAN.update(walked)
    return None, started


def _which(walked: list[tuple[int, bytes]], uid: int) -> str:
    """The run whose holder is the top of ``walked``: named by the nearest mark."""
    for pid, _ in reversed(walked):
        with contextlib.suppress(OSError):
            run = _mark(_environ(pid, uid))
            if run is not None:
                return f"it is a process of {run}"
    return "it is a process of a run"


def _gone(exc: BaseException) -> str:
    if isinstance(exc, ProcessLookupError | FileNotFoundError):
        reason = "it has exited" if str(exc) == "it has exited" else "it is gone"
    else:
        reason = str(exc)
    return f"its process cannot be examined ({reason})"


class Examiner:
    """The peer of one control connection: examined in full once, then, at each
    request, asked only whether the process that connected still lives.

    Pinned to the process that connected: its pidfd (``SO_PEERPIDFD``) where the
    kernel gives one, and its start time as read at accept. A request that comes
    when that process is gone (exited, a zombie not yet reaped, or its pid now
    another's) is refused, and so is every later one: a request written by a
    process that then exits, or handed on with the socket, never acts on the word
    of a process no longer there.

    Why one full examination a connection is enough: what it reads can change
    while the process lives only by the process's own doing or a privileged
    one's, never by a run's. SO_PEERCRED's pid and uid are fixed at connect; the
    ancestry of a live process gains no spawner (an orphan reparents to a
    subreaper above it, or PID 1: see ``_CLEAN``); its environment, namespaces
    and uid change only if it execs, unshares or setuids itself, and its cgroup
    only if root moves it. A process proven an operator's that then does any of
    that does it with an operator's rights it already had, as it could hand its
    socket on: the connection speaks for the process that connected, for as long
    as it lives. A run's process, or one that could not be examined, is refused
    for the connection's life, whatever it does next. The pidfd is what makes the
    per-request question cheap and exact: it names the process, not its pid, so
    a reused pid cannot pass for it."""

    def __init__(self, sock: socket.socket, pid: int, uid: int, run_uids: Container[int]) -> None:
        self.pid, self.uid, self.run_uids = pid, uid, run_uids
        self.pidfd = -1
        self.started: bytes | None = None
        self.refused: str | None = None
        self.judged = False  # examined in full and found an operator's
        self.said = False  # the refusal was logged
        # readable once the pidfd's process has exited (a zombie included)
        self._exit: select.poll | None = None
        if pid <= 0:
            self.refused = ONLY_PING.format(
                why="its process cannot be examined (it is in another pid namespace)"
            )
            return
        with contextlib.suppress(OSError):
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4)
            self.pidfd = int.from_bytes(raw, sys.byteorder)
        try:
            self.started = _stat(pid)[2]
        except (OSError, ValueError, IndexError) as exc:
            self.refused = ONLY_PING.format(why=_gone(exc))
            return
        try:
            if self.pidfd >= 0:
                signal.pidfd_send_signal(self.pidfd, 0)  # the pid is still the peer's
                self._exit = select.poll()
                self._exit.register(self.pidfd, select.POLLIN)
        except OSError as exc:
            self.refused = ONLY_PING.format(why=_gone(exc))

    def refusal(self) -> str | None:
        """None if the peer is an operator now; else the refusal (kept: once
        refused, the connection stays refused)."""
        if self.refused is None:
            why = self._alive() if self.judged else self._examine()
            self.judged = why is None
            self.refused = None if why is None else ONLY_PING.format(why=why)
        return self.refused

    def _examine(self) -> str | None:
        try:
            why, started = _why_run(self.pid, self.uid, self.run_uids)
            if started and started != self.started:
                raise ProcessLookupError("the pid is another process's now")
            if self.pidfd >= 0:
                signal.pidfd_send_signal(self.pidfd, 0)  # ProcessLookupError: gone
            elif started and _stat(self.pid)[2] != started:
                raise OSError("the pid was reused while it was examined")
        except (OSError, ValueError, IndexError) as exc:
            return _gone(exc)
        return why

    def _alive(self) -> str | None:
        """None if the process examined is still there and running; else why not.
        One poll of its pidfd; without one, one read of its /proc stat."""
        try:
            if self._exit is not None:
                if self._exit.poll(0):
                    # reaped (gone) or a zombie (exited): the pidfd tells which
                    signal.pidfd_send_signal(self.pidfd, 0)
                    raise ProcessLookupError("it has exited")
                return None
            state, _, started = _stat(self.pid)
            if state in (b"Z", b"X"):
                raise ProcessLookupError("it has exited")
            if started != self.started:
                raise ProcessLookupError("the pid is another process's now")
        except (OSError, ValueError, IndexError) as exc:
            return _gone(exc)
        return None

    def close(self) -> None:
        if self.pidfd >= 0:
            if self._exit is not None:
                self._exit.unregister(self.pidfd)
                self._exit = None
            os.close(self.pidfd)
            self.pidfd = -1


def examine(sock: socket.socket, pid: int, uid: int, run_uids: Container[int]) -> str | None:
    """None if the peer at ``sock`` (``pid`` and ``uid`` as SO_PEERCRED reports
    them) is an operator now; else the refusal to answer every method but
    ``ping`` with (:class:`Examiner`, once)."""
    examiner = Examiner(sock, pid, uid, run_uids)
    try:
        return examiner.refusal()
    finally:
        examiner.close()


def examine_process(pid: int, uid: int, run_uids: Container[int]) -> str | None:
    """:func:`examine` for a process found by other means than a Unix socket's
    credentials (the web listener's TCP peers, sessiond.web.peers): why it may
    not act (it is a run's, or it cannot be examined), or None. Pinned by its
    start time: a pid reused while it was read counts as not examined."""
    try:
        why, started = _why_run(pid, uid, run_uids)
        if started and _stat(pid)[2] != started:
            raise OSError("the pid was reused while it was examined")
    except (OSError, ValueError, IndexError) as exc:
        return _gone(exc)
    return why
