"""The daemon's side of the spawner (sessiond/runs/spawner.py, a process of its own).

``SpawnerClient`` starts that process on first use (or at the daemon's start-up),
sends it spawn / term / kill requests over a ``SOCK_SEQPACKET``
socketpair, and turns its answers into futures: ``spawn`` returns a ``Held``
run (the holder's pid and start time, the program not yet exec'd) and
``Held.exited`` becomes the program's wait status once the holder is gone —
which is when the program *and every process it left* are gone.

A start costs one round trip here and one fsync (``run.started``), and they
overlap: the spawner tells the next holder's pid ahead (``idle``), ``send``
names that holder in the request, and the caller records the pid while the
request is on its way. The go pipe is made here and its read end passed on,
so going needs no answer either.

Closing the socket (``close`` at shutdown; the kernel does it when the daemon
dies) makes the spawner kill everything it started and exit.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson
import structlog

from sessiond.runs.spawnproto import SpawnerReply, SpawnerRequest

log = structlog.get_logger(__name__)

SPAWNER = Path(__file__).with_name("spawner.py")
SEND_BUFFER = 4 << 20  # one spawn request is one packet: argv and env in full
SEND_WAIT = 10.0  # seconds a request may wait for room in the socket
LOST = signal.SIGKILL  # the wait status of a run whose spawner died: killed


class SpawnerGone(OSError):
    """The spawner process is not there (it died, or the daemon is stopping)."""


@dataclass
class Request:
    """A spawn asked for and not answered yet (``SpawnerClient.send``)."""

    rid: int
    reply: asyncio.Future[Held] = field(repr=False)
    holder: tuple[int, int | None] | None  # the holder's pid and start, when told ahead


@dataclass
class Held:
    """A spawned run: its holder R is alive, its program is held until ``go``."""

    rid: int
    pid: int  # R's: the run's leader and process group
    start: int | None  # R's start time (clock ticks since boot, /proc/PID/stat)
    exited: asyncio.Future[int] = field(repr=False)  # raw wait status of the program
    go_fd: int | None = None  # the held program's go pipe: one byte lets it exec

    def drop_go(self) -> None:
        """Never going: the held program sees its pipe close and exits unexec'd."""
        fd, self.go_fd = self.go_fd, None
        if fd is not None:
            os.close(fd)


