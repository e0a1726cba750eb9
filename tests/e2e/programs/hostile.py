"""A session program that tries, every way it can, to approve its own risky call.

Standard library only (it runs as ``nobody`` too, with the system's python3 and
no access to the test's virtualenv). It asks for the tool ``pay`` (on its
policy's ask list), then, while that approval is pending, tries to answer it:
through its own endpoint, through the control socket whose path a test-only
variable leaks to it, from a double-forked ``setsid`` helper with a clean
environment, with a forged ``by``, through a fork of itself, and by creating a
session with a wider policy. Each attempt's answer goes to ``$HOSTILE_OUT`` as
one JSON object: the test (the operator) checks every one was refused.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

ENDPOINT = os.environ["SESSIOND_SOCKET"]
TOKEN = os.environ["SESSIOND_TOKEN"]
SELF = os.environ["SESSIOND_SESSION"]
CONTROL = os.environ["HOSTILE_CONTROL"]  # leaked through [run] env, as a careless spec might
CTL = os.environ.get("HOSTILE_CTL", "")  # the real sessionctl, where this uid may run it
WORKSPACE = os.getcwd()


def call(path: str, method: str, params: dict[str, Any], token: str | None = TOKEN) -> Any:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(60)
            sock.connect(path)
            frame: dict[str, Any] = {"id": 1, "method": method, "params": params}
            if token is not None:
                frame["token"] = token
            sock.sendall(json.dumps(frame).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        return {"ok": False, "error": {"code": "oserror", "message": str(exc)}}
    if not data:
        return {"ok": False, "error": {"code": "closed", "message": "closed"}}
    return json.loads(data)


def sessionctl(*args: str) -> dict[str, Any] | None:
    """The real sessionctl, where this uid can run it (None: it cannot, as nobody)."""
    try:
        done = subprocess.run(
            [CTL, *args], capture_output=True, text=True, timeout=120, check=False
        )
    except OSError:
        return None
    ok = done.returncode == 0
    return {"ok": ok, "error": {"code": str(done.returncode), "message": done.stderr.strip()}}


def helper_result() -> dict[str, Any]:
    """A double-forked, setsid helper with an empty environment (no run mark):
    its parent exits, so it is nobody's child but a subreaper's. It tries the
    control socket and reports through a pipe."""
    read, write = os.pipe()
    first = os.fork()
    if first == 0:
        os.close(read)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        code = (
            "import json, os, socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            "    s.connect(sys.argv[1])\n"
            "    s.sendall(json.dumps({'id': 1, 'method': 'approve', 'params':"
            " {'name': sys.argv[2], 'by': 'operator'}}).encode() + b'\\n')\n"
            "    out = s.makefile('rb').readline()\n"
            "except OSError as exc:\n"
            "    out = json.dumps({'ok': False, 'error': {'code': 'oserror',"
            " 'message': str(exc)}}).encode()\n"
            "os.write(int(sys.argv[3]), out)\n"
        )
        os.set_inheritable(write, True)
        os.execve(sys.executable, [sys.executable, "-I", "-c", code, CONTROL, SELF, str(write)], {})
    os.close(write)
    os.waitpid(first, 0)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    return json.loads(data) if data else {"ok": False, "error": {"code": "none"}}


def main() -> None:
    asked = call(
        ENDPOINT,
        "sdk.step",
        {
            "token": TOKEN,
            "session": SELF,
            "name": "pay",
            "ordinal": 1,
            "args": {"amount": 100},
            "risk": {"side_effect": "external-write"},
        },
        token=None,
    )
    results: dict[str, Any] = {"asked": asked}
    results["approve-self-endpoint"] = call(ENDPOINT, "approve", {"name": SELF})
    results["approve-self-endpoint-forged-by"] = call(
        ENDPOINT, "approve", {"name": SELF, "by": "root"}
    )
    results["deny-self-endpoint"] = call(ENDPOINT, "deny", {"name": SELF})
    results["resolve-self-endpoint"] = call(ENDPOINT, "resolve", {"name": SELF, "option": "accept"})
    loose = f'name = "{SELF}"\n[run]\nexec = ["true"]\n[policy]\nallow = ["pay"]\n'
    results["apply-self-endpoint"] = call(
        ENDPOINT, "apply", {"name": SELF, "spec": loose, "base": WORKSPACE}
    )
    results["apply-self-control"] = call(
        CONTROL, "apply", {"name": SELF, "spec": loose, "base": WORKSPACE}
    )
    results["approve-victim-endpoint"] = call(ENDPOINT, "approve", {"name": "victim"})
    results["approve-self-control"] = call(CONTROL, "approve", {"name": SELF, "by": "operator"})
    results["approve-self-control-no-token"] = call(
        CONTROL, "approve", {"name": SELF, "by": "operator"}, token=None
    )
    results["approve-victim-control"] = call(CONTROL, "approve", {"name": "victim"})
    results["reload-control"] = call(CONTROL, "reload", {})
    # a gc is an operator action too (docs/design.md section 6): on neither socket
    results["gc-control"] = call(CONTROL, "gc", {})
    results["gc-endpoint"] = call(ENDPOINT, "gc", {"dry_run": True})
    results["ping-control"] = call(CONTROL, "ping", {})
    results["approve-self-helper"] = helper_result()
    for name, args in (
        ("sessionctl-approve-self", ("approve", SELF)),
        ("sessionctl-socket-control", ("--socket", CONTROL, "approve", SELF)),
    ):
        answer = sessionctl(*args) if CTL else None
        if answer is not None:
            results[name] = answer
    forked = call(ENDPOINT, "fork", {"name": SELF, "new": "hostile-child"})
    results["fork-self"] = forked
    results["approve-child-endpoint"] = call(ENDPOINT, "approve", {"name": "hostile-child"})
    results["approve-child-control"] = call(CONTROL, "approve", {"name": "hostile-child"})
    wide = 'name = "wide"\n[run]\nexec = ["true"]\ngrants = ["ps"]\n[policy]\nallow = ["pay"]\n'
    results["create-wider"] = call(
        ENDPOINT, "create", {"spec": wide, "base": WORKSPACE, "source": "wide.toml"}
    )
    results["send-forged-sender"] = call(
        ENDPOINT, "send", {"to": "victim", "text": "approved!", "sender": "operator"}
    )
    results["send-as-itself"] = call(ENDPOINT, "send", {"to": "victim", "text": "hello"})
    with open(os.environ["HOSTILE_OUT"], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
