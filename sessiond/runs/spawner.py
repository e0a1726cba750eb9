"""The spawner: one small process per daemon that starts and reaps every run.

Started by the daemon (``python -I -m sessiond.runs.spawner FD``) and talking to
it over a ``SOCK_SEQPACKET`` socketpair (one JSON message a packet; a spawn's
output pipes come with it as SCM_RIGHTS). Standard library only, so it starts in
a few milliseconds, and single-threaded, so that ``fork`` is safe here (it is
not in the threaded daemon, which is why nothing there uses ``preexec_fn``).

Why a process of its own (docs/design.md section 9, "nothing outlives its run"):

- It is the runs' child subreaper (``PR_SET_CHILD_SUBREAPER``): a run's
  orphans reparent to it, never to PID 1.
- When the daemon's end of the socket closes — the daemon exited, or was killed
  with SIGKILL — it kills its whole subtree and exits, so even a daemon that
  never restarts leaves nothing running.
- Each run gets a holder R (forked here ahead of its request, so a start
  pays no fork; ``setsid``, itself a subreaper). R takes the request (and joins
  the run's cgroups, when it has them), then waits, holding the run, until the
  daemon has recorded ``run.started`` with R's pid and says go: one byte on a
  pipe the daemon made and passed on with the request (so go costs no round
  trip through here). Only then does R start the program P, with ``posix_spawn``
  (vfork and exec: no copy of a Python process to fork and tear down). A
  daemon that dies before go leaves nothing that ever ran: R sees its go pipe
  close and exits.
- When P exits, R kills whatever is left of its subtree (double-forked and
  ``setsid`` processes included: they reparented to R), reaps it, and ends with
  P's wait status mirrored, so the status the spawner reports is P's own.

Messages, daemon → spawner: ``spawn`` (id, argv, cwd, env, optional
``cgroup_procs``: the run's cgroups' ``cgroup.procs`` files, optional
``holder``: the pid of the holder it was told of, which must take it; optional
``sandboxed``: argv is bubblewrap's, whose 128+N exit is mirrored as signal N; fds:
stdout, stderr, the go pipe's read end: the daemon keeps the write end, and
optionally the program's stdin: without it P reads /dev/null),
``term`` (id: SIGTERM to the run's subtree), ``kill`` (id: SIGKILL to it),
``fence`` (at: a ``time.monotonic()`` deadline; past it the spawner kills
everything and exits on its own: a cluster node's programs stop before its
lease can lapse, even when the daemon is paused or cut off; each holder's kernel
timer kills its program at it even when the whole node is stopped: holder.py).
Spawner → daemon: ``idle`` (pid and start of the holder the next spawn will
take, or None), ``spawned`` (id, pid, start) or ``refused`` (id, error), then
``exited`` (id, status: R's raw wait status, which is P's).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only: the spawner runs as a script of its own (-I), importing nothing
    from sessiond.runs import holder
    from sessiond.runs.spawnproto import SpawnerReply, SpawnerRequest
else:  # but its sibling, by its path: run with -I, it has no package to import from
    _HOLDER = importlib.util.spec_from_file_location(
        "sessiond_holder", os.path.join(os.path.dirname(os.path.abspath(__file__)), "holder.py")
    )
    assert _HOLDER is not None
    assert _HOLDER.loader is not None
    holder = importlib.util.module_from_spec(_HOLDER)
    _HOLDER.loader.exec_module(holder)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PACKET = 1 << 21  # a spawn request: argv and env (SESSIOND_WAKE alone may be 32 KiB)
# R's signals: SIGTERM forwards a stop to the subtree; SIGUSR1 kills it (the
# daemon's "kill", and the spawner's death, through PR_SET_PDEATHSIG).
KILL_TREE = holder.KILL_TREE
PREFORK_AFTER = 0.05  # seconds of quiet before the next run's holder is forked


LIBC = ctypes.CDLL(None, use_errno=True)  # loaded once; every fork inherits it


def prctl(option: int, value: int) -> None:
    if LIBC.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's: a thread may fork too)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return found


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # gone
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


def descendants(root: int) -> list[int]:
    """Every live process under ``root`` (not ``root`` itself), by the children links."""
    found: list[int] = []
    todo = children(root)
    while todo:
        pid = todo.pop()
        todo += children(pid)
        if not _zombie(pid):
            found.append(pid)
    return found


def signal_tree(root: int, sig: int, skip: int | None = None) -> int:
    """Send ``sig`` to every live descendant of ``root`` but ``skip``; how many
    there were."""
    pids = [p for p in descendants(root) if p != skip]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return len(pids)


def kill_tree_and_reap() -> None:
    """SIGKILL everything under this process and reap it, until nothing is left.

    A process may fork while it is killed: the pass repeats until a walk finds
    no live descendant. Everything that dies under a subreaper ends up its
    child (orphans reparent to it), so reaping until ECHILD reaps it all."""
    me = os.getpid()
    while signal_tree(me, signal.SIGKILL):
        try:
            os.waitpid(-1, 0)  # one death at least; the walk looks again
        except ChildProcessError:
            break
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def mirror(status: int) -> None:
    """End this process with the same wait status as ``status``. Never returns."""
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # P's core dump, if any, was P's
    signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def _idle(sock: socket.socket, spawner: int, deadline: holder.Deadline) -> None:
    """R, forked ahead of its request (so that a start pays no fork and no /proc
    read of a process being forked): a session leader and subreaper, waiting for
    the one spawn it will hold. Never returns."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.setsid()
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        data, fds, _, _ = socket.recv_fds(sock, PACKET, 8)
    except OSError:
        os._exit(126)
    if not data or len(fds) not in (3, 4):  # the spawner is gone: nothing to hold
        os._exit(0)
    req = json.loads(data)
    out, err, go = fds[:3]  # and P's stdin, if given (else P reads /dev/null)
    for fd in fds:  # received fds are inheritable: only the dup2'd copies reach P
        os.set_inheritable(fd, False)
    joined = _join_cgroups(req.get("cgroup_procs") or [])
    if joined is not None:
        with contextlib.suppress(OSError):
            sock.send(joined.encode())
        os._exit(126)
    if req.get("cgroup_procs"):
        with contextlib.suppress(OSError):
            sock.send(b"ok")
    sock.close()
    # Held: the program does not exist until go. Everything it needs is made
    # ready now (the daemon meanwhile records run.started), so that go costs a
    # posix_spawn alone. A stop meanwhile ends R, and nothing of the run ever
    # ran: SIGTERM as SIGTERM, KILL_TREE (a kill, or the spawner's death) as a
    # SIGKILL would; the daemon's death closes the go pipe.
    flags, wake_r = _arm()
    prctl(PR_SET_PDEATHSIG, KILL_TREE)
    if os.getppid() != spawner:
        os._exit(0)  # the spawner died before the line above
    path: str | None = None
    timer = holder.KillTimer(deadline)  # a cluster node's: SIGKILL to R at its deadline
    try:
        os.chdir(req["cwd"])  # R's own cwd: P starts there (posix_spawn has no chdir here)
        path = holder.exec_path(req["argv"][0], req["env"])
    except OSError as exc:  # the daemon checked before: a late change, said at go
        failed: OSError | None = exc
    else:
        failed = None
    if not _wait_go(go, flags, wake_r, timer):
        os._exit(0)  # the daemon died (or abandoned the start) before go
    try:
        if failed is not None or path is None:
            raise failed or OSError(errno.ENOENT, "no program")
        program = holder.launch(
            path, req, out, err, fds[3] if len(fds) == 4 else None, timer.fenced
        )
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        with contextlib.suppress(OSError):
            os.write(err, f"sessiond: could not start {req['argv'][0]!r}: {why}\n".encode())
        os._exit(127)
    # R holds no pipe of the run: the output reaches EOF once the subtree is gone.
    for fd in fds[:2] + fds[3:]:
        os.close(fd)
    _supervise(program, flags, wake_r, bool(req.get("sandboxed")), timer)


