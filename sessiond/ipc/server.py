"""The RPC server: the Unix socket and the life of each connection on it.

It listens (on its own socket, or on one systemd made), takes over a socket a
crashed daemon left behind, lets in only allowed peers (sessiond.ipc.peers),
reads framed requests (sessiond.ipc.frames) and hands each to the dispatch
(sessiond.ipc.dispatch). Bad input never harms the daemon: malformed JSON,
unknown methods, wrong types, oversized frames, slow or half-open clients each
get an error or are closed, and every other client goes on being served.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

import structlog

from sessiond.config import AccessConfig, DaemonConfig
from sessiond.errors import SessiondError
from sessiond.ipc.dispatch import Caller, Dispatch
from sessiond.ipc.fence import EXECUTE, READ, WRITE, check_folder, grant
from sessiond.ipc.frames import TOO_LARGE, Frames, error, reply
from sessiond.ipc.peers import Peer, Peers
from sessiond.ipc.runpeer import Examiner
from sessiond.paths import program_socket
from sessiond.sandboxconfig import dynamic_uids_on, run_uids
from sessiond.syscalls.kernel import Kernel
from sessiond.syscalls.seams import Follows, Router
from sessiond.wire import last_word_path

if TYPE_CHECKING:
    from sessiond.ipc.early import Early, Held

log = structlog.get_logger(__name__)


class Server:
    """Owns the listening socket and the connection tasks; the daemon starts and
    closes it, and on a reload calls ``reconfigure``.

    The daemon has two: the control socket (``endpoint="control"``, for people:
    a peer that is a process of a run may only ping there) and the program
    endpoint beside it (``"program"``, for runs: sessiond.ipc.program)."""

    def __init__(
        self,
        config: DaemonConfig,
        kernel: Kernel,
        reload: Callable[[], Awaitable[Any]],
        *,
        endpoint: Literal["control", "program"] = "control",
        router: Router | None = None,
        follows: Follows | None = None,
    ) -> None:
        self.config = config
        self.endpoint = endpoint
        self.path = config.socket if endpoint == "control" else program_socket(config.socket)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        # the program endpoint's connections per uid: see _share
        self._per_uid: Counter[int] = Counter()
        self.activated = False
        self.peers = Peers(config.access, run_uids(config))
        # a cluster node's seams: requests carried to other nodes, follows across them
        self.dispatch = Dispatch(kernel, reload, router, follows)

    def allow(self, access: AccessConfig) -> None:
        """Who may connect (see Peers.allow); a reload applies it to the next connections."""
        self.peers.allow(access, run_uids(self.config))

    def reconfigure(self, config: DaemonConfig) -> None:
        """A reload: who may connect next, and the configuration the server reads."""
        self.allow(config.access)
        self.config = config

    # --- the socket -----------------------------------------------------------------

    async def start(
        self, activated: socket.socket | None = None, *, early: Early | None = None
    ) -> None:
        """``early``: the early server that serves the control socket now
        (sessiond.daemon.early): its listening socket and its connections are
        taken over as they are, so no connect fails in between."""
        if self.endpoint == "control":
            self.dispatch.bundles.prepare()
            # why an earlier run of it ended: stale from now on (wire.py)
            last_word_path(self.path).unlink(missing_ok=True)
        if early is not None and self.endpoint == "control":
            listening, held = await asyncio.to_thread(early.hand_over)
            self._server = await asyncio.start_unix_server(
                self._serve, sock=listening, backlog=min(self.config.max_connections, 4096)
            )
            for connection in held:
                self._adopt(connection)
            log.info(
                "server.listening", socket=str(self.path), endpoint=self.endpoint,
                early_answered=early.answered, early_held=len(held),
            )  # fmt: skip
            return
        if activated is not None:
            # Socket activation: systemd made the socket (and its mode); we serve it.
            self.activated = True
            self._server = await asyncio.start_unix_server(
                self._serve, sock=activated, backlog=min(self.config.max_connections, 4096)
            )
            log.info("server.listening", socket=str(activated.getsockname()), activated=True)
            return
        folder = self.path.parent
        access = self.config.access
        shared = bool(access.users or access.groups)
        run_user = self.config.run.identity()
        check_folder(folder)  # refuses a folder someone else owns or may write
        self._take_over_stale_socket()
        self._server = await asyncio.start_unix_server(
            self._serve,
            path=str(self.path),
            backlog=min(self.config.max_connections, 4096),  # bursts of clients wait, not fail
        )
        os.chmod(self.path, 0o600)
        # The file mode is the first fence, the credential check the real one: the
        # allowed users and groups get in through ACLs, nobody else at all. The
        # [run] user reaches the program endpoint only: its socket's ACL names it,
        # the control socket's never does.
        # (Both endpoints share the folder, and check_folder's chmod resets its ACL
        # mask: each sets the folder's ACL again, the same one.)
        runs = {run_user[0]} if run_user is not None else set()
        others = {u for u in access.uids() if u != os.geteuid()}
        if shared or runs:
            grant(folder, EXECUTE, others | runs, access.gids())
        if self.endpoint == "program" and runs:
            grant(self.path, READ | WRITE, runs, set())
        elif self.endpoint == "program" and dynamic_uids_on(self.config):
            # Runs with a dynamic uid reach the socket only through their sandbox's
            # bind of it (its 0700 folder stays the fence for everyone else); too
            # many uids for an ACL, so the file's mode lets them connect, and the
            # peer check admits only those uids and the operators.
            os.chmod(self.path, 0o666)
        elif self.endpoint == "control" and shared:
            grant(self.path, READ | WRITE, others, access.gids())
        log.info("server.listening", socket=str(self.path), shared=shared, endpoint=self.endpoint)

    def _take_over_stale_socket(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SessiondError(
                f"{self.path} exists and is not a socket; move it away or pick another --socket"
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.path))
        except OSError:
            os.unlink(self.path)  # left by a crash: nobody listens
            log.info("server.stale_socket_replaced", socket=str(self.path))
            return
        finally:
            probe.close()
        raise SessiondError(
            f"another daemon is listening on {self.path}; stop it first or use another --socket"
        )

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()
            if not self.activated:  # systemd owns an activated socket's file
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)

    async def close(self) -> None:
        await self.stop_accepting()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=2)

    # --- connections ----------------------------------------------------------------

    def _adopt(self, held: Held) -> None:
        """A connection the early server took in: served from where it stopped
        (what it answered first, then its next request), its peer checked here as
        any connection's."""

        async def serve() -> None:
            try:
                try:
                    reader, writer = await asyncio.open_unix_connection(sock=held.sock)
                except OSError:  # gone meanwhile: nothing to answer
                    held.sock.close()
                    return
                await self._serve(reader, writer, held)
            finally:
                if held.examiner is not None:  # (refused before a caller took it)
                    held.examiner.close()

        task = asyncio.ensure_future(serve())
        self._connections.add(task)  # (until _serve counts it: a stop cancels it too)
        task.add_done_callback(self._connections.discard)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, held: Held | None = None
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer: Peer | None = None
        try:
            if held is not None and held.unsent:  # answers the early server gave first
                writer.write(held.unsent)
                await writer.drain()
            if len(self._connections) > self.config.max_connections:
                await reply(writer, error(None, "busy", "too many connections; retry later", 1))
                return
            peer = Peer.of(writer.get_extra_info("socket"))
            if self._over_share(peer):
                await reply(writer, error(None, "busy", self._share_refusal(), 1))
                return
            self._per_uid[peer.uid] += 1
            if not self.peers.allowed(peer, programs=self.endpoint == "program"):
                log.warning("peer.refused", pid=peer.pid, uid=peer.uid, gid=peer.gid)
                await reply(
                    writer,
                    error(
                        None,
                        "permission_denied",
                        f"uid {peer.uid} may not use this daemon; ask its operator to add the "
                        "user or one of its groups under [access] in the daemon configuration",
                        1,
                    ),
                )
                return
            caller = self._caller(peer, writer, held.examiner if held is not None else None)
            try:
                await self._requests(reader, writer, caller, held.unread if held else b"")
            finally:
                if caller.examiner is not None:
                    caller.examiner.close()
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:  # never let one connection take the daemon down
            log.exception("connection.failed")
        finally:
            self._connections.discard(task)
            if peer is not None and self._per_uid[peer.uid] > 0:
                self._per_uid[peer.uid] -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _share(self) -> int:
        """The program endpoint's connections one uid other than the daemon's may
        hold: a run has a uid of its own (a root daemon's), and one run holding
        every connection would have every other run's calls refused as busy."""
        return max(16, self.config.max_connections // 8)

    def _over_share(self, peer: Peer) -> bool:
        if self.endpoint != "program" or peer.uid == os.getuid():
            return False
        return self._per_uid[peer.uid] >= self._share()

    def _share_refusal(self) -> str:
        return (
            f"too many connections from this run's uid (at most {self._share()} at once, "
            "an eighth of max_connections); close idle ones and retry"
        )

    def _caller(
        self, peer: Peer, writer: asyncio.StreamWriter, pinned: Examiner | None = None
    ) -> Caller:
        if self.endpoint == "program":
            return Caller("program", peer.uid)
        # examined once, then asked at each request whether the process that
        # connected is still there (Caller.refused): see sessiond.ipc.runpeer.
        # ``pinned``: the early server's, pinned when it accepted the connection
        # (sessiond.ipc.early.Held says why it is not pinned again here)
        examiner = pinned or Examiner(writer.get_extra_info("socket"), peer.pid, peer.uid,
                                      self.peers.run_uids)  # fmt: skip
        return Caller("control", peer.uid, examiner=examiner, pid=peer.pid)

    async def _requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        caller: Caller,
        unread: bytes = b"",
    ) -> None:
        frames = Frames(reader, self.config.max_frame_bytes)
        frames.buf += unread  # what the early server read and left for us
        idle = Idle(lambda: self.config.read_timeout)  # a reload's applies at once
        try:
            while True:
                line = await idle.read(frames)
                if line is None:
                    return  # idle or half-open, or the client went away
                if line is TOO_LARGE:
                    limit = self.config.max_frame_bytes
                    await reply(
                        writer,
                        error(
                            None,
                            "frame_too_large",
                            f"a request is at most {limit} bytes; it was skipped and the "
                            "connection goes on",
                            2,
                        ),
                    )
                    continue
                if not line.strip():
                    continue
                await self.dispatch.handle(line, frames, writer, caller)
        finally:
            idle.close()


