"""The RPC server: a Unix socket, peer-credential checks, typed requests.

Bad input never harms the daemon: malformed JSON, unknown methods, wrong types,
oversized frames, slow or half-open clients each get an error or are closed,
and every other client goes on being served.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import orjson
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessiond.config import AccessConfig, DaemonConfig
from sessiond.errors import SessiondError
from sessiond.log.event_data import ErrorClass
from sessiond.log.events import EVENT_TYPES
from sessiond.syscalls.kernel import Kernel
from sessiond.wire import encode

log = structlog.get_logger(__name__)

_CREDS = struct.Struct("3i")


class _Params(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class NoParams(_Params):
    pass


class NameParams(_Params):
    name: str


class CreateParams(_Params):
    spec: str
    base: str
    source: str = "spec"


class LogParams(_Params):
    name: str | None = None  # None: every session (only with follow)
    since: int = Field(default=1, ge=1)
    types: list[str] = Field(default_factory=list)
    limit: int = Field(default=0, ge=0)
    follow: bool = False


class ReplayParams(_Params):
    name: str
    upto: int | None = Field(default=None, ge=1)
    view: str = "state"


class ForkParams(_Params):
    name: str
    new: str
    at: int | None = Field(default=None, ge=1)
    with_triggers: bool = False


class MergeParams(_Params):
    child: str
    into: str | None = None
    summary: str | None = None


class SendParams(_Params):
    to: str
    text: str = Field(max_length=256 * 1024)
    sender: str = "sessionctl"


class MigrateParams(_Params):
    name: str
    profile: str | None = None
    to: str | None = None


class CompactParams(_Params):
    name: str
    keep: int = Field(default=4, ge=0)


class ApproveParams(_Params):
    name: str
    call: str | None = None
    by: str = ""
    reason: str = ""


class ResolveParams(_Params):
    name: str
    option: Literal["rerun", "discard", "accept"]
    by: str = ""


class TokenParams(_Params):
    token: str
    session: str | None = None  # the SDK sends SESSIOND_SESSION: a token works for it only


class SdkToolParams(TokenParams):
    tool: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] = Field(default_factory=dict)
    writes: list[str] = Field(default_factory=list)
    risk: dict[str, str] = Field(default_factory=dict)


class SdkCallParams(TokenParams):
    call: str


class SdkFinishedParams(TokenParams):
    call: str
    status: Literal["ok", "error", "interrupted"] = "ok"
    output: str = ""
    observation: str = ""
    exit_code: int | None = None
    error_class: ErrorClass | None = None


class SdkModelParams(TokenParams):
    model: str
    request: Any
    response: Any
    tokens_in: int = Field(default=0, ge=0)
    tokens_out: int = Field(default=0, ge=0)
    request_id: str | None = None
    tools: list[Any] = Field(default_factory=list)
    status: Literal["ok", "error", "cancelled"] = "ok"
    duration_ms: int = Field(default=0, ge=0)
    text: str = ""


class SdkVerifyParams(TokenParams):
    check: str
    ok: bool
    output: str = ""


class SdkSendParams(TokenParams):
    to: str
    text: str = Field(max_length=256 * 1024)


class SdkEndParams(TokenParams):
    intent: Literal["sleep", "complete"]
    summary: str = ""


class ExportParams(_Params):
    name: str
    path: str


class ImportParams(_Params):
    path: str
    name: str | None = None


Handler = Callable[[Any], Awaitable[Any]]


class BadRequest(SessiondError):
    """A frame that is not a request: not JSON, no method, unknown method (exit 2)."""

    code = "bad_request"
    exit_code = 2


class Server:
    def __init__(
        self, config: DaemonConfig, kernel: Kernel, reload: Callable[[], Awaitable[Any]]
    ) -> None:
        self.config = config
        self.kernel = kernel
        self.path = config.socket
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self.activated = False
        self.allow(config.access)
        k = kernel
        self.methods: dict[str, tuple[type[_Params], Handler]] = {
            "ping": (NoParams, lambda _: k.ping()),
            "ps": (NoParams, lambda _: k.ps()),
            "show": (NameParams, lambda p: k.show(p.name)),
            "replay": (ReplayParams, lambda p: k.replay(p.name, p.upto, p.view)),
            "gate": (NameParams, lambda p: k.gate(p.name)),
            "create": (CreateParams, lambda p: k.create(p.spec, p.base, p.source)),
            "activate": (NameParams, lambda p: k.activate(p.name)),
            "suspend": (NameParams, lambda p: k.suspend(p.name)),
            "resume": (NameParams, lambda p: k.resume(p.name)),
            "interrupt": (NameParams, lambda p: k.interrupt(p.name)),
            "cancel": (NameParams, lambda p: k.cancel(p.name)),
            "fork": (ForkParams, lambda p: k.fork(p.name, p.new, p.at, p.with_triggers)),
            "merge": (MergeParams, lambda p: k.merge(p.child, p.into, p.summary)),
            "send": (SendParams, lambda p: k.send(p.to, p.text, p.sender)),
            "migrate": (MigrateParams, lambda p: k.migrate(p.name, p.profile, p.to)),
            "compact": (CompactParams, lambda p: k.compact(p.name, p.keep)),
            "approve": (ApproveParams, lambda p: k.approve(p.name, p.call, p.by)),
            "deny": (ApproveParams, lambda p: k.deny(p.name, p.call, p.by, p.reason)),
            "export": (ExportParams, lambda p: k.export(p.name, p.path)),
            "import": (ImportParams, lambda p: k.import_(p.path, p.name)),
            "reload": (NoParams, lambda _: reload()),
            "resolve": (ResolveParams, lambda p: k.resolve(p.name, p.option, p.by)),
            "sdk.context": (TokenParams, lambda p: k.sdk_context(p.token)),
            "sdk.tool": (
                SdkToolParams,
                lambda p: k.sdk_tool(p.token, p.tool, p.args, p.writes, p.risk),
            ),
            "sdk.started": (SdkCallParams, lambda p: k.sdk_started(p.token, p.call)),
            "sdk.finished": (
                SdkFinishedParams,
                lambda p: k.sdk_finished(
                    p.token,
                    p.call,
                    status=p.status,
                    output=p.output,
                    observation=p.observation,
                    exit_code=p.exit_code,
                    error_class=p.error_class,
                ),
            ),
            "sdk.model": (
                SdkModelParams,
                lambda p: k.sdk_model(p.token, p.model_dump(exclude={"token"})),
            ),
            "sdk.verify": (
                SdkVerifyParams,
                lambda p: k.sdk_verify(p.token, p.check, p.ok, p.output),
            ),
            "sdk.send": (SdkSendParams, lambda p: k.sdk_send(p.token, p.to, p.text)),
            "sdk.end": (SdkEndParams, lambda p: k.sdk_end(p.token, p.intent, p.summary)),
        }

    def allow(self, access: AccessConfig) -> None:
        """Who may connect: the daemon's user, root, and the configured users and groups.
        (A reload applies a new list to the next connections.)"""
        self._allowed_uids = {os.getuid(), 0} | access.uids()
        self._allowed_gids = access.gids()

    # --- the socket -----------------------------------------------------------------

    async def start(self, activated: socket.socket | None = None) -> None:
        if activated is not None:
            # Socket activation: systemd made the socket (and its mode); we serve it.
            self.activated = True
            self._server = await asyncio.start_unix_server(
                self._serve, sock=activated, backlog=min(self.config.max_connections, 4096)
            )
            log.info("server.listening", socket=str(activated.getsockname()), activated=True)
            return
        folder = self.path.parent
        shared = bool(self.config.access.users or self.config.access.groups)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._take_over_stale_socket()
        self._server = await asyncio.start_unix_server(
            self._serve,
            path=str(self.path),
            backlog=min(self.config.max_connections, 4096),  # bursts of clients wait, not fail
        )
        if shared:
            # The file mode is the first fence; the credential check the real one.
            gid = next(iter(self._allowed_gids), os.getgid())
            with contextlib.suppress(PermissionError):
                os.chown(folder, -1, gid)
                os.chown(self.path, -1, gid)
            os.chmod(folder, 0o750)
            os.chmod(self.path, 0o660)
        else:
            os.chmod(self.path, 0o600)
        log.info("server.listening", socket=str(self.path), shared=shared)

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

    def _peer_allowed(self, sock: socket.socket) -> tuple[bool, int, int, int]:
        pid, uid, gid = _CREDS.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
        )
        if uid in self._allowed_uids:
            return True, pid, uid, gid
        if self._allowed_gids:
            groups = {gid}
            with contextlib.suppress(KeyError):
                groups.update(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
            if groups & self._allowed_gids:
                return True, pid, uid, gid
        return False, pid, uid, gid

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if len(self._connections) > self.config.max_connections:
                await self._reply(
                    writer, _error(None, "busy", "too many connections; retry later", 1)
                )
                return
            sock = writer.get_extra_info("socket")
            allowed, pid, uid, gid = self._peer_allowed(sock)
            if not allowed:
                log.warning("peer.refused", pid=pid, uid=uid, gid=gid)
                await self._reply(
                    writer,
                    _error(
                        None,
                        "permission_denied",
                        f"uid {uid} may not use this daemon; ask its operator to add the user "
                        "or one of its groups under [access] in the daemon configuration",
                        1,
                    ),
                )
                return
            await self._requests(reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:  # never let one connection take the daemon down
            log.exception("connection.failed")
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = Frames(reader, self.config.max_frame_bytes)
        while True:
            try:
                line = await asyncio.wait_for(frames.next(), self.config.read_timeout)
            except TimeoutError:
                return  # idle or half-open: close
            if line is None:
                return  # the client went away (a half-sent frame is dropped)
            if line is TOO_LARGE:
                limit = self.config.max_frame_bytes
                await self._reply(
                    writer,
                    _error(
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
            await self._handle(line, writer)

    async def _handle(self, line: bytes, writer: asyncio.StreamWriter) -> None:
        request_id: Any = None
        try:
            try:
                request = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise BadRequest(f"a request must be one JSON object per line: {exc}") from None
            if not isinstance(request, dict):
                raise BadRequest("a request must be a JSON object with id, method and params")
            request_id = request.get("id")
            if not isinstance(request_id, int | str) or isinstance(request_id, bool):
                request_id = None
            method = request.get("method")
            if not isinstance(method, str) or (method not in self.methods and method != "log"):
                known = ", ".join(sorted([*self.methods, "log"]))
                raise BadRequest(f"unknown method {method!r}; the methods are {known}")
            params = request.get("params", {})
            if not isinstance(params, dict):
                raise BadRequest("params must be a JSON object")
            if method == "log":
                await self._log(request_id, _parse(LogParams, params), writer)
                return
            model, handler = self.methods[method]
            parsed = _parse(model, params)
            if isinstance(parsed, TokenParams):
                self.kernel.check_token(parsed.token, parsed.session)
            result = await handler(parsed)
            await self._reply(writer, {"id": request_id, "ok": True, "result": result})
        except SessiondError as exc:
            await self._reply(writer, _error(request_id, exc.code, str(exc), exc.exit_code))
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("request.failed")
            await self._reply(
                writer,
                _error(
                    request_id,
                    "internal",
                    f"internal error: {type(exc).__name__}: {exc}; "
                    "this is a bug in sessiond, the daemon log has the details",
                    70,
                ),
            )

    async def _reply(self, writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        writer.write(encode(message))
        await writer.drain()

    async def _log(self, request_id: Any, p: LogParams, writer: asyncio.StreamWriter) -> None:
        unknown = set(p.types) - set(EVENT_TYPES)
        if unknown:
            from sessiond.errors import InvalidInput

            raise InvalidInput(f"unknown event type(s) {', '.join(sorted(unknown))}")
        if p.name is None and not p.follow:
            from sessiond.errors import InvalidInput

            raise InvalidInput("name a session, or follow every session with --all --follow")
        if not p.follow:
            assert p.name is not None
            records = await self.kernel.log_(p.name, p.since, p.types, p.limit)
            await self._reply(writer, {"id": request_id, "ok": True, "result": records})
            return
        await self._follow(request_id, p, writer)

    async def _follow(self, request_id: Any, p: LogParams, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=10_000)
        wanted = set(p.types)

        def listener(name: str, record: dict[str, Any]) -> None:
            if (p.name is None or name == p.name) and (not wanted or record["type"] in wanted):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait((name, record))

        last = 0
        if p.name is not None:
            self.kernel.table.get(p.name)
        unsubscribe = self.kernel.table.listen(listener)
        try:
            if p.name is not None:
                for record in await self.kernel.log_(p.name, p.since, p.types):
                    last = record["seq"]
                    writer.write(encode({"id": request_id, "stream": record}))
                await writer.drain()
            while True:
                _, record = await queue.get()
                if p.name is not None and record["seq"] <= last:
                    continue  # already sent from the log
                writer.write(encode({"id": request_id, "stream": record}))
                await writer.drain()
        finally:
            unsubscribe()


TOO_LARGE = b"\0too large\0"


class Frames:
    """Splits a byte stream into newline-delimited frames of at most ``limit`` bytes.

    An oversized frame is reported once (TOO_LARGE) and its bytes are skipped up
    to the next newline without being kept, so the connection can go on.
    """

    def __init__(self, reader: asyncio.StreamReader, limit: int) -> None:
        self.reader = reader
        self.limit = limit
        self.buf = bytearray()
        self.skipping = False

    async def next(self) -> bytes | None:
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                if self.skipping:
                    self.skipping = False
                    continue
                return TOO_LARGE if len(line) > self.limit else line
            if len(self.buf) > self.limit:
                self.buf.clear()
                if not self.skipping:
                    self.skipping = True
                    return TOO_LARGE
            chunk = await self.reader.read(1 << 16)
            if not chunk:
                return None
            self.buf += chunk


def _parse(model: type[_Params], params: dict[str, Any]) -> Any:
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        from sessiond.errors import InvalidInput

        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'params'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInput(f"bad parameters: {problems}") from None


def _error(request_id: Any, code: str, message: str, exit_code: int) -> dict[str, Any]:
    return {
        "id": request_id,
        "ok": False,
        "error": {"code": code, "message": message, "exit": exit_code},
    }
