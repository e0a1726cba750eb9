"""Idle connections to the gateway cannot take the daemon's file descriptors.

The gateway's port is on loopback, reachable by every local user before any token
is asked. A local user holding connections by the thousand once ran the daemon
out of descriptors: the operator's ``sessionctl ps`` was then refused (its peer
could not be examined). Now the gateway holds a part of the descriptors at most
and one uid an eighth of that: the connections past it are answered 503, saying
so, and the daemon goes on serving everyone else."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sessiond.gateway.scripted import Upstream
from tests.e2e.harness import SESSIOND, Daemon, short_dir
from tests.gateway.rig import ANTHROPIC_KEY, OPENAI_KEY, PROVIDERS

FDS = 1024  # the daemon's descriptors: its gateway holds a quarter, 256, one uid 32


@contextmanager
def small_daemon() -> Iterator[tuple[Daemon, int]]:
    root = short_dir()
    key_file = root / "openai.key"
    key_file.write_text(OPENAI_KEY)
    try:
        with Upstream() as up:
            d = Daemon(root, PROVIDERS.format(url=up.url, key_file=key_file),
                       env={"GW_TEST_ANTHROPIC_KEY": ANTHROPIC_KEY})  # fmt: skip
            d.command = ["prlimit", f"--nofile={FDS}:{FDS}", SESSIOND]
            d.start()
            try:
                line = next(x for x in d.lines if x.get("event") == "gateway.listening")
                yield d, int(line["address"].rsplit(":", 1)[1])
            finally:
                d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def answer(sock: socket.socket) -> bytes:
    """What the gateway says on a connection (a refused one is answered at once)."""
    sock.settimeout(60)  # only a hang: a refused connection is answered at once
    try:
        return sock.recv(4096)
    except TimeoutError:
        return b""


def test_a_local_user_holding_connections_leaves_the_daemon_serving() -> None:
    with small_daemon() as (d, port):
        held = []
        try:
            for _ in range(FDS + 100):  # as the daemon's own uid: no share, the whole
                held.append(socket.create_connection(("127.0.0.1", port)))
            # the last ones were refused, saying why, in the providers' error shape
            said = answer(held[-1])
            assert said.startswith(b"HTTP/1.1 503"), said
            body = json.loads(said.split(b"\r\n\r\n", 1)[1])
            assert "too many connections" in body["error"]["message"]
            # and the operator is still served
            ps = d.ctl("ps")
            assert ps.returncode == 0, ps.stderr
        finally:
            for sock in held:
                sock.close()
        assert d.proc is not None
        assert d.proc.poll() is None  # alive


ASK = b"POST /run/x/r1/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
HOLDER = """
import encodings.idna, json, os, socket, sys  # (the codec before the uid cannot read it)
os.setgid(65534); os.setuid(65534)
port, n, ask = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
said = {}
for s in held:  # all held at once; then each asks: refused ones were answered 503
    s.settimeout(60)
    try:
        s.sendall(ask)
    except OSError:
        pass
    status = s.recv(4096).split(b" ", 2)[1:2]
    key = status[0].decode() if status else "closed"
    said[key] = said.get(key, 0) + 1
print(json.dumps(said), flush=True)
sys.stdin.read()
"""


def test_one_uid_holds_its_share_and_others_still_get_in() -> None:
    with small_daemon() as (_d, port), subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(port), "100", ASK.decode()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        assert holder.stdout is not None
        assert holder.stdin is not None
        said = json.loads(holder.stdout.readline())
        # its share, an eighth of 256, asked and was answered (no token: 401);
        # the rest was refused as busy
        assert said == {"401": 32, "503": 100 - 32}, said
        # while it holds them, another uid (here the daemon's) still gets in
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(ASK)
            assert answer(sock).startswith(b"HTTP/1.1 401")
        holder.stdin.close()
