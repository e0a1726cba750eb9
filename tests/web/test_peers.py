"""The web listener's TCP peer is mapped to its process through /proc: a real
loopback connection made here is found as this process's, with our uid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sessiond.web.peers import GONE, WebPeers, _address, find_socket, holder, is_local


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    try:
        yield client, server
    finally:
        for s in (client, server, listener):
            s.close()


def test_the_kernel_hex_addresses_are_read_in_host_order() -> None:
    assert _address("0100007F:1F90") == (_address("0100007F:1F90")[0], 8080)
    assert str(_address("0100007F:1F90")[0]) == "127.0.0.1"
    assert str(_address("00000000000000000000000001000000:0050")[0]) == "::1"


def test_a_local_peer_is_found_with_its_uid_and_process(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    client, server = connection
    peer, us = server.getpeername(), server.getsockname()
    sock = find_socket(peer, us)
    assert sock is not None
    assert sock.uid == os.getuid()
    assert sock.inode == os.fstat(client.fileno()).st_ino
    assert holder(sock) == os.getpid()
    assert holder(sock, frozenset({os.getpid()})) is None  # the daemon skips itself


def test_a_peer_not_on_this_machine_is_nobody_s_run() -> None:
    assert find_socket(("192.0.2.7", 40000), ("127.0.0.1", 1)) is None
    assert not is_local("192.0.2.7")
    assert WebPeers().refusal(("192.0.2.7", 40000), ("127.0.0.1", 1)) is None


def test_a_local_peer_gone_from_the_tables_is_refused_not_taken_for_a_remote_one() -> None:
    """Before: a loopback peer whose socket was gone (reset) was "on another machine"."""
    for host in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"):
        assert is_local(host), host
        assert WebPeers().refusal((host, 40000), (host, 1)) == GONE
    assert "try again" in GONE


def test_a_socket_held_by_two_processes_is_judged_by_every_holder(
    connection: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, server = connection
    monkeypatch.delenv("SESSIOND_RUN_MARK", raising=False)
    code = "import sys; print('ready', flush=True); sys.stdin.readline()"
    env = {**os.environ, "SESSIOND_RUN_MARK": "x:thief:r1"}
    with subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=(client.fileno(),),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as run:  # fmt: skip
        assert run.stdout is not None
        assert run.stdout.readline() == b"ready\n"
        try:
            why = WebPeers(skip=frozenset()).refusal(server.getpeername(), server.getsockname())
            assert why is not None
            assert "run r1 of session 'thief'" in why
        finally:
            run.communicate(b"\n", timeout=30)


def test_a_process_that_is_no_run_s_may_use_the_console(
    connection: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, server = connection
    monkeypatch.delenv("SESSIOND_RUN_MARK", raising=False)
    assert "SESSIOND_RUN_MARK" not in os.environ  # pytest is started by a person
    assert WebPeers(skip=frozenset()).refusal(server.getpeername(), server.getsockname()) is None


def test_the_run_user_s_process_is_refused(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    _, server = connection
    why = WebPeers(frozenset({os.getuid()}), frozenset()).refusal(
        server.getpeername(), server.getsockname()
    )
    assert why is not None
    assert "[run] user" in why
