"""``sessionctl export`` and ``import``: this client writes and reads the bundle
file as the calling user; its bytes cross the socket (docs/rpc.md, "Methods with a
body"), so the daemon never opens a path a client names."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from sessiond.wire import Connection, RemoteError

# the reply types, for mypy only: sessionctl starts without building them
if TYPE_CHECKING:
    from sessiond.replies import ExportedBundle


def _bad_file(path: Path | str, exc: OSError, doing: str) -> RemoteError:
    return RemoteError("invalid_input", f"cannot {doing} {path}: {exc.strerror or exc}", 5)


def export_bundle(conn: Connection, name: str, output: str) -> tuple[ExportedBundle, str]:
    """The daemon sends the bundle's bytes; this client writes them, as its own user
    (the daemon never writes where a client names)."""
    import hashlib

    digest = hashlib.sha256()
    if output == "-":
        stdout = sys.stdout.buffer

        def to_stdout(data: bytes) -> None:
            digest.update(data)
            stdout.write(data)

        d = conn.call_receiving("export", {"name": name}, to_stdout)
        stdout.flush()
        target = "standard output"
    else:
        path = Path(output)
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise _bad_file(path, exc, "write") from None
        try:
            with os.fdopen(fd, "wb") as f:

                def to_file(data: bytes) -> None:
                    digest.update(data)
                    f.write(data)

                d = conn.call_receiving("export", {"name": name}, to_file)
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, path)  # whole, or not there at all
        except OSError as exc:
            raise _bad_file(path, exc, "write") from None
        finally:
            part.unlink(missing_ok=True)
        target = str(path)
    if d.get("sha256") != digest.hexdigest():
        raise RemoteError("internal", "the bundle arrived damaged (its sha256 differs)", 70)
    d["path"] = target
    return d, f"exported {d['events']} events of {name} to {target}"


def summary_to_stderr(d: ExportedBundle, text: str, as_json: bool) -> int:
    """An export to standard output: stdout holds the bundle alone, so what was
    exported is said on stderr."""
    print(orjson.dumps(d).decode() if as_json else text, file=sys.stderr)
    return 0


def _open_bundle(path: Path) -> IO[bytes]:
    """The bundle file, refused (as the daemon would) unless it is a regular file: a
    FIFO or a device would block or never end. O_NONBLOCK only for the open."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise RemoteError("bad_bundle", f"cannot read bundle {path}: {exc.strerror}", 5) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RemoteError(
            "bad_bundle", f"bundle {path} is not a regular file; give the path of a bundle", 5
        )
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def import_bundle(conn: Connection, bundle: str, name: str | None) -> Any:
    """This client reads the bundle (a file, or - for standard input) and sends its bytes."""
    import hashlib
    import tempfile

    with contextlib.ExitStack() as stack:
        source: IO[bytes]
        if bundle == "-":  # its size and hash come first: spool it
            source = stack.enter_context(tempfile.TemporaryFile())
            while chunk := sys.stdin.buffer.read(1 << 20):
                source.write(chunk)
            source.seek(0)
        else:
            source = stack.enter_context(_open_bundle(Path(bundle).resolve()))
        digest = hashlib.sha256()
        while chunk := source.read(1 << 20):
            digest.update(chunk)
        size = source.tell()
        source.seek(0)
        label = "standard input" if bundle == "-" else str(Path(bundle).resolve())
        params = {"name": name, "sha256": digest.hexdigest(), "source": label}
        return conn.call_sending("import", params, source, size)
