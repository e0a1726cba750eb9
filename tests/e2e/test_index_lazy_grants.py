"""A program's grant checks while the daemon still opens its sessions from the table
index (docs/design.md, "Start-up"; section 8: a program's fork cannot widen its
policy).

A fork's source is judged before the fork (is it wider than the caller?); a
session the index lists but the background load has not opened yet must be judged
as it is, not answered "no such session" (nor let through unjudged). The load is
held (``fault_hold = "open-rest"``) for the whole test."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.e2e.harness import Daemon, short_dir, wait_event
from tests.e2e.test_table_index import held, release, restart_held, still_loading

__all__ = ["held"]  # the fixture, used by name

# The program: forks two sessions it does not name in its own request line, through
# its endpoint, and writes each answer down (standard library only).
PROGRAM = """import json, os, socket
def call(method, params):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["SESSIOND_SOCKET"])
        token = os.environ["SESSIOND_TOKEN"]
        s.sendall(json.dumps({"id": 1, "method": method, "params": params,
                              "token": token}).encode() + b"\\n")
        data = b""
        while not data.endswith(b"\\n"):
            data += s.recv(65536)
    return json.loads(data)
out = {name: call("fork", {"name": name, "new": name + "-copy"}) for name in ("narrow", "wide")}
with open("results.json", "w") as f:
    json.dump(out, f)
"""
FORKER = """name = "forker"
[run]
exec = ["/usr/bin/python3", "-I", "{program}"]
cwd = "{ws}"
grants = ["fork", "log", "ps", "send", "show"]
[policy]
deny = ["rm"]
"""
NARROW = """name = "narrow"
[run]
exec = ["true"]
cwd = "{ws}"
[policy]
deny = ["rm"]
"""
WIDE = """name = "wide"
[run]
exec = ["true"]
cwd = "{ws}"
"""


def test_a_programs_fork_of_a_session_not_opened_yet_is_judged_on_its_policy(
    held: Daemon,
) -> None:
    d = held
    ws = short_dir()
    try:
        program = ws / "fork.py"
        program.write_text(PROGRAM)
        for name, text in (("forker", FORKER), ("narrow", NARROW), ("wide", WIDE)):
            spec = d.write_spec(name, text.format(program=program, ws=ws))
            d.ctl("create", str(spec), check=True)
        d.stop()
        since = len(d.lines)
        assert restart_held(d)["listed"] == 3  # narrow and wide wait for the load
        d.ctl("activate", "forker", check=True)  # opened for this request
        wait_event(d, "forker", "run.finished")
        results = json.loads(_read(ws / "results.json"))
        assert still_loading(d, since)  # all of it before the load reached them
        assert results["narrow"]["ok"] is True, results  # no wider: it happens
        refused = results["wide"]
        assert refused["ok"] is False, results
        assert "allowed more than session 'forker'" in refused["error"]["message"], refused
        assert "no session" not in refused["error"]["message"], refused
        release(d)
        names = {row["name"] for row in d.json("ps", "--all")}
        assert "narrow-copy" in names
        assert "wide-copy" not in names
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def _read(path: Path) -> str:
    assert path.exists(), f"the program wrote no results (in {os.listdir(path.parent)})"
    return path.read_text()
