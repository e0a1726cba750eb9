"""A session program that tries to get out of its sandbox (tests/e2e/test_sandbox.py).

Standard library only. Every attempt is written to ``ledger.json`` in its
workspace as ``{attempt: {"refused": bool, "detail": str}}``: the test (the
operator) checks each one was refused. What it aims at comes from the
environment, as an attacker who knows the machine's layout would know it:
``ESCAPE_STATE`` (the daemon's state dir), ``ESCAPE_CONTROL`` (the control
socket), ``ESCAPE_NOTICES``, ``ESCAPE_CONFIG``, ``ESCAPE_OTHER`` (a file in
another session's workspace), ``ESCAPE_SUID`` (a setuid-root program),
``ESCAPE_PIDS`` (the daemon's and its spawner's pids, outside the sandbox).
The holder's pid it waits for in ``holder.pid`` (written by the test once the
run is on record).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

LEDGER: dict[str, dict[str, object]] = {}
STATE = Path(os.environ["ESCAPE_STATE"])


def attempt(name: str, action: Callable[[], object]) -> None:
    """Run one attempt: refused when it raises (what the kernel said is the detail)."""
    try:
        got = action()
    except OSError as exc:
        LEDGER[name] = {"refused": True, "detail": f"{type(exc).__name__}: {exc}"}
    else:
        LEDGER[name] = {"refused": False, "detail": repr(got)[:500]}


def read(path: str) -> bytes:
    data = Path(path).read_bytes()
    if not data:  # an empty file over the real one: nothing to read
        raise OSError(f"{path} reads empty (hidden)")
    return data


def listing(path: Path) -> list[str]:
    found = os.listdir(path)
    if not found:
        raise OSError(f"{path} is empty (hidden)")
    return found


def connect(path: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(b'{"id": 1, "method": "ps", "params": {}}\n')
        return sock.recv(65536).decode()


def write_outside() -> str:
    written = []
    for path in ("/etc/escaped", str(STATE / "escaped"), str(Path(__file__).parent / "escaped")):
        with open(path, "w") as f:
            f.write("out")
        written.append(path)
    return ", ".join(written)


def setuid() -> str:
    """A setuid-root program: its effective uid must stay ours (no_new_privs)."""
    done = subprocess.run(
        [os.environ["ESCAPE_SUID"], "-u"], capture_output=True, text=True, check=False
    )
    euid = done.stdout.strip()
    if euid != "0":
        raise OSError(f"setuid ignored: euid {euid or '?'} ({done.stderr.strip()[:200]})")
    return euid


def su() -> str:
    done = subprocess.run(
        ["su", "-c", "id -u", "root"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode != 0 or done.stdout.strip() != "0":
        raise OSError(f"su failed: exit {done.returncode} {done.stderr.strip()[:200]}")
    return done.stdout


def kill(pids: list[int]) -> str:
    errors = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as exc:
            errors.append(f"{pid}: {exc}")
    if len(errors) != len(pids):
        raise_ok = [p for p in pids if not any(e.startswith(f"{p}:") for e in errors)]
        return f"signalled {raise_ok}"
    raise OSError("; ".join(errors))


def holder_pid() -> int:
    path = Path("holder.pid")
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the test writes it once the run is on record
    return int(path.read_text())


def main() -> None:
    attempt("state dir", lambda: listing(STATE / "sessions"))
    attempt("uids", lambda: read(str(STATE / "uids.json")))
    attempt("links.key", lambda: read(str(STATE / "web" / "links.key")))
    attempt("logins", lambda: read(str(STATE / "web" / "logins.json")))
    attempt("notices", lambda: read(os.environ["ESCAPE_NOTICES"]))
    attempt("config", lambda: read(os.environ["ESCAPE_CONFIG"]))
    attempt("other workspace", lambda: read(os.environ["ESCAPE_OTHER"]))
    attempt("control socket", lambda: connect(os.environ["ESCAPE_CONTROL"]))
    attempt("write outside", write_outside)
    attempt("setuid copy", setuid)
    attempt("su", su)
    outside = [int(p) for p in os.environ["ESCAPE_PIDS"].split(",")]
    attempt("kill spawner and daemon", lambda: kill(outside))
    attempt("kill holder", lambda: kill([holder_pid()]))
    status = Path("/proc/self/status").read_text()
    facts = {
        "uid": os.getuid(),
        "no_new_privs": [ln for ln in status.splitlines() if ln.startswith("NoNewPrivs")],
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "endpoint": connect(os.environ["SESSIOND_SOCKET"]),
        "home": os.environ.get("HOME"),
    }
    Path(os.environ.get("HOME", ".")).joinpath("note").write_text("a home of its own")
    Path("ledger.json").write_text(json.dumps({"attempts": LEDGER, "facts": facts}, indent=1))


if __name__ == "__main__":
    main()
