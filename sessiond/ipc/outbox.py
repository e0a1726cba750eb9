"""Answers waiting for a client, kept as the pieces they were made of.

The early server (sessiond.ipc.early) answers ``ps`` with the rows it encoded
once for the listing: a ps answer of 10,000 rows is several MB, and joining it
into one buffer (or appending it to a bytearray) copies it, which costs the
first answer a few ms, most of it faulting in the fresh pages it is copied to.
Here the pieces wait as they are and go out in one ``sendmsg`` each time; a
piece the kernel takes in part is kept as a view of its rest.
"""

from __future__ import annotations

import socket

# Buffers given to one sendmsg (Linux's IOV_MAX is 1024).
SEND_PIECES = 512


class Outbox:
    __slots__ = ("pieces", "size")

    def __init__(self) -> None:
        self.pieces: list[bytes | memoryview] = []
        self.size = 0  # bytes waiting

    def __bool__(self) -> bool:
        return self.size > 0

    def queue(self, pieces: list[bytes]) -> None:
        pieces = [p for p in pieces if p]  # (an empty one would wait for ever)
        self.pieces += pieces
        self.size += sum(map(len, pieces))

    def send(self, sock: socket.socket) -> None:
        """As much as ``sock`` takes now (BlockingIOError: nothing)."""
        self.sent(sock.sendmsg(self.pieces[:SEND_PIECES]))

    def sent(self, count: int) -> None:
        """Drop the first ``count`` bytes."""
        self.size -= count
        pieces = self.pieces
        done = 0
        while count and count >= len(pieces[done]):
            count -= len(pieces[done])
            done += 1
        del pieces[:done]
        if count:
            pieces[0] = memoryview(pieces[0])[count:]

    def unsent(self) -> bytes:
        return b"".join(self.pieces)
