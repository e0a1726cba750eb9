"""Local HTTP receivers for the tests: a webhook (what Apprise's json:// posts)
and an OTLP/HTTP collector. Each listens on a free port of 127.0.0.1 in a
thread, records what it got, and lets a test wait for it without polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int


@dataclass
class Receiver:
    port: int = 0
    status: int = 200  # what the next requests are answered with
    requests: list[Received] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def accepted(self) -> list[Received]:
        with self.changed:
            return [r for r in self.requests if r.status < 300]

    def wait(self, predicate: Callable[[list[Received]], Any], timeout: float = 30.0) -> Any:
        """Wait (woken by each request) until ``predicate(requests)`` is true; return it."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not (value := predicate(list(self.requests))):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the receiver did not get that: {self.requests}")
                self.changed.wait(left)
            return value


@contextmanager
def receiving(status: int = 200) -> Iterator[Receiver]:
    receiver = Receiver(status=status)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.changed:
                status = receiver.status
                receiver.requests.append(Received(self.path, dict(self.headers), body, status))
                receiver.changed.notify_all()
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
