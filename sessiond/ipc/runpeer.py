"""Is the peer on the control socket a process of some run? (DESIGN.md section 8)

No process of a run is an operator: on the control socket a peer that belongs
to a run of *any* local sessiond, at any depth, gets only ``ping``. How it is
told, per connection:

- **Its ancestry.** Every run process descends from a spawner (each daemon has
  one) and its run's holder: both are child subreapers, so an orphan — a
  double fork, a ``setsid`` helper — reparents to one of them, never to PID 1.
  Walking the PPid chain from the peer up to PID 1, a process whose command
  line runs ``sessiond/runs/spawner.py`` (the spawner, and the holders forked
  from it) marks the peer as a run's.
- **Its own marks.** ``SESSIOND_RUN_MARK`` in its environment (every run process
  inherits it), and a run cgroup (``sessiond-<id>-…``) where runs have one.
- **The uid of ``[run] user``**, where one is configured: no process of it is
  an operator.

It fails closed: a peer that cannot be examined (gone, in another pid namespace
so the kernel reports pid 0, /proc unreadable) gets only ``ping`` too. The
process is pinned by a pidfd (``SO_PEERPIDFD``, Linux 6.5+) for the time of the
reading: if it is gone after, its pid may have been reused and what was read
may be another's, so it counts as not examined. Without the pidfd the start
time is compared before and after instead.

What this does not stop: a program running as the daemon's own uid can reach
the daemon by other means (ptrace it, write its log, ask systemd to start a
process outside the run). ``[run] user`` is the real boundary (README.md).
"""

from __future__ import annotations

import contextlib
import os
import re
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


def _read(pid: int, name: str) -> bytes:
    """/proc/PID/NAME, whole (plain os calls: several times cheaper than open())."""
    fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
        return data
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[int, bytes]:
    """PPid and start time of ``pid`` (/proc/PID/stat fields 4 and 22)."""
    stat = _read(pid, "stat")
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]), fields[19]


def _is_spawner(pid: int) -> bool:
    argv = _read(pid, "cmdline").split(b"\0")
    # the spawner is started as `python -I …/sessiond/runs/spawner.py FD`; its
    # holders are its forks, with the same command line
    return any(arg.endswith(SPAWNER_FILE) for arg in argv[1:4])


def _why_run(pid: int, uid: int, run_uids: Container[int]) -> tuple[str | None, bytes]:
    """Why ``pid`` (of ``uid``) counts as a run's process (None: it does not), and
    its start time. OSError: it cannot be examined."""
    if uid in run_uids:
        return f"uid {uid} is a run's uid (the [run] user, or one a session's runs get)", b""
    ppid, started = _stat(pid)
    try:
        environ = _read(pid, "environ")
    except PermissionError:
        # The kernel shows a process's environment only to its own uid and root:
        # another allowed user's shell is judged by its ancestry alone.
        if os.geteuid() == 0 or uid == os.geteuid():
            raise
        environ = b""
    if environ.startswith(MARK) or b"\0" + MARK in environ:
        return "it carries SESSIOND_RUN_MARK: it is a process of a run", started
    with contextlib.suppress(FileNotFoundError):  # a kernel without cgroups
        if RUN_CGROUP.search(_read(pid, "cgroup")):
            return "it is in a run's cgroup", started
    current, since = pid, started
    walked: list[tuple[int, bytes]] = []
    for _ in range(MAX_DEPTH):
        if (current, since) in _CLEAN:
            break
        if _is_spawner(current):
            return "it descends from a sessiond spawner: it is a process of a run", started
        walked.append((current, since))
        current = ppid
        if current <= 1:
            break
        ppid, since = _stat(current)
    else:
        raise OSError("the parent chain does not end")
    if len(_CLEAN) + len(walked) > CLEAN_KEEP:
        _CLEAN.clear()
    _CLEAN.update(walked)
    return None, started


def examine(sock: socket.socket, pid: int, uid: int, run_uids: Container[int]) -> str | None:
    """None if the peer at ``sock`` (``pid`` and ``uid`` as SO_PEERCRED reports
    them) is an operator; else the refusal to answer every method but ``ping`` with."""
    if pid <= 0:
        return ONLY_PING.format(
            why="its process cannot be examined (it is in another pid namespace)"
        )
    pidfd = -1
    with contextlib.suppress(OSError):
        pidfd = int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4), sys.byteorder)
    try:
        why, started = _why_run(pid, uid, run_uids)
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, 0)  # ProcessLookupError: gone, pid maybe reused
        elif started and _stat(pid)[1] != started:
            raise OSError("the pid was reused while it was examined")
    except (OSError, ValueError, IndexError) as exc:
        reason = "it is gone" if isinstance(exc, ProcessLookupError | FileNotFoundError) else exc
        return ONLY_PING.format(why=f"its process cannot be examined ({reason})")
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return None if why is None else ONLY_PING.format(why=why)


def examine_process(pid: int, uid: int, run_uids: Container[int]) -> str | None:
    """:func:`examine` for a process found by other means than a Unix socket's
    credentials (the web listener's TCP peers, sessiond.web.peers): why it may
    not act (it is a run's, or it cannot be examined), or None. Pinned by its
    start time: a pid reused while it was read counts as not examined."""
    try:
        why, started = _why_run(pid, uid, run_uids)
        if started and _stat(pid)[1] != started:
            raise OSError("the pid was reused while it was examined")
    except (OSError, ValueError, IndexError) as exc:
        reason = "it is gone" if isinstance(exc, ProcessLookupError | FileNotFoundError) else exc
        return f"its process cannot be examined ({reason})"
    return why
