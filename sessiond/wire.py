"""The RPC wire format, and a small client. The standard library only at import
(orjson, pathlib, typing when used): sessionctl imports this module and must start fast.

Frames are JSON objects, one per line (newline-delimited), each at most
``max_frame_bytes`` (1 MiB by default) including the newline.

* request:  ``{"id": 1, "method": "ps", "params": {}}``
* success:  ``{"id": 1, "ok": true, "result": ...}``
* failure:  ``{"id": 1, "ok": false, "error": {"code": "no_such_session",
  "message": "...", "exit": 4}}``
* stream:   zero or more ``{"id": 1, "stream": ...}`` before the final response
  (``log --follow`` sends a final one only to end the stream: a ``fell_behind``
  error when the reader could not keep up; otherwise the client closes).
* token:    a request on the program endpoint also carries ``"token"``: the run's
  ``SESSIOND_TOKEN`` (the ``sdk.*`` methods carry it in their params instead).
* body:     ``export`` answers ``{"id": 1, "ok": true, "result": ..., "body": N}``
  followed by N raw bytes; ``import`` sends its frame (with ``bytes`` and
  ``sha256``) followed by N raw bytes. A bundle of any size crosses the socket
  and neither side names a path the other would open.

A connection carries any number of requests, answered in order.
"""

from __future__ import annotations

import json as _json
import os
import socket as _socket
from collections.abc import Callable, Iterator, Mapping

# typing, pathlib and orjson are for mypy, the daemon and the SDK: a `sessionctl
# ping` that imported them spent more on that than on the rest of its run.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import IO, Any, NotRequired, TypedDict

PROTOCOL = 1
DEFAULT_MAX_FRAME = 1 << 20
# The longest answer line a daemon reads from another (asyncio's default, 64 KiB, cut
# off the answer to a migrate of a session with a 70 KB goal after it was imported).
ANSWER_LIMIT = 64 << 20


# A request's params: each method's own (sessiond/ipc/params.py checks them), any
# JSON object; read-only here, so a TypedDict of a method's params passes as well.
Params = Mapping[str, object]


if TYPE_CHECKING:

    class ErrorInfo(TypedDict):
        """A failure answer's ``error`` (docs/rpc.md, "Errors")."""

        code: str
        message: str
        exit: int
        last_seq: NotRequired[dict[str, int]]  # fell_behind: per session, where it stopped

    class Frame(TypedDict, total=False):
        """One answer line: a success, a failure or a stream item (see above)."""

        id: int | str | None
        ok: bool
        result: Any  # the method's reply: sessiond/replies.py types each
        error: ErrorInfo
        stream: Any  # an item of a stream (log --follow: an event)
        body: int  # bytes that follow the line (export)

else:  # at run time a frame is the dict it decodes to (a TypedDict builds no other)
    ErrorInfo = Frame = dict


class RemoteError(Exception):
    """An error answer from the daemon (or the daemon could not be reached: exit 3)."""

    def __init__(
        self, code: str, message: str, exit_code: int, data: Mapping[str, object] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code
        # The error object as sent: some codes carry more (fell_behind: last_seq).
        self.data = data or {}


def encode(message: Mapping[str, object]) -> bytes:
    import orjson  # the daemon's and the SDK's (loaded already there); sessionctl's: plain_encode

    return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)


def plain_encode(message: Mapping[str, object]) -> bytes:
    """:func:`encode` with the standard library's json: the same frame for what a
    command line holds (strings, numbers, lists, dicts), without orjson's import
    (which cost a `sessionctl ping` more than the rest of its run). A string that
    is not text (a lone surrogate: bytes of an argument that were not UTF-8) is
    refused here, as orjson refuses it."""
    text = _json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError as exc:
        # the bytes as given (Python holds a byte that is not UTF-8 as U+DC80..U+DCFF)
        shown = "".join(
            f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else f"\\u{ord(c):04x}"
            for c in text[exc.start : exc.end]
        )
        raise RemoteError(
            "invalid_input",
            f"an argument holds bytes that are not UTF-8 text ({shown}); pass UTF-8 text",
            5,
        ) from None


