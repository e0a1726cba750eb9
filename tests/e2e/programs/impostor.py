"""A session's program that tries to pass for an operator on the web console.

Standard library only. ``impostor.py MODE URL TOKEN OUT``:

- ``link-reset``: POST its signed approve link URL with no body, then reset the
  connection (SO_LINGER 0, close) before the daemon can look at it; 3 times.
- ``api-reset``: the same with ``POST /api/s/victim/approve`` and a login
  (TOKEN) it stole, as a bearer.
- ``api``: that approve with the stolen login, waiting for the answer.

Whatever it could read of the answers goes to OUT (JSON): the test, the
operator, checks every one was refused, and nothing was approved.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import urllib.parse

TRIES = 3


def request(parts: urllib.parse.SplitResult, mode: str, token: str) -> bytes:
    if mode == "link-reset":
        return (
            f"POST {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()
    return (
        f"POST /api/s/victim/approve HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()


def main() -> None:
    mode, url, token, out = sys.argv[1:5]
    parts = urllib.parse.urlsplit(url)
    answers: list[str] = []
    for _ in range(TRIES if mode.endswith("-reset") else 1):
        sock = socket.create_connection((parts.hostname or "", parts.port or 80), timeout=60)
        if mode.endswith("-reset"):
            # close with a reset: the socket leaves the kernel's tables at once
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(request(parts, mode, token))
            sock.close()
            answers.append("reset")
            continue
        sock.sendall(request(parts, mode, token))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        sock.close()
        answers.append(data.decode(errors="replace"))
    with open(out, "w") as f:
        json.dump(answers, f)


main()