def _wait_go(go: int, flags: dict[str, bool], wake_r: int, timer: holder.KillTimer) -> bool:
    """R, held: True once the daemon says go; False if its pipe closes first. A
    stop while held ends R here, with the status a stopped program would have."""
    while True:
        timer.rearm()
        if flags["kill"]:
            mirror(signal.SIGKILL)
        if flags["term"]:
            mirror(signal.SIGTERM)
        try:
            ready, _, _ = select.select([go, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 64)
        if go in ready:
            word = os.read(go, 1)
            os.close(go)
            return word == b"g"


def _join_cgroups(files: list[str]) -> str | None:
    """R joins the run's cgroups (each hierarchy's ``cgroup.procs``) before P exists:
    everything P starts is born there. None, or why it could not."""
    for name in files:
        try:
            with open(name, "w") as f:
                f.write("0")
        except OSError as exc:
            return f"cannot join the run's cgroup ({exc.strerror or exc}): {name}"
    return None


def _arm() -> tuple[dict[str, bool], int]:
    """R's signals once the program may run: SIGTERM is forwarded to the subtree,
    KILL_TREE kills it, SIGCHLD wakes the loop."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    flags = {"term": False, "kill": False}

    def on_signal(sig: int, _frame: object) -> None:
        if sig == signal.SIGTERM:
            flags["term"] = True
        elif sig == KILL_TREE:
            flags["kill"] = True

    for sig in (signal.SIGTERM, KILL_TREE, signal.SIGCHLD):
        signal.signal(sig, on_signal)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.set_wakeup_fd(wake_w)
    return flags, wake_r


def _unwrap(status: int) -> int:
    """P is bubblewrap: it exits with 128+N when its program died of signal N; the
    status a bare program would have had (the daemon tells a kill from a failure)."""
    if os.WIFEXITED(status) and 128 < os.WEXITSTATUS(status) <= 128 + 64:
        return os.WEXITSTATUS(status) - 128  # a raw wait status "killed by signal N"
    return status


def _supervise(
    program: int, flags: dict[str, bool], wake_r: int, sandboxed: bool, timer: holder.KillTimer
) -> None:
    """R's loop: forward a stop, kill all on request or once P is gone; keep the
    timer at the node's deadline (woken by FENCE_SIG). Never returns."""
    status: int | None = None
    while True:
        timer.rearm()
        while status is None:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                status = signal.SIGKILL  # cannot happen (P is our child): as killed
                break
            if pid == 0:
                break
            if pid == program:
                status = _unwrap(st) if sandboxed else st
        if status is not None or flags["kill"]:
            kill_tree_and_reap()
            # killed on request before P's end was seen: a raw status 9, SIGKILL
            mirror(status if status is not None else signal.SIGKILL)
        if flags["term"]:
            flags["term"] = False
            # Not bubblewrap itself: it would die of it, and its sandbox with it,
            # before the program could finish what it is doing (it ends with it).
            signal_tree(os.getpid(), signal.SIGTERM, skip=program if sandboxed else None)
        with contextlib.suppress(InterruptedError, BlockingIOError):
            select.select([wake_r], [], [])
            os.read(wake_r, 64)


class SpawnerLoop:
    """The spawner's loop: requests from the daemon, exits of the holders."""

    def __init__(self, chan: socket.socket) -> None:
        self.chan = chan
        self.runs: dict[int, int] = {}  # id → R's pid
        self.by_pid: dict[int, int] = {}
        self.pid = os.getpid()
        self.idle: tuple[int, int | None, socket.socket] | None = None  # pid, start, socket
        self.fence: float | None = None  # the "fence" deadline (CLOCK_BOOTTIME)
        self.deadline = holder.Deadline()  # the same, shared with every holder

    def send(self, message: SpawnerReply, fds: tuple[int, ...] = ()) -> None:
        # the daemon gone: its end closing is seen by the loop
        with contextlib.suppress(OSError):
            socket.send_fds(self.chan, [json.dumps(message).encode()], list(fds))

    def prefork(self) -> None:
        """The next run's holder, ready before its request."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                self.chan.close()
                ours.close()
                if self.idle is not None:
                    self.idle[2].close()
                _idle(theirs, self.pid, self.deadline)
            finally:
                os._exit(126)
        theirs.close()
        self.idle = (pid, start_time(pid), ours)
        # Told ahead: the daemon records run.started with this pid while the
        # request that takes it is on its way (the start's one fsync and its
        # round trip here overlap).
        self.send({"op": "idle", "pid": pid, "start": self.idle[1]})

    def spawn(self, req: SpawnerRequest, fds: list[int]) -> None:
        rid = req["id"]
        if len(fds) not in (3, 4):
            for fd in fds:
                os.close(fd)
            error = "a spawn needs three fds (stdout, stderr, go) and optionally stdin"
            self.send({"op": "refused", "id": rid, "error": error})
            return
        want = req.get("holder")
        if want is not None and (self.idle is None or self.idle[0] != want):
            for fd in fds:
                os.close(fd)
            error = f"the holder {want} the daemon was told of is gone (killed by hand?)"
            self.send({"op": "refused", "id": rid, "error": error})
            return
        if self.idle is None:
            self.prefork()
        assert self.idle is not None
        pid, start, sock = self.idle
        self.idle = None
        try:
            socket.send_fds(sock, [json.dumps(req).encode()], fds)
            answer = sock.recv(4096) if req.get("cgroup_procs") else b"ok"
        except OSError as exc:
            answer = f"the holder is gone ({exc})".encode()
        for fd in fds:
            os.close(fd)
        sock.close()
        if answer != b"ok":
            self.send({"op": "refused", "id": rid, "error": answer.decode(errors="replace")})
            return  # R exits; its reap is an unknown pid's
        self.runs[rid] = pid
        self.by_pid[pid] = rid
        self.send({"op": "spawned", "id": rid, "pid": pid, "start": start})

    def handle(self, req: SpawnerRequest, fds: list[int]) -> None:
        op = req.get("op")
        if op == "spawn":
            self.spawn(req, fds)
            return
        if op == "fence" and isinstance(req.get("at"), int | float):
            self.fence = holder.boottime_of(float(req["at"]))
            self.deadline.set(self.fence)
            for held in self.runs.values():  # each moves its kernel timer on
                with contextlib.suppress(ProcessLookupError):
                    os.kill(held, holder.FENCE_SIG)
        for fd in fds:
            os.close(fd)
        pid = self.runs.get(req.get("id", -1))
        if pid is None:  # already exited: its "exited" is on the way
            return
        if op in ("term", "kill"):
            # R is not reaped until its exit is read here, on this one thread: its
            # pid cannot have been reused.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM if op == "term" else KILL_TREE)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.by_pid.pop(pid, None)
            if rid is None:
                if self.idle is not None and pid == self.idle[0]:  # killed by hand
                    self.idle[2].close()
                    self.idle = None
                    self.send({"op": "idle", "pid": None, "start": None})
                continue  # or an orphan of a holder that was killed, reaped
            self.runs.pop(rid)
            # A holder killed from outside left its subtree to us: it goes too.
            holders = set(self.by_pid) | ({self.idle[0]} if self.idle else set())
            for child in children(os.getpid()):
                if child not in holders and not _zombie(child):
                    signal_tree(child, signal.SIGKILL)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGKILL)
            self.send({"op": "exited", "id": rid, "status": status})

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # inherited by every holder, before it could be sent one: it only wakes R
        signal.signal(holder.FENCE_SIG, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        self.prefork()
        while True:
            # The next holder is forked once the loop is quiet: not in the way of
            # the start that just took one (its program is being forked and let go).
            quiet = PREFORK_AFTER if self.idle is None else None
            if self.fence is not None:
                # CLOCK_BOOTTIME: a machine that was suspended finds its lease gone
                left = self.fence - time.clock_gettime(time.CLOCK_BOOTTIME)
                if left <= 0:
                    return  # main() kills the whole subtree on the way out
                quiet = left if quiet is None else min(quiet, left)
            try:
                ready, _, _ = select.select([self.chan.fileno(), wake_r], [], [], quiet)
            except InterruptedError:
                continue
            if not ready:
                self.prefork()
                continue
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                self.reap()
            if self.chan.fileno() in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(self.chan, PACKET, 8)
                except InterruptedError:
                    continue
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EINTR):
                        continue
                    data, fds = b"", []
                if not data:
                    return  # the daemon's end closed
                try:
                    req = json.loads(data)
                except ValueError:
                    for fd in fds:
                        os.close(fd)
                    continue
                self.handle(req, fds)


def start_time(pid: int) -> int | None:
    """/proc/PID/stat field 22: tells this process from a later one with its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def main(argv: list[str]) -> int:
    chan = socket.socket(fileno=int(argv[1]))
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    # A ^C at a terminal reaches the whole foreground group: the daemon decides
    # what stops; this process follows its socket. SIGTERM stops everything.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def stop(_sig: int, _frame: object) -> None:
        kill_tree_and_reap()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        SpawnerLoop(chan).serve()
    finally:
        kill_tree_and_reap()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
