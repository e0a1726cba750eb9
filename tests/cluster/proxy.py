"""A PostgreSQL Unix-socket proxy a test can freeze: while frozen it keeps every
connection open and forwards nothing, in either direction, and accepts no new
ones (they wait in the backlog): the database, as one node sees it, stops
answering without closing anything (a partition, a hung server)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import quote

PORT = 5432


class FrozenProxy:
    def __init__(self, target_dir: Path) -> None:
        self.target = str(target_dir / f".s.PGSQL.{PORT}")
        self.dir = Path(tempfile.mkdtemp(prefix="pgproxy-", dir="/tmp"))
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.dir / f".s.PGSQL.{PORT}"))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._running = threading.Event()  # set: forwarding; clear: frozen
        self._running.set()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def dsn(self, dsn: str, host: Path) -> str:
        """``dsn`` (one on ``host``'s socket) through this proxy."""
        return dsn.replace(quote(str(host), safe=""), quote(str(self.dir), safe=""))

    def freeze(self) -> None:
        self._running.clear()

    def thaw(self) -> None:
        self._running.set()

    def close(self) -> None:
        self._closed = True
        self._running.set()
        self._thread.join(5)
        for key in list(self._sel.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()

    def _loop(self) -> None:
        while not self._closed:
            self._running.wait()
            for key, _ in self._sel.select(timeout=0.05):
                if not self._running.is_set():
                    break
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        client, _ = self._listener.accept()
                        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        server.connect(self.target)
                        self._sel.register(client, selectors.EVENT_READ, server)
                        self._sel.register(server, selectors.EVENT_READ, client)
                    continue
                src, dst = key.fileobj, key.data
                try:
                    data = src.recv(65536)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if not data:
                    for end in (src, dst):
                        with contextlib.suppress(KeyError, ValueError):
                            self._sel.unregister(end)
                        with contextlib.suppress(OSError):
                            end.close()  # type: ignore[union-attr]
                    continue
                with contextlib.suppress(OSError):
                    dst.sendall(data)
