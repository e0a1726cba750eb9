"""The early server: ping and ps answered from the table index before the daemon
has imported and loaded the rest, then the full server takes over the same
socket (sessiond.daemon.early, sessiond.ipc.early).

The test-only hold ``fault_hold = "serve"`` stops the start just before the full
server would take the socket over, until a file exists: everything asked
meanwhile reaches the early server alone (the full server has not said
``server.listening`` yet). Nothing waits on time: on the daemon's log lines."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.e2e.harness import SESSIOND, Daemon, short_dir

PLAIN = 'name = "{name}"\n[run]\nexec = ["true"]\n'
CRON = PLAIN + '[[trigger]]\ntype = "cron"\nschedule = "0 3 * * *"\n'
# A client in a process of its own: sends the requests given (JSON lines) in one
# write, then prints each answer line as it comes.
CLIENT = r"""
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall("".join(line + "\n" for line in sys.argv[2:]).encode())
buf = b""
for _ in sys.argv[2:]:
    while b"\n" not in buf:
        chunk = sock.recv(1 << 20)
        if not chunk:
            sys.exit(3)
        buf += chunk
    line, _, buf = buf.partition(b"\n")
    print(line.decode(), flush=True)
"""


@pytest.fixture
def held() -> Iterator[Daemon]:
    root = short_dir()
    go = root / "go"
    go.touch()  # the first start goes straight through
    d = Daemon(root, f'fault_hold = "serve"\nfault_hold_until = "{go}"\n')
    try:
        d.start()
        for name in ("a", "b"):
            d.ctl("create", str(d.write_spec(name, PLAIN.format(name=name))), check=True)
        d.ctl("create", str(d.write_spec("timer", CRON.format(name="timer"))), check=True)
        d.ctl("suspend", "b", check=True)
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def early(d: Daemon) -> int:
    """Start again, held before the full server; return where its lines begin."""
    (d.root / "go").unlink(missing_ok=True)
    since = len(d.lines)
    d.start(wait=False)
    d.wait_line("fault.held", match=lambda line: line.get("point") == "serve", since=since)
    return since


def release(d: Daemon, since: int) -> None:
    (d.root / "go").touch()
    d.wait_line("daemon.ready", since=since)


def full_server_listens(d: Daemon, since: int) -> bool:
    return any(
        line.get("event") == "server.listening" and line.get("endpoint") == "control"
        for line in d.lines[since:]
    )


def ask(sock: socket.socket, *requests: dict[str, Any]) -> None:
    sock.sendall(b"".join(orjson.dumps(r) + b"\n" for r in requests))


def answer(sock: socket.socket, buf: bytearray) -> Any:
    while b"\n" not in buf:
        chunk = sock.recv(1 << 20)
        assert chunk, "the daemon closed the connection"
        buf += chunk
    end = buf.index(b"\n")
    line = bytes(buf[:end])
    del buf[: end + 1]
    return orjson.loads(line)


def test_ps_while_the_daemon_starts_is_the_full_servers_ps(held: Daemon) -> None:
    d = held
    before = {"all": d.json("ps", "--all"), "default": d.json("ps")}
    d.stop()
    since = early(d)
    during = {"all": d.json("ps", "--all"), "default": d.json("ps")}
    ping = d.json("ping")
    assert not full_server_listens(d, since)  # all of that from the early server
    assert ping["sessions"] == 3
    assert ping["state_dir"] == str(d.state_dir)
    assert during == before
    release(d, since)
    listening = next(line for line in d.lines[since:] if line.get("event") == "server.listening")
    assert listening["early_answered"] >= 3  # the early server's answers
    assert {"all": d.json("ps", "--all"), "default": d.json("ps")} == before


def test_other_requests_wait_for_the_full_server_and_are_served(held: Daemon) -> None:
    d = held
    d.stop()
    since = early(d)
    # one connection: a ping the early server answers, then a show and a suspend
    # it leaves for the full server, in the same write
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(d.socket))
    buf = bytearray()
    ask(
        sock,
        {"id": 1, "method": "ping", "params": {}},
        {"id": 2, "method": "show", "params": {"name": "a"}},
        {"id": 3, "method": "suspend", "params": {"name": "a"}},
    )
    assert answer(sock, buf)["id"] == 1
    assert not full_server_listens(d, since)
    release(d, since)
    shown = answer(sock, buf)
    assert (shown["id"], shown["ok"], shown["result"]["name"]) == (2, True, "a")
    suspended = answer(sock, buf)
    assert (suspended["id"], suspended["ok"]) == (3, True)
    sock.close()
    assert d.json("show", "a")["state"] == "suspended"


def test_a_runs_program_gets_no_more_from_the_early_server(held: Daemon) -> None:
    """A process that carries a run's mark may only ping on the control socket:
    the early server answers its ping, and leaves its ps to the full server,
    which refuses it as it refuses it once started."""
    d = held
    env = {**d.env, "SESSIOND_RUN_MARK": "x:a:1"}
    requests = [
        orjson.dumps({"id": 1, "method": "ping", "params": {}}).decode(),
        orjson.dumps({"id": 2, "method": "ps", "params": {"all": True}}).decode(),
    ]

    def as_run() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(d.socket), *requests],
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    out, _ = as_run().communicate(timeout=60)
    once_started = [orjson.loads(line) for line in out.splitlines()]
    assert once_started[1]["ok"] is False
    assert "may only ping" in once_started[1]["error"]["message"]
    d.stop()
    since = early(d)
    client = as_run()
    assert client.stdout is not None
    pinged = orjson.loads(client.stdout.readline())  # answered by the early server
    assert (pinged["id"], pinged["ok"]) == (1, True)
    assert not full_server_listens(d, since)
    release(d, since)
    refused = orjson.loads(client.stdout.readline())
    client.stdout.close()
    assert client.wait(60) == 0
    assert refused == once_started[1]  # the full server's refusal, word for word
    assert "result" not in refused


def test_a_kill_9_while_the_early_server_serves_loses_nothing(held: Daemon) -> None:
    d = held
    shown = {n: d.json("show", n) for n in ("a", "b", "timer")}
    rows = d.json("ps", "--all")
    d.stop()
    since = early(d)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(d.socket))
    buf = bytearray()
    ask(
        sock,
        {"id": 1, "method": "ping", "params": {}},
        {"id": 2, "method": "suspend", "params": {"name": "a"}},
    )
    assert answer(sock, buf)["id"] == 1  # the suspend waits in the early server
    assert d.json("ps", "--all") == rows
    assert not full_server_listens(d, since)
    d.kill9()
    assert sock.recv(1 << 16) == b""  # closed unanswered: nothing was done
    sock.close()
    (d.root / "go").touch()
    d.start()
    assert d.json("ps", "--all") == rows
    for name, before in shown.items():
        now = d.json("show", name)
        assert {k: now[k] for k in ("state", "reason", "seq")} == {
            k: before[k] for k in ("state", "reason", "seq")
        }


def test_a_bad_configuration_still_fails_the_start_clearly(held: Daemon) -> None:
    d = held
    d.stop()
    good = d.config.read_text()
    d.config.write_text(good + "max_connections = 0\n")  # TOML, but not a valid value
    done = subprocess.run(
        [SESSIOND, "--config", str(d.config),
         "--state-dir", str(d.state_dir), "--socket", str(d.socket)],
        env=d.env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "max_connections" in done.stderr
    assert not os.path.lexists(d.socket)  # the early server's socket is gone with it
    assert not done.stderr.count("Traceback")
    d.config.write_text(good)
    d.start()  # the lock went with it too
    assert len(d.json("ps", "--all")) == 3
