"""A session program that attacks what the daemon does as root on paths its run
controls (tests/e2e/test_boundary_attacks.py). Standard library only.

- ``ATTACK_MODE=git``: its workspace is the operator's git repository. It makes
  the repository a partial clone whose promisor remote's ``uploadpack`` is a
  script of its own, and points HEAD, through a symbolic ref, at a commit that
  is not there. A ``git`` the daemon runs in the workspace (to read HEAD) would
  fetch the commit, running the script as the daemon. Then it asks for a step
  (the daemon reads the workspace's HEAD for it).
- ``ATTACK_MODE=writes``: a step declares it writes a FIFO in its workspace, a
  symlink to ``$ATTACK_TARGET`` and that path itself: the daemon reads what a
  step writes before and after it, to hash and diff it.
- ``ATTACK_MODE=symlink``: its paths the spec declares (``writes``, ``writable``)
  made symlinks out of the workspace between two runs.
- ``ATTACK_MODE=secrets``: it creates a session whose secrets are the daemon's.
- ``ATTACK_MODE=standing``: it creates a session of a higher priority, another
  agent and no budget.
- ``ATTACK_MODE=create``: it creates a session ``child`` whose ``[run]`` writes a
  folder outside its own workspace (``writable``), or whose workspace is that
  folder (``cwd``), and whose program writes a file there.

What it saw goes to ``program.json`` in its workspace; the script writes
``$ATTACK_LEDGER/pwned`` with the uid it ran as.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

ENDPOINT = os.environ["SESSIOND_SOCKET"]
TOKEN = os.environ["SESSIOND_TOKEN"]
SELF = os.environ["SESSIOND_SESSION"]
MODE = os.environ["ATTACK_MODE"]
LEDGER = os.environ["ATTACK_LEDGER"]
WORKSPACE = os.getcwd()


def call(method: str, params: dict[str, Any], token: str | None = TOKEN) -> Any:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(ENDPOINT)
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
    return json.loads(data) if data else {"ok": False, "error": {"message": "closed"}}


def step(name: str, writes: list[str] | None = None) -> Any:
    params = {
        "writes": writes or [],
        "token": TOKEN,
        "session": SELF,
        "name": name,
        "ordinal": 1,
        "args": {},
        "risk": {"side_effect": "read"},
    }
    return call("sdk.step", params, token=None)


def git_attack(results: dict[str, Any]) -> None:
    script = os.path.join(WORKSPACE, "fetch.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\nid -u > {LEDGER}/pwned\nexit 1\n")
    os.chmod(script, 0o755)
    dot = os.path.join(WORKSPACE, ".git")
    with open(os.path.join(dot, "config"), "a") as f:
        f.write(
            "[core]\n\trepositoryformatversion = 1\n"
            "[extensions]\n\tpartialClone = origin\n"
            f'[remote "origin"]\n\turl = {WORKSPACE}\n\tpromisor = true\n'
            f"\tuploadpack = {script}\n"
        )
    refs = os.path.join(dot, "refs", "heads")
    with open(os.path.join(refs, "a"), "w") as f:
        f.write("ref: refs/heads/b\n")
    with open(os.path.join(refs, "b"), "w") as f:
        f.write("1234567890123456789012345678901234567890\n")
    with open(os.path.join(dot, "HEAD"), "w") as f:
        f.write("ref: refs/heads/a\n")
    results["step"] = step("after-git")


def create_attack(results: dict[str, Any]) -> None:
    target = os.environ["ATTACK_TARGET"]
    how = os.environ["ATTACK_HOW"]
    program = ["/bin/sh", "-c", f"echo pwned > {target}/owned.txt"]
    where = f'cwd = "{target}"\n' if how == "cwd" else f'writable = ["{target}"]\n'
    spec = (
        f'name = "child"\ngoal = "help"\n[run]\nexec = {json.dumps(program)}\n{where}retries = 0\n'
    )
    results["create"] = call("create", {"spec": spec, "base": WORKSPACE})


def standing_attack(results: dict[str, Any]) -> None:
    """A session first at the model's queue, under another agent's name and with no
    budget: the same program and workspace as its own otherwise."""
    spec = (
        'name = "child"\ngoal = "help"\nagent = "someone-else"\npriority = 100\n'
        f'[run]\nexec = ["/bin/true"]\ncwd = "{WORKSPACE}"\nretries = 0\n'
    )
    results["create"] = call("create", {"spec": spec, "base": WORKSPACE})


def writes_attack(results: dict[str, Any]) -> None:
    """A step that declares it writes what the daemon must not open: a FIFO (an
    open that waits for a writer), a symlink out of the workspace, an absolute path."""
    os.mkfifo(os.path.join(WORKSPACE, "pipe"))
    os.symlink(os.environ["ATTACK_TARGET"], os.path.join(WORKSPACE, "link"))
    results["step"] = step("writes", ["pipe", "link"])
    results["outside"] = step("outside", [os.environ["ATTACK_TARGET"], "../x"])


def symlink_attack(results: dict[str, Any]) -> None:
    """First run: ``out`` (a ``writes`` folder not made yet) becomes a symlink to
    another session's workspace, ``cache`` (a ``writable`` folder in the
    workspace, ``a/cache``) leads to ``$ATTACK_TARGET`` (``a`` becomes a symlink
    to the folder above it: ``a/cache`` is a mount point, ``a`` is not). Second
    run: through them."""
    other, target = os.environ["ATTACK_OTHER"], os.environ["ATTACK_TARGET"]
    out, cache = os.path.join(WORKSPACE, "out"), os.path.join(WORKSPACE, "a", "cache")
    if not os.path.islink(out):
        os.symlink(other, out)
        os.rename(os.path.join(WORKSPACE, "a"), os.path.join(WORKSPACE, "a.old"))
        os.symlink(os.path.dirname(target), os.path.join(WORKSPACE, "a"))
        results["first"] = True
        raise SystemExit(3)  # failed: the retry is its next run
    try:
        with open(os.path.join(out, "secret.txt")) as f:
            results["read"] = f.read()
    except OSError as exc:
        results["read_error"] = repr(exc)
    try:
        with open(os.path.join(cache, "owned.txt"), "w") as f:
            f.write("pwned")
        results["wrote"] = True
    except OSError as exc:
        results["write_error"] = repr(exc)


def secrets_attack(results: dict[str, Any]) -> None:
    """Grant ``create``: a session in its own workspace whose ``[run] secrets`` name
    what the daemon can read and it cannot (``ATTACK_HOW=file``: a file of the
    daemon's, ``env``: a variable of the daemon's, ``fifo``: a FIFO of its own,
    which the daemon's open would wait on). The new session's program writes the
    value into the workspace."""
    how, source = os.environ["ATTACK_HOW"], os.environ["ATTACK_TARGET"]
    if how == "fifo":
        source = os.path.join(WORKSPACE, "pipe")
        os.mkfifo(source)
    ref = f'{{ env = "{source}" }}' if how == "env" else f'{{ file = "{source}" }}'
    program = ["/bin/sh", "-c", f'printf %s "$STOLEN" > {WORKSPACE}/stolen.txt']
    spec = (
        f'name = "child"\ngoal = "help"\n[run]\nexec = {json.dumps(program)}\n'
        f'cwd = "{WORKSPACE}"\nretries = 0\nsecrets = {{ STOLEN = {ref} }}\n'
    )
    results["create"] = call("create", {"spec": spec, "base": WORKSPACE})


def githead_attack(results: dict[str, Any]) -> None:
    """Its workspace's ``.git/HEAD`` a FIFO, a ref a symlink to ``/dev/zero``: what
    the daemon reads of the repository (for a step's ``tool.started``) must not wait
    or read without end."""
    dot = os.path.join(WORKSPACE, ".git")
    os.makedirs(os.path.join(dot, "refs", "heads"), exist_ok=True)
    how = os.environ.get("ATTACK_HOW", "fifo")
    if how == "fifo":
        os.mkfifo(os.path.join(dot, "HEAD"))
    else:
        with open(os.path.join(dot, "HEAD"), "w") as f:
            f.write("ref: refs/heads/main\n")
        os.symlink("/dev/zero", os.path.join(dot, "refs", "heads", "main"))
    results["step"] = step("after-head")


def flood_attack(results: dict[str, Any]) -> None:
    """Holds as many idle connections to the program endpoint as the daemon takes
    (every other run's SDK calls would be refused as busy), until the test puts
    ``stop`` in its workspace."""
    import resource
    import time

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held = []
    try:
        for _ in range(int(os.environ["ATTACK_COUNT"])):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(ENDPOINT)
            held.append(sock)
    except OSError as exc:
        results["stopped_at"] = repr(exc)
    results["held"] = len(held)
    with open(os.path.join(WORKSPACE, "holding.json"), "w") as f:
        json.dump(results, f)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(WORKSPACE, "stop")) and time.monotonic() < deadline:
        time.sleep(0.05)  # (a program's own wait: the test waits on files)


def main() -> None:
    results: dict[str, Any] = {}
    try:
        if MODE == "git":
            git_attack(results)
        elif MODE == "create":
            create_attack(results)
        elif MODE == "standing":
            standing_attack(results)
        elif MODE == "secrets":
            secrets_attack(results)
        elif MODE == "githead":
            githead_attack(results)
        elif MODE == "flood":
            flood_attack(results)
        elif MODE == "step":
            results["step"] = step("victim")
        elif MODE == "symlink":
            symlink_attack(results)
        elif MODE == "writes":
            writes_attack(results)
    except SystemExit:
        raise
    except Exception as exc:
        results["error"] = repr(exc)
        raise
    finally:
        with open(os.path.join(WORKSPACE, "program.json"), "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