def last_word_path(socket: Path) -> Path:
    """Where a daemon that ends on purpose (a cluster node whose lease lapsed or
    whose database is away) leaves why, beside its socket, for sessionctl to show
    while it is down; removed when it listens again."""
    return socket.with_name(socket.name + ".ended")


def leave_last_word(socket: Path, text: str) -> None:
    """Write :func:`last_word_path` (whole or not at all; best effort: the daemon
    is ending, and a note it cannot write must not stop that)."""
    note = last_word_path(socket)
    tmp = note.with_name(note.name + ".tmp")
    try:
        # a node that ends before it listens has not made its socket's folder yet
        note.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_text(text[:2000] + "\n")
        tmp.chmod(0o644)  # as readable as the folder lets the socket's users
        tmp.replace(note)
    except OSError:
        pass


def _last_word(path: str | os.PathLike[str]) -> str:
    from pathlib import Path  # only when the daemon is not there

    try:
        text = last_word_path(Path(path)).read_text(errors="replace")[:2000]
    except OSError:
        return ""
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    return f". Its last word: {text}" if text else ""


def _unreachable(path: str | os.PathLike[str], exc: OSError) -> RemoteError:
    return RemoteError(
        "unreachable",
        f"the daemon is not reachable at {path} ({exc.strerror or exc}); start it with "
        "'sessiond' (or 'systemctl start sessiond'), or point --socket / SESSIOND_SOCKET "
        f"at the socket it listens on{_last_word(path)}",
        3,
    )


