"""Thousands of malformed frames at the socket: each gets an error or is closed,
the daemon keeps serving, nothing is lost."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import orjson

from tests.e2e.harness import running

NOTES = 'name = "notes"\n'


def junk_frames(rng: random.Random, count: int) -> list[bytes]:
    methods = ["ping", "ps", "show", "send", "fork", "log", "create", "nope", "", None, 7]
    frames: list[bytes] = []
    for _ in range(count):
        kind = rng.randrange(9)
        if kind == 0:
            frames.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) + b"\n")
        elif kind == 1:  # invalid UTF-8 inside JSON
            frames.append(b'{"id":1,"method":"ping\xff\xfe","params":{}}\n')
        elif kind == 2:  # deep nesting
            depth = rng.choice([100, 1000, 5000])
            frames.append(b"[" * depth + b"]" * depth + b"\n")
        elif kind == 3:  # wrong types for known methods
            value: object = rng.choice([None, 1, "x", [], {}, True, 1.5, "../../etc/passwd"])
            method = rng.choice(methods)
            params = {rng.choice(["name", "to", "text", "at", "new", "since"]): value}
            frames.append(
                orjson.dumps({"id": rng.randrange(10), "method": method, "params": params}) + b"\n"
            )
        elif kind == 4:  # not an object
            frames.append(rng.choice([b"[]\n", b"1\n", b'"ping"\n', b"null\n", b"{}\n"]))
        elif kind == 5:  # path traversal in names
            name = rng.choice(["../x", "/etc", "a/../../b", ".hidden", "x" * 300, "NUL\x00"])
            frames.append(
                orjson.dumps({"id": 1, "method": "show", "params": {"name": name}}) + b"\n"
            )
        elif kind == 6:  # bad params container
            frames.append(orjson.dumps({"id": 1, "method": "ps", "params": [1, 2]}) + b"\n")
        elif kind == 7:  # unknown keys
            frames.append(orjson.dumps({"id": 1, "method": "ps", "params": {"evil": 1}}) + b"\n")
        else:  # unicode garbage that is valid JSON
            text = "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(50))
            frames.append(orjson.dumps({"id": text, "method": text, "params": {}}) + b"\n")
    return frames


def send_all(path: Path, frames: list[bytes]) -> list[dict[str, object]]:
    """Send frames on one connection, reading an answer after each; reconnect when the
    daemon closes the connection (it does so after a frame it cannot delimit)."""
    answers: list[dict[str, object]] = []
    sock = _connect(path)
    buf = b""
    for frame in frames:
        try:
            sock.sendall(frame)
            while b"\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionResetError
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            answers.append(orjson.loads(line))
        except (ConnectionResetError, BrokenPipeError):
            sock.close()
            sock = _connect(path)
            buf = b""
    sock.close()
    return answers


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.settimeout(30)
    return sock


def test_thousands_of_malformed_frames_harm_nothing() -> None:
    with running() as d:
        d.ctl("create", str(d.write_spec("notes", NOTES)), check=True)
        d.ctl("send", "notes", "keep me", check=True)
        before = d.json("log", "notes")
        answers = send_all(d.socket, junk_frames(random.Random(1234), 3000))
        assert len(answers) > 2500
        assert all(a.get("ok") is False for a in answers if "error" in a)
        codes = {a["error"]["code"] for a in answers if "error" in a}  # type: ignore[index]
        assert codes <= {
            "bad_request",
            "invalid_input",
            "bad_name",
            "no_such_session",
            "unknown_method",
        }
        assert "internal" not in codes
        assert d.json("ping")["sessions"] == 1
        assert d.json("log", "notes") == before
        assert d.proc is not None
        assert d.proc.poll() is None


def test_an_oversized_frame_gets_an_error_and_the_daemon_goes_on(tmp_path: Path) -> None:
    with running() as d:
        big = b'{"id":1,"method":"ping","params":{"x":"' + b"a" * (2 << 20) + b'"}}\n'
        answers = send_all(d.socket, [big, b'{"id":2,"method":"ping","params":{}}\n'])
        assert answers[0]["error"]["code"] == "frame_too_large"  # type: ignore[index]
        assert answers[1]["ok"] is True  # the same connection goes on
        assert d.json("ping")["pid"] == d.proc.pid  # type: ignore[union-attr]


def test_half_open_and_many_idle_clients_do_not_block_others() -> None:
    with running('read_timeout = "1s"\n') as d:
        idle = [_connect(d.socket) for _ in range(300)]
        half = _connect(d.socket)
        half.sendall(b'{"id":1,"method":"pi')  # and never finishes
        assert d.json("ping")["sessions"] == 0  # served while 301 others hang around
        half.settimeout(10)
        assert half.recv(10) == b""  # the half-open one is closed after read_timeout
        for s in [*idle, half]:
            s.close()