class Idle:
    """Ends a connection whose client sent no whole request for ``timeout``
    seconds while the server waited for one (idle or half-open). One timer a
    connection, moved on only when it fires: ``asyncio.wait_for`` around each
    read cost a task, a timer and two loop iterations per request."""

    def __init__(self, timeout: Callable[[], float]) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.timeout = timeout  # read when the timer fires: a reload may change it
        self.since: float | None = None  # loop time the wait for a request began
        self.expired = False
        self.timer = self.loop.call_later(timeout(), self._check)

    async def read(self, frames: Frames) -> bytes | None:
        """The next frame; None once the client went away or was idle too long
        (a half-sent frame is dropped)."""
        self.since = self.loop.time()
        try:
            return await frames.next()
        except asyncio.CancelledError:
            if not self.expired:
                raise
            if self.task is not None:
                self.task.uncancel()
            return None
        finally:
            self.since = None

    def _check(self) -> None:
        since, timeout = self.since, self.timeout()
        now = self.loop.time()
        # (a timer may fire a tick early: within 5 ms of the deadline counts as at it)
        if since is not None and now - since >= timeout - 0.005 and self.task is not None:
            self.expired = True
            self.task.cancel()
            return
        # not waiting (a request is being answered), or not long enough yet
        self.timer = self.loop.call_at((now if since is None else since) + timeout,
                                       self._check)  # fmt: skip

    def close(self) -> None:
        self.timer.cancel()
