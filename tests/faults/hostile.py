"""What the hostile tests share: the daemon's documented promises and ways to
talk to the real daemon and check it survived.

tests/faults/ — the hostile part of the "prove it" issue
--------------------------------------------------------
Each hostile test starts the real ``sessiond`` (tests/e2e/harness.py) and drives it
through its socket or the real ``sessionctl``; ``conftest.py`` reaps the daemons.
Every case is refused with a clear error, the daemon still serves, and nothing is
lost. The tests are in two modules by what the attacker holds:

* test_hostile_rpc.py: a socket — fuzzed RPC frames, a run token replayed after
  its run ended;
* test_hostile_paths.py: a path — session names, artifact references, bundles
  through ``sessionctl import``, symlinks planted in the state dir.
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from sessiond.ipc.dispatch import ANSWER_PARAMS, METHOD_PARAMS, STREAMED
from tests.e2e.harness import Daemon, wait_event

ROOT = Path(__file__).resolve().parents[2]
SENTINEL = "keep"


# --- what the daemon promises ---------------------------------------------------------


def documented_errors() -> dict[str, int]:
    """Error code -> exit code, from the table in docs/rpc.md (the contract)."""
    section = (ROOT / "docs" / "rpc.md").read_text().split("## Errors", 1)[1].split("\n## ")[0]
    codes: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].isdigit():
            codes.update(dict.fromkeys(re.findall(r"`([a-z_]+)`", cells[0]), int(cells[1])))
    return codes


def dispatch_table() -> dict[str, type[BaseModel]]:
    """Method -> params model, from the server's own method table (so a new method is
    fuzzed too): the params models are known without a kernel."""
    table: dict[str, type[BaseModel]] = dict(STREAMED)
    table.update(METHOD_PARAMS)
    table.update(ANSWER_PARAMS)  # approve, deny, resolve, apply
    return table


ERRORS = documented_errors()
METHODS = dispatch_table()


# --- talking to the daemon ------------------------------------------------------------


def connect(d: Daemon) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(d.socket))
    sock.settimeout(20)  # bounded: a daemon that stops answering fails the test
    return sock


def read_answers(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = []
    buf = b""
    while len(answers) < count:
        while b"\n" not in buf:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise AssertionError(f"the daemon closed the connection after {answers}")
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        answers.append(orjson.loads(line))
    assert not buf, f"more answers than frames: {buf[:200]!r}"
    return answers


def rpc(d: Daemon, method: str, params: dict[str, Any]) -> dict[str, Any]:
    with connect(d) as sock:
        sock.sendall(orjson.dumps({"id": 1, "method": method, "params": params}) + b"\n")
        return read_answers(sock, 1)[0]


def everything(d: Daemon) -> dict[str, list[dict[str, Any]]]:
    """Every session's whole log, through the socket: what "nothing lost" compares."""
    names = [row["name"] for row in rpc(d, "ps", {})["result"]]
    return {n: rpc(d, "log", {"name": n})["result"] for n in names}


# What the daemon logs when something escaped its error handling; "raw" is the
# harness's name for a stderr line that is not JSON (a traceback).
CRASH_EVENTS = {"request.failed", "connection.failed", "raw"}


def serving(d: Daemon) -> None:
    """The daemon is alive and answers, and it logged no unexpected exception."""
    assert d.proc is not None
    assert d.proc.poll() is None
    assert rpc(d, "ping", {})["ok"] is True
    crashes = [line for line in d.lines if line.get("event") in CRASH_EVENTS]
    assert not crashes, crashes


def refused(done: subprocess.CompletedProcess[str], code: str, *needles: str) -> str:
    """`sessionctl --json ...` was refused with ``code`` and its documented exit code;
    the message names each needle."""
    error = orjson.loads(done.stdout)["error"]
    assert error["code"] == code, error
    assert done.returncode == ERRORS[code], (done.returncode, error)
    for needle in needles:
        assert needle in error["message"], (needle, error)
    message: str = error["message"]
    assert message in done.stderr  # people see it too
    return message


def make_sentinel(d: Daemon) -> None:
    d.ctl("create", str(d.write_spec(SENTINEL, f'name = "{SENTINEL}"\n')), check=True)
    d.ctl("send", SENTINEL, "keep me", check=True)


def run_job(d: Daemon, name: str, script: str) -> dict[str, Any]:
    """A command session whose run leaves its stdout as an artifact; the run.finished."""
    (d.root / name).mkdir()
    spec = f'name = "{name}"\n[run]\nexec = ["sh", "-c", "{script}"]\ncwd = "{d.root / name}"\n'
    d.ctl("create", str(d.write_spec(name, spec)), check=True)
    d.ctl("activate", name, check=True)
    return wait_event(d, name, "run.finished")
