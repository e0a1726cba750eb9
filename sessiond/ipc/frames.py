"""The frame layer of a connection: newline-delimited JSON, both ways.

Requests come in as lines of at most ``max_frame_bytes``; answers go out as one
encoded line each (sessiond.wire.encode). This is the only place that knows
frames are lines, so the server, the dispatch and the log stream deal in
messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from sessiond.log.pace import BATCH, Pacer
from sessiond.wire import Frame, encode

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

    async def body(self, size: int, chunk: int = 1 << 20) -> AsyncIterator[bytes]:
        """The ``size`` raw bytes that follow a frame (a method with a body, such as
        ``import``): what is already buffered first, then from the socket."""
        left = size
        if self.buf:
            take = bytes(self.buf[:left])
            del self.buf[:left]
            left -= len(take)
            if take:
                yield take
        while left > 0:
            data = await self.reader.read(min(chunk, left))
            if not data:
                raise BodyAborted(f"the connection closed {left} bytes before the body's end")
            left -= len(data)
            yield data


class BodyAborted(ConnectionError):
    """The client went away before its body was whole: nothing of it is used."""


async def reply(writer: asyncio.StreamWriter, message: Frame) -> None:
    """Send one answer and wait until the client has taken it (backpressure)."""
    result = message.get("result")
    if isinstance(result, list) and len(result) > BATCH:
        await _reply_in_pieces(writer, message, result)
        return
    writer.write(encode(message))
    await writer.drain()


async def reply_encoded(writer: asyncio.StreamWriter, request_id: Any, items: list[bytes]) -> None:
    """A successful answer whose result is a list of items already encoded as JSON
    (``log``: the events as the log holds them), written a batch at a time."""
    writer.write(encode({"id": request_id, "ok": True})[:-2] + b',"result":[')
    pacer = Pacer()
    for start in range(0, len(items), BATCH):
        piece = b",".join(items[start : start + BATCH])
        items[start : start + BATCH] = [b""] * len(items[start : start + BATCH])  # freed as sent
        writer.write(piece if start == 0 else b"," + piece)
        await writer.drain()
        await pacer.tick()
    writer.write(b"]}\n")
    await writer.drain()


async def _reply_in_pieces(writer: asyncio.StreamWriter, message: Frame, result: list[Any]) -> None:
    """The same one frame, encoded and written a batch of items at a time: the
    answer of ``log`` or ``replay`` on a 100,000-event session is tens of megabytes
    of JSON, which in one ``orjson.dumps`` kept the loop from everything else for
    tens of milliseconds. The client reads the same line either way."""
    head = encode({k: v for k, v in message.items() if k != "result"})
    writer.write(head[:-2] + b',"result":[')  # head ends with b"}\n"
    pacer = Pacer()
    for start in range(0, len(result), BATCH):
        piece = orjson.dumps(result[start : start + BATCH], option=orjson.OPT_NON_STR_KEYS)
        # Each item is freed once sent (the answer is built for this reply alone):
        # tens of thousands freed at once, after the last, held the loop too.
        result[start : start + BATCH] = [None] * len(result[start : start + BATCH])
        writer.write(piece[1:-1] if start == 0 else b"," + piece[1:-1])
        await writer.drain()  # a slow reader holds back the encoding, not memory
        await pacer.tick()
    writer.write(b"]}\n")
    await writer.drain()


def error(request_id: Any, code: str, message: str, exit_code: int) -> Frame:
    """A failure answer: the code and exit code are the wire's (docs/rpc.md, "Errors")."""
    return {
        "id": request_id,
        "ok": False,
        "error": {"code": code, "message": message, "exit": exit_code},
    }
