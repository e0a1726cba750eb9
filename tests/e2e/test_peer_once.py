"""The control socket examines its peer once a connection, then asks at each
request only whether that process still lives (sessiond.ipc.runpeer): the
cached verdict gives nobody more than the per-request one did. Real daemon,
real runs (unconfined, as in tests/e2e/test_identity.py: a sandboxed run cannot
reach the control socket at all), connections handed on with SCM_RIGHTS.

- a connection made by an operator's process and handed to a run's program acts
  for that process only while it lives: once it has exited (a zombie not yet
  reaped included) the run's requests on it are refused, with the reason;
- a run's connections, handed to an operator once the run has ended, carry
  nothing: the program endpoint's token died with the run, and the control
  socket's refusal stays with the connection whoever holds it now.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.harness import Daemon, running, short_dir, wait_event
from tests.e2e.test_identity import UNCONFINED

CALL = r"""
import json, os, socket, sys
def call(sock, method, params, token=None):
    frame = {"id": 1, "method": method, "params": params}
    if token is not None:
        frame["token"] = token
    sock.sendall(json.dumps(frame).encode() + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data)
"""

# A run's program: takes a connection handed to it by the test, sends on it, and
# writes the answer down.
TAKER = (
    CALL
    + r"""
test = socket.socket(socket.AF_UNIX)
test.connect(sys.argv[1])
_, fds, _, _ = socket.recv_fds(test, 16, 1)
handed = socket.socket(fileno=fds[0])
answer = call(handed, "send", {"to": "victim", "text": "from a handed connection"})
json.dump(answer, open("answer.json", "w"))
"""
)

# An operator's process: connects, is examined (ps), hands its connection to the
# test, exits.
CONNECTOR = (
    CALL
    + r"""
control = socket.socket(socket.AF_UNIX)
control.connect(sys.argv[1])
assert call(control, "ps", {})["ok"], "an operator's process is served"
to_test = socket.socket(fileno=int(sys.argv[2]))
socket.send_fds(to_test, [b"control"], [control.fileno()])
"""
)

# A run's program: one connection to each endpoint, a request on each, both handed
# to the test, then it ends (and its run with it).
GIVER = (
    CALL
    + r"""
program = socket.socket(socket.AF_UNIX)
program.connect(os.environ["SESSIOND_SOCKET"])
control = socket.socket(socket.AF_UNIX)
control.connect(sys.argv[2])
token = os.environ["SESSIOND_TOKEN"]
out = {"program": call(program, "ps", {}, token), "control": call(control, "ps", {}),
       "token": token}
test = socket.socket(socket.AF_UNIX)
test.connect(sys.argv[1])
socket.send_fds(test, [json.dumps(out).encode()], [program.fileno(), control.fileno()])
"""
)


def call(sock: socket.socket, method: str, params: dict[str, Any], **extra: Any) -> Any:
    sock.sendall(json.dumps({"id": 1, "method": method, "params": params, **extra}).encode())
    sock.sendall(b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        assert chunk, f"the daemon closed the connection after {data!r}"
        data += chunk
    return json.loads(data)


def start(d: Daemon, name: str, program: str, *args: str) -> Path:
    """Start ``program`` as session ``name``'s run, unconfined; its workspace."""
    ws = d.root / f"ws-{name}"
    ws.mkdir()
    (ws / "program.py").write_text(program)
    argv = ", ".join(f'"{a}"' for a in ["/usr/bin/python3", "-I", "program.py", *args])
    spec = f'name = "{name}"\n[run]\nexec = [{argv}]\ncwd = "{ws}"\nretries = 0\n'
    d.ctl("create", str(d.write_spec(name, spec)), check=True)
    d.ctl("activate", name, check=True)
    return ws


def finished(d: Daemon, name: str) -> None:
    done = wait_event(d, name, "run.finished")
    assert done["data"].get("exit_code") == 0, (done, d.ctl("output", name, "--stderr").stdout)


def test_an_operators_connection_handed_to_a_run_is_refused_once_its_process_has_exited() -> None:
    """The operator's process connects, is examined and served, hands its socket
    to the test and exits; the test keeps it a zombie (not reaped) and hands the
    socket on to a run's program, whose send on it is refused: the connection
    acted for a process that is no longer there. (A pidfd signal alone would have
    let it through: a zombie still takes signals.)"""
    folder = short_dir()
    try:
        with running(UNCONFINED) as d, socket.socket(socket.AF_UNIX) as listener:
            d.ctl("create", str(d.write_spec("victim", 'name = "victim"\n')), check=True)
            listener.bind(str(folder / "t.sock"))
            listener.listen()
            listener.settimeout(60)
            ws = start(d, "taker", TAKER, str(folder / "t.sock"))
            taker, _ = listener.accept()
            ours, theirs = socket.socketpair()
            connector = subprocess.Popen(
                [sys.executable, "-c", CONNECTOR, str(d.socket), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
            )
            theirs.close()
            try:
                _, fds, _, _ = socket.recv_fds(ours, 16, 1)
                # exited, left unreaped: its pid still names it, a zombie
                os.waitid(os.P_PID, connector.pid, os.WEXITED | os.WNOWAIT)
                socket.send_fds(taker, [b"control"], fds)
                finished(d, "taker")
            finally:
                assert connector.wait(60) == 0
            answer = json.loads((ws / "answer.json").read_text())
            assert answer["ok"] is False, answer
            assert answer["error"]["message"].startswith(
                "this connection may only ping: its process cannot be examined (it has exited)."
            ), answer
            assert not d.json("log", "victim", "--type", "message.received")
            for fd in fds:
                os.close(fd)
            taker.close()
            ours.close()
    finally:
        shutil.rmtree(folder)


def test_a_runs_connections_carry_nothing_once_the_run_has_ended_whoever_holds_them() -> None:
    """A run's program connects to both endpoints, asks on each (served on its
    own endpoint, only-ping on the control socket), hands both connections to the
    test and ends. On the same open connections, the test (an operator's
    process) gets nothing: the run's token died with the run, and the control
    connection's refusal stays with it."""
    folder = short_dir()
    try:
        with running(UNCONFINED) as d, socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(folder / "t.sock"))
            listener.listen()
            listener.settimeout(60)
            start(d, "giver", GIVER, str(folder / "t.sock"), str(d.socket))
            given, _ = listener.accept()
            data, fds, _, _ = socket.recv_fds(given, 1 << 16, 2)
            out = json.loads(data)
            assert out["program"]["ok"] is True, out  # granted ps, during its run
            refusal = out["control"]["error"]["message"]
            assert (
                "may only ping: it is a process of a run (run r1 of session 'giver')" in refusal
            ), out
            finished(d, "giver")  # the run has ended; its connections stay open
            program = socket.socket(fileno=fds[0])
            control = socket.socket(fileno=fds[1])
            with program, control, given:
                after = call(program, "ps", {}, token=out["token"])
                assert after["ok"] is False, after
                assert "belongs to a run that has ended" in after["error"]["message"], after
                still = call(control, "ps", {})
                assert still["ok"] is False, still
                assert still["error"]["message"] == refusal  # the same: it sticks
                assert call(control, "ping", {})["ok"] is True  # and it may ping
    finally:
        shutil.rmtree(folder)
