"""The daemon answers while it works through a big session (issue 13).

``log``, ``replay``, ``fork`` and ``export`` of a big session used to run
in the event loop in one piece: nothing else was answered until they were done.
Each check here starts one of them on one connection, waits until the daemon is
reading the session's log for it (a second open file of events.jsonl in
/proc/PID/fd), pings on another connection, and requires the ping's answer to
come while the first request has had no answer yet. No timing threshold: the
order of the two answers is the assertion.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import orjson
import pytest

from sessiond.bench.loop import big_session
from tests.e2e.harness import Daemon, short_dir, wait_for

EVENTS = 50_000  # seconds of work each: far longer than a ping, short enough for a test


def _log_readers(pid: int, log: Path) -> int:
    """How many files the daemon has open on ``log``."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(log):
                count += 1
        except OSError:
            continue  # closed meanwhile
    return count


def _send(sock_path: Path, method: str, params: dict[str, object]) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(120)
    sock.connect(str(sock_path))
    sock.sendall(orjson.dumps({"id": 1, "method": method, "params": params}) + b"\n")
    return sock


def _line(sock: socket.socket) -> bytes:
    """The first line (an answer of tens of MB: no quadratic concatenation)."""
    parts: list[bytes] = []
    while True:
        chunk = sock.recv(1 << 20)
        assert chunk, "the daemon closed the connection"
        end = chunk.find(b"\n")
        if end >= 0:
            parts.append(chunk[: end + 1])
            return b"".join(parts)
        parts.append(chunk)


@pytest.mark.timeout(300)  # a loaded machine: four passes over a big log, and a fork
def test_ping_is_answered_while_a_big_session_is_logged_replayed_forked_exported() -> None:
    root = short_dir()
    d = Daemon(root)
    try:
        big_session(d.state_dir, "big", EVENTS)
        d.start()
        assert d.proc is not None
        log = (d.state_dir / "sessions" / "big" / "events.jsonl").resolve()
        pid = d.proc.pid
        before = _log_readers(pid, log)  # the session's own open log
        ops: list[tuple[str, dict[str, object]]] = [
            ("replay", {"name": "big", "view": "trace"}),
            ("log", {"name": "big"}),
            ("fork", {"name": "big", "new": "child"}),
            ("export", {"name": "big"}),
        ]
        for method, params in ops:
            with _send(d.socket, method, params) as busy:
                wait_for(
                    lambda: _log_readers(pid, log) > before, timeout=60, what=f"{method} reading"
                )
                with _send(d.socket, "ping", {}) as ping:
                    answer = orjson.loads(_line(ping))
                assert answer["ok"], answer
                busy.setblocking(False)
                try:
                    early = busy.recv(1)
                except BlockingIOError:
                    early = None
                assert early is None, f"the {method} was answered before the ping: the loop stalled"
                busy.setblocking(True)
                head = orjson.loads(_line(busy))  # and it does finish, whole
                assert head["ok"], head
        assert d.json("show", "child")["parent"] == "big"
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)
