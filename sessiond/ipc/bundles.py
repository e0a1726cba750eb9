"""``export`` and ``import``: a bundle's bytes cross the connection, never a path.

A client used to name a path and the daemon wrote (export) or read (import) it
with the daemon's rights — any client could make the daemon write where it
pleased. Now the client reads and writes its own files, and the daemon touches
only its own state dir (``outbox/`` and ``inbox/``, owner-only).

The bytes travel as a *body* after a frame: the frame says how many bytes follow
and their SHA-256, then exactly that many raw bytes come (no base64, no frame
limit: a bundle of any size). docs/rpc.md, "Methods with a body", has the shape:

    → {"id": 1, "method": "export", "params": {"name": "s"}}
    ← {"id": 1, "ok": true, "result": {...,"bytes": N, "sha256": "…"}, "body": N}
    ← N raw bytes

    → {"id": 2, "method": "import", "params": {"bytes": N, "sha256": "…", "name": null}}
    → N raw bytes
    ← {"id": 2, "ok": true, "result": {...}}

File work runs in threads, so a large bundle never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
from pathlib import Path
from typing import Any

from sessiond.errors import InvalidInput, SessiondError
from sessiond.ipc.frames import Frames, reply
from sessiond.ipc.params import ExportParams, ImportParams
from sessiond.log.store.durable import private_dir
from sessiond.replies import ExportedBundle
from sessiond.syscalls.kernel import Kernel

CHUNK = 1 << 20


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class BundleStream:
    """Moves bundles between a client's files and the daemon's own folders."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def prepare(self) -> None:
        """At start-up: the scratch folders exist, owner-only, and hold nothing a
        transfer cut off by a crash left behind."""
        for folder in ("outbox", "inbox"):
            where = private_dir(self.kernel.config.state_dir / folder)
            for leftover in where.glob("*.bundle"):
                leftover.unlink(missing_ok=True)

    def _scratch(self, folder: str) -> Path:
        where = self.kernel.config.state_dir / folder
        private_dir(where)  # made at start-up; again if removed since
        return where / f"{secrets.token_hex(8)}.bundle"

    async def export(self, request_id: Any, p: ExportParams, writer: asyncio.StreamWriter) -> None:
        if p.path is not None:
            raise InvalidInput(
                "export no longer writes a file where the client names it (it wrote with "
                "the daemon's rights); the bundle comes back over the connection: use "
                "'sessionctl export NAME -o PATH', which writes PATH as you"
            )
        path = self._scratch("outbox")
        try:
            exported = await self.kernel.export(p.name, str(path))
            size = path.stat().st_size
            result: ExportedBundle = {
                "path": None,
                "events": exported["events"],
                "session": exported["session"],
                "bytes": size,
                "sha256": await asyncio.to_thread(_sha256_of, path),
            }
            await reply(writer, {"id": request_id, "ok": True, "result": result, "body": size})
            with path.open("rb") as f:
                while chunk := await asyncio.to_thread(f.read, CHUNK):
                    writer.write(chunk)
                    await writer.drain()
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    async def import_(
        self,
        request_id: Any,
        p: ImportParams,
        frames: Frames,
        writer: asyncio.StreamWriter,
    ) -> None:
        if p.path is not None:
            raise InvalidInput(
                "import no longer reads a file the client names (it read with the daemon's "
                "rights); send the bundle's bytes: 'sessionctl import FILE' does"
            )
        if p.bytes is None or p.sha256 is None:
            raise InvalidInput("import needs the body's size (bytes) and its sha256")
        path = self._scratch("inbox")
        try:
            digest = hashlib.sha256()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                async for chunk in frames.body(p.bytes):
                    digest.update(chunk)
                    await asyncio.to_thread(f.write, chunk)
            if digest.hexdigest() != p.sha256:
                raise InvalidInput(
                    f"the bundle's bytes do not match their sha256 (sent {p.sha256}, got "
                    f"{digest.hexdigest()}): it was damaged on the way; send it again"
                )
            try:
                offer = p.handover.model_dump() if p.handover is not None else None
                result = await self.kernel.import_(str(path), p.name, offer)
            except SessiondError as exc:
                # The refusal names the file the client sent, not our scratch copy.
                label = p.source or "the bundle sent"
                exc.args = (str(exc).replace(str(path), label),)
                raise
            await reply(writer, {"id": request_id, "ok": True, "result": result})
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
