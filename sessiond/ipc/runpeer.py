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

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Python 3.11 lacks the constant
SPAWNER_FILE = "sessiond/runs/spawner.py"
MARK = b"SESSIOND_RUN_MARK="
RUN_CGROUP = re.compile(rb"/sessiond-[0-9a-f]{12}-")
MAX_DEPTH = 4096  # a PPid chain is finite; this only bounds a /proc that lies
ONLY_PING = (
    "this connection may only ping: {why}. The control socket is for people "
    "(operators); a session's program talks to the daemon through the program "
    "endpoint it is given as SESSIOND_SOCKET (with its SESSIOND_TOKEN), where its "
    "spec's [run] grants say what it may call"
)


def _status(pid: int) -> tuple[int, int]:
    """PPid and real uid of ``pid`` (OSError if it cannot be read)."""
    with open(f"/proc/{pid}/status", "rb") as f:
        ppid = uid = -1
        for line in f:
            if line.startswith(b"PPid:"):
                ppid = int(line.split()[1])
            elif line.startswith(b"Uid:"):
                uid = int(line.split()[1])
    if ppid < 0 or uid < 0:
        raise OSError(f"/proc/{pid}/status has no PPid or Uid")
    return ppid, uid


def _is_spawner(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    # the spawner is started as `python -I …/sessiond/runs/spawner.py FD`; its
    # holders are its forks, with the same command line
    return any(arg.decode(errors="replace").endswith(SPAWNER_FILE) for arg in argv[1:4])


def _start_time(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 :].split()[19]


def _why_run(pid: int, run_uids: frozenset[int]) -> str | None:
    """Why ``pid`` counts as a run's process (None: it does not). OSError: it
    cannot be examined."""
    ppid, uid = _status(pid)
    if uid in run_uids:
        return f"uid {uid} is the [run] user programs run as"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except PermissionError:
        # The kernel shows a process's environment only to its own uid and root:
        # another allowed user's shell is judged by its ancestry alone.
        if os.geteuid() == 0 or uid == os.geteuid():
            raise
        environ = b""
    if environ.startswith(MARK) or b"\0" + MARK in environ:
        return "it carries SESSIOND_RUN_MARK: it is a process of a run"
    with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/cgroup", "rb") as f:
        if RUN_CGROUP.search(f.read()):  # (no such file: a kernel without cgroups)
            return "it is in a run's cgroup"
    seen = 0
    current = pid
    while current > 1 and seen < MAX_DEPTH:
        if _is_spawner(current):
            return "it descends from a sessiond spawner: it is a process of a run"
        current = ppid
        if current <= 1:
            break
        ppid, _ = _status(current)
        seen += 1
    if current > 1:
        raise OSError("the parent chain does not end")
    return None


def examine(sock: socket.socket, pid: int, run_uids: frozenset[int]) -> str | None:
    """None if the peer at ``sock`` (``pid`` as SO_PEERCRED reports it) is an
    operator; else the refusal to answer every method but ``ping`` with."""
    if pid <= 0:
        return ONLY_PING.format(
            why="its process cannot be examined (it is in another pid namespace)"
        )
    pidfd = -1
    with contextlib.suppress(OSError):
        pidfd = int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4), sys.byteorder)
    try:
        before = _start_time(pid) if pidfd < 0 else b""
        why = _why_run(pid, run_uids)
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, 0)  # ProcessLookupError: gone, pid maybe reused
        elif _start_time(pid) != before:
            raise OSError("the pid was reused while it was examined")
    except (OSError, ValueError, IndexError) as exc:
        reason = "it is gone" if isinstance(exc, ProcessLookupError | FileNotFoundError) else exc
        return ONLY_PING.format(why=f"its process cannot be examined ({reason})")
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return None if why is None else ONLY_PING.format(why=why)