class SpawnerClient:
    """The channel to the spawner process; one per daemon, started on first use."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._next = 1
        self._pending: dict[int, asyncio.Future[Held]] = {}
        self._runs: dict[int, Held] = {}
        self._abandoned: set[int] = set()
        self._go: dict[int, int] = {}  # go pipes of the spawns not answered yet
        self._unbound: set[int] = set()  # spawns sent naming no holder, not answered yet
        # the holder the next spawn will take, as the spawner told (pid, start)
        self.idle: tuple[int, int | None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start the spawner process (the caller runs in the daemon's event loop)."""
        if self.sock is not None:
            return
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(OSError):
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        try:
            # -I: no user site, no PYTHONPATH, no current folder: the file alone, as is.
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(SPAWNER), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                cwd="/",
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        # Non-blocking, whatever the loop does to it (libuv makes a watched fd so):
        # reads never wait, and a full send buffer is waited out in _send.
        ours.setblocking(False)
        self.sock = ours
        self._loop = loop
        loop.add_reader(ours.fileno(), self._readable)
        log.info("spawner.started", pid=self.proc.pid)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.sock is not None else None

    def _send(self, message: SpawnerRequest, fds: list[int] | None = None) -> None:
        if self.sock is None:
            raise SpawnerGone(errno.EPIPE, "the spawner is not running")
        try:
            data = orjson.dumps(message)
        except TypeError:  # a str orjson refuses (a lone surrogate from the environment)
            data = json.dumps(message).encode()
        try:
            self._sendmsg(self.sock, data, fds or [])
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                raise OSError(
                    errno.E2BIG,
                    f"the program's arguments and environment are too large ({len(data)} bytes)",
                ) from None
            self._lost()
            raise SpawnerGone(errno.EPIPE, f"the spawner is gone ({exc})") from None

    @staticmethod
    def _sendmsg(sock: socket.socket, data: bytes, fds: list[int]) -> None:
        """One packet. The spawner reads at once; a full buffer (a burst of starts)
        is waited out, bounded, rather than taken for a dead spawner."""
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        deadline = time.monotonic() + SEND_WAIT
        while True:
            try:
                sock.sendmsg([data], ancillary)
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OSError(errno.ETIMEDOUT, "the spawner does not read") from None
                select.select([], [sock], [], left)

    async def spawn(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        stdout: int,
        stderr: int,
        cgroup_procs: list[str] | None = None,
        user: tuple[int, int] | None = None,
        sandboxed: bool = False,
    ) -> Held:
        """A held run of ``argv`` (``send`` and ``answer`` in one)."""
        request = self.send(
            argv,
            cwd=cwd,
            env=env,
            stdout=stdout,
            stderr=stderr,
            cgroup_procs=cgroup_procs,
            user=user,
            sandboxed=sandboxed,
        )
        return await self.answer(request)

    def send(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        stdout: int,
        stderr: int,
        cgroup_procs: list[str] | None = None,
        user: tuple[int, int] | None = None,
        stdin: int | None = None,
        sandboxed: bool = False,
    ) -> Request:
        """Ask for a held run of ``argv``; ``answer`` awaits it. ``cgroup_procs``:
        the run's cgroups' ``cgroup.procs`` files (one per hierarchy), which the
        holder joins before its program exists (sessiond.runs.cgroups).

        ``Request.holder`` is the holder's pid and start time when the spawner
        told them ahead (it must use that holder, or refuse): the caller may
        record them while the request is on its way. ``sandboxed``: ``argv`` starts
        bubblewrap, which ends with 128+N when its program was killed by signal N."""
        self.start()
        assert self._loop is not None
        rid = self._next
        self._next += 1
        reply: asyncio.Future[Held] = self._loop.create_future()
        request: SpawnerRequest = {"op": "spawn", "id": rid, "argv": argv, "cwd": cwd, "env": env}
        if cgroup_procs:
            request["cgroup_procs"] = cgroup_procs
        if user is not None:  # the program's uid and gid ([run] user)
            request["user"] = list(user)
        if sandboxed:  # argv is bubblewrap's (runs/sandbox.py): its exit is the program's
            request["sandboxed"] = True
        holder, self.idle = self.idle, None
        if holder is not None:
            request["holder"] = holder[0]
        else:
            self._unbound.add(rid)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        self._pending[rid] = reply
        try:
            fds = [stdout, stderr, go_r] + ([] if stdin is None else [stdin])
            self._send(request, fds)
        except BaseException:
            self._pending.pop(rid, None)
            os.close(go_w)
            raise
        finally:
            os.close(go_r)  # the holder's now: its pipe closes when we close go_w
        self._go[rid] = go_w
        return Request(rid, reply, holder)

    async def answer(self, request: Request) -> Held:
        """The held run ``send`` asked for. OSError: refused (the error says why)."""
        try:
            return await request.reply
        except asyncio.CancelledError:
            # Cancelled before the answer (the daemon is stopping): whatever was
            # spawned never goes and is stopped once it answers, never left held.
            rid, reply = request.rid, request.reply
            if self._pending.pop(rid, None) is not None:
                self._abandoned.add(rid)
                self._drop_go(rid)
            elif reply.done() and not reply.cancelled() and reply.exception() is None:
                reply.result().drop_go()
                self.kill(reply.result())
            raise

    def _drop_go(self, rid: int) -> None:
        fd = self._go.pop(rid, None)
        if fd is not None:
            os.close(fd)

    def go(self, held: Held) -> None:
        """Let the held program exec (once ``run.started`` is durable): one byte
        on its go pipe, straight from here."""
        fd = held.go_fd
        if fd is None:
            return
        with contextlib.suppress(OSError):  # gone already (stopped while held)
            os.write(fd, b"g")
        held.drop_go()

    def fence(self, at: float) -> None:
        """A cluster node's programs may run until ``at`` (``time.monotonic()``,
        the machine's clock, shared with the spawner): past it, the spawner kills
        every run and exits by itself, whether or not this daemon still runs
        (docs/design.md section 10, "Ownership and fencing"). Each lease renewal
        moves it on."""
        with contextlib.suppress(SpawnerGone):
            self._send({"op": "fence", "at": at})

    def term(self, held: Held) -> None:
        """SIGTERM to every process of the run."""
        self._request("term", held)

    def kill(self, held: Held) -> None:
        """SIGKILL to every process of the run."""
        self._request("kill", held)

    def _request(self, op: Literal["term", "kill"], held: Held) -> None:
        if held.exited.done():
            return
        with contextlib.suppress(SpawnerGone):
            self._send({"op": op, "id": held.rid})

    def _readable(self) -> None:
        assert self._loop is not None
        while self.sock is not None:
            try:
                data, fds = _recv(self.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data:
                for fd in fds:
                    os.close(fd)
                self._lost()
                return
            try:
                message = orjson.loads(data)
                self._answer(message)
            except (orjson.JSONDecodeError, KeyError, TypeError):
                log.error("spawner.bad_message", data=data[:200])
            for fd in fds:  # none expected
                os.close(fd)

    def _answer(self, message: SpawnerReply) -> None:
        assert self._loop is not None
        op, rid = message["op"], message.get("id", 0)
        if op == "idle":
            pid = message["pid"]
            # Not while a request named no holder: the spawner may have given it
            # this one already (its answer is on the way). It tells the next one.
            known = pid is not None and not self._unbound
            self.idle = (pid, message.get("start")) if pid is not None and known else None
        elif op == "spawned":
            self._unbound.discard(rid)
            pid = message["pid"]
            if pid is None:  # a spawned run always has its pid: a malformed message
                raise TypeError("spawned with no pid")
            held = Held(rid, pid, message.get("start"), self._loop.create_future())
            held.go_fd = self._go.pop(rid, None)
            if self.idle is not None and self.idle[0] == held.pid:  # told, then taken
                self.idle = None
            self._runs[rid] = held
            reply = self._pending.pop(rid, None)
            if reply is not None and not reply.done():
                reply.set_result(held)
            elif rid in self._abandoned:
                self._abandoned.discard(rid)
                held.drop_go()
                self.kill(held)
        elif op == "refused":
            self._unbound.discard(rid)
            reply = self._pending.pop(rid, None)
            self._abandoned.discard(rid)
            self._drop_go(rid)
            if reply is not None and not reply.done():
                reply.set_exception(OSError(errno.EPERM, message.get("error", "refused")))
        elif op == "exited":
            held = self._runs.pop(rid)
            held.drop_go()
            if not held.exited.done():
                held.exited.set_result(int(message["status"]))

    def _lost(self) -> None:
        """The channel closed: every run is gone with the spawner (each holder's
        parent-death signal kills its subtree), so every waiter is answered."""
        sock, self.sock = self.sock, None
        if sock is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(sock.fileno())
        sock.close()
        for reply in self._pending.values():
            if not reply.done():
                reply.set_exception(SpawnerGone(errno.EPIPE, "the spawner died"))
        for held in self._runs.values():
            held.drop_go()
            if not held.exited.done():
                held.exited.set_result(LOST)
        if self._runs:
            log.error("spawner.lost", runs=len(self._runs))
        for rid in list(self._go):
            self._drop_go(rid)
        self.idle = None
        self._unbound.clear()
        self._pending.clear()
        self._runs.clear()
        self._abandoned.clear()
        proc = self.proc
        if proc is not None and self._loop is not None:
            self._loop.run_in_executor(None, proc.wait)  # reaped, not left a zombie

    async def close(self, timeout: float = 10.0) -> None:
        """Shutdown: the spawner kills whatever is left and exits; wait for that."""
        proc = self.proc
        self._lost()
        if proc is None:
            return
        try:
            await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)
        except TimeoutError:
            log.error("spawner.stuck", pid=proc.pid)
            proc.kill()
        self.proc = None


def _recv(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One packet and the fds that came with it, without waiting (the standard
    library's ``socket.recv_fds`` drops its ``flags`` before Python 3.12)."""
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_LEN(4 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)