class Connection:
    """A blocking connection to the daemon (what sessionctl uses)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        timeout: float | None = 30.0,
        *,
        token: str | None = None,
        plain: bool = False,
    ) -> None:
        self.path = path
        # How frames are written and read: orjson (which also takes what an SDK
        # caller passes: datetimes, dataclasses), or with ``plain`` the standard
        # library's json, for a sessionctl command that sends what a command line
        # holds and must start fast (plain_encode).
        self._encode: Callable[[Mapping[str, object]], bytes] = encode
        self._decode: Callable[[bytes], Any]
        if plain:
            self._encode, self._decode = plain_encode, _json.loads
        else:
            import orjson

            self._decode = orjson.loads
        # A run's token (SESSIOND_TOKEN), sent with every request: on the program
        # endpoint it says which run is calling (the control socket ignores it).
        self.token = token
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(os.fspath(path))
        except OSError as exc:
            self.sock.close()
            raise _unreachable(path, exc) from exc
        self._buf = b""
        self._next_id = 0
        # Applied to every decoded answer (sessionctl's human output: ctl/safeterm.py).
        self.clean: Callable[[Any], Any] | None = None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, method: str, params: Params) -> int:
        self._next_id += 1
        try:
            frame: dict[str, object] = {"id": self._next_id, "method": method, "params": params}
            if self.token:
                frame["token"] = self.token
            self.sock.sendall(self._encode(frame))
        except (BrokenPipeError, ConnectionResetError) as exc:
            # The daemon may have answered and closed at once (a peer it refuses):
            # its answer says why, which "not reachable" would not.
            try:
                refusal = self.receive()
            except RemoteError:
                raise _unreachable(self.path, exc) from exc
            result_of(refusal)
            raise _unreachable(self.path, exc) from exc
        except OSError as exc:
            raise _unreachable(self.path, exc) from exc
        return self._next_id

    def receive(self) -> Frame:
        while b"\n" not in self._buf:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError as exc:
                raise RemoteError(
                    "timeout", f"the daemon at {self.path} did not answer in time", 3
                ) from exc
            except OSError as exc:
                raise _unreachable(self.path, exc) from exc
            if not chunk:
                raise RemoteError("closed", f"the daemon at {self.path} closed the connection", 3)
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        message: Frame = self._decode(line)
        if self.clean is not None:
            cleaned: Frame = self.clean(message)
            return cleaned
        return message

    def call(self, method: str, params: Params) -> Any:
        self.send(method, params)
        return result_of(self.receive())

    def call_receiving(self, method: str, params: Params, sink: Callable[[bytes], object]) -> Any:
        """A call whose answer carries a body (``export``): ``sink`` takes its bytes."""
        self.send(method, params)
        message = self.receive()
        result = result_of(message)
        left = int(message.get("body", 0))
        while left > 0:
            if not self._buf:
                try:
                    self._buf = self.sock.recv(min(1 << 20, left))
                except OSError as exc:
                    raise _unreachable(self.path, exc) from exc
                if not self._buf:
                    raise RemoteError(
                        "closed", f"the daemon closed the connection {left} bytes early", 3
                    )
            take, self._buf = self._buf[:left], self._buf[left:]
            sink(take)
            left -= len(take)
        return result

    def call_sending(self, method: str, params: Params, source: IO[bytes], size: int) -> Any:
        """A call with a body (``import``): ``size`` bytes of ``source`` follow the frame."""
        self.send(method, {**params, "bytes": size})
        left = size
        try:
            while left > 0:
                chunk = source.read(min(1 << 20, left))
                if not chunk:
                    raise RemoteError("invalid_input", f"the body ended {left} bytes early", 5)
                self.sock.sendall(chunk)
                left -= len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon refused and closed: its answer says why
        except OSError as exc:
            raise _unreachable(self.path, exc) from exc
        return result_of(self.receive())

    def stream(self, method: str, params: Params) -> Iterator[Any]:
        """Yield stream items until the final response (whose result is returned)."""
        self.send(method, params)
        while True:
            message = self.receive()
            if "stream" in message:
                yield message["stream"]
            else:
                result_of(message)
                return


def result_of(message: Frame) -> Any:
    if message.get("ok"):
        return message.get("result")
    error: Mapping[str, Any] = message.get("error") or {}  # as the daemon sent it
    raise RemoteError(
        str(error.get("code", "internal")),
        str(error.get("message", "the daemon gave no reason")),
        int(error.get("exit", 70)),
        error if isinstance(error, dict) else None,
    )


async def send_bundle_async(path: Path, bundle: Path, params: Params, timeout: float = 60) -> Any:
    """``import`` a bundle file into the daemon at ``path``, its bytes as the body
    (daemon to daemon: ``migrate --to``). The file work runs in a thread."""
    import asyncio
    import hashlib

    import orjson

    def digest() -> tuple[int, str]:
        h = hashlib.sha256()
        with bundle.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return bundle.stat().st_size, h.hexdigest()

    size, sha = await asyncio.to_thread(digest)
    reader, writer = await asyncio.wait_for(
        asyncio.open_unix_connection(str(path), limit=ANSWER_LIMIT), timeout
    )
    try:
        frame = {"id": 1, "method": "import", "params": {**params, "bytes": size, "sha256": sha}}
        writer.write(encode(frame))
        with bundle.open("rb") as f:
            while chunk := await asyncio.to_thread(f.read, 1 << 20):
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), timeout)
        line = await asyncio.wait_for(reader.readline(), timeout)
        if not line:
            raise RemoteError("closed", f"the daemon at {path} closed the connection", 3)
        return result_of(orjson.loads(line))
    finally:
        writer.close()


async def call_async(path: Path, method: str, params: Params, timeout: float = 60) -> Any:
    """One request to a daemon from inside an event loop (daemon to daemon)."""
    import asyncio  # here, not at the top: sessionctl imports this module and must start fast

    import orjson

    reader, writer = await asyncio.wait_for(
        asyncio.open_unix_connection(str(path), limit=ANSWER_LIMIT), timeout
    )
    try:
        writer.write(encode({"id": 1, "method": method, "params": params}))
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
        if not line:
            raise RemoteError("closed", f"the daemon at {path} closed the connection", 3)
        return result_of(orjson.loads(line))
    finally:
        writer.close()
