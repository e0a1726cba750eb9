"""Only a person approves (docs/design.md section 8, "Who may approve"), through the
real daemon and real programs.

A hostile session program tries every way it can to answer its own pending
approval (tests/e2e/programs/hostile.py); every attempt is refused and the
approval stays pending, as the operator (this test) sees with `sessionctl
show`. It runs as the daemon's uid and, where the tests run as root, as
``nobody`` through ``[run] user``. Approvals, `apply` and a fork's policy, which
need no real process, are tested in process (tests/inproc/test_gate.py).
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.harness import (
    SESSIONCTL,
    Daemon,
    closed_to_others,
    readable_by_others,
    running,
    short_dir,
    wait_event,
)

HOSTILE = Path(__file__).parent / "programs" / "hostile.py"
VICTIM = """name = "victim"
[run]
exec = ["true"]
cwd = "{ws}"
[policy]
ask = ["command"]
"""
HOSTILE_SPEC = """name = "hostile"
[run]
kind = "sdk"
exec = ["/usr/bin/python3", "-I", "{program}"]
cwd = "{ws}"
env = {{ HOSTILE_CONTROL = "{control}", HOSTILE_OUT = "{out}", HOSTILE_CTL = "{ctl}" }}
grants = ["ps", "show", "send", "fork", "create"]
[policy]
ask = ["pay"]
"""
REFUSED = {"permission_denied", "oserror"}


def workspace() -> Path:
    ws = short_dir()
    os.chmod(ws, 0o777)  # the [run] user writes its results here
    return ws


def attack(d: Daemon, ws: Path, program: Path = HOSTILE) -> dict[str, Any]:
    """Start the victim (blocked on an approval) and the hostile program; what it got."""
    d.ctl("create", str(d.write_spec("victim", VICTIM.format(ws=ws))), check=True)
    d.ctl("activate", "victim", check=True)
    wait_event(d, "victim", "approval.requested")
    out = ws / "results.json"
    spec = HOSTILE_SPEC.format(program=program, ws=ws, control=d.socket, out=out, ctl=SESSIONCTL)
    d.ctl("create", str(d.write_spec("hostile", spec)), check=True)
    d.ctl("activate", "hostile", check=True)
    wait_event(d, "hostile", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked")
    if not out.exists():  # the program failed: say how
        finished = d.json("log", "hostile", "--type", "run.finished")
        stderr = [r["data"].get("stderr") for r in finished]
        art = d.state_dir / "sessions" / "hostile" / "artifacts"
        texts = [(art / ref["ref"][7:]).read_bytes()[-2000:] for ref in stderr if ref]
        raise AssertionError(f"the hostile program wrote no results: {finished} {texts}")
    results: dict[str, Any] = orjson.loads(out.read_bytes())
    return results


def check_refused(d: Daemon, results: dict[str, Any]) -> None:
    asked = results.pop("asked")
    assert asked["ok"], asked
    assert asked["result"]["status"] == "ask", asked
    assert results.pop("ping-control")["ok"] is True  # ping is all a run may have there
    forked = results.pop("fork-self")  # granted, and no wider: it happens
    assert forked["ok"] is True, forked
    sent = results.pop("send-as-itself")  # granted: it goes out as the calling session
    assert sent["ok"] is True, sent
    for name, answer in results.items():
        assert answer["ok"] is False, (name, answer)
        code = answer["error"]["code"]
        # sessionctl's exit 1: refused; 3: the socket would not let it connect at all
        assert code in REFUSED or code in ("1", "3"), (name, answer)
    control = results["approve-self-control"]["error"]["message"]
    if results["approve-self-control"]["error"]["code"] == "permission_denied":
        assert "only ping" in control
        assert "program endpoint" in control
    assert "operator action" in results["approve-self-endpoint"]["error"]["message"]
    assert "operator action" in results["gc-endpoint"]["error"]["message"]
    assert "allowed more than" in results["create-wider"]["error"]["message"]
    assert "cannot send as 'operator'" in results["send-forged-sender"]["error"]["message"]
    # The operator sees every approval still pending, and no answer in any log.
    # (the fork keeps no question of its parent's turn: a fork starts its own turn)
    for name, tools in (("hostile", ["pay"]), ("victim", ["command"]), ("hostile-child", [])):
        shown = d.json("show", name)
        assert [a["tool"] for a in shown["pending_approvals"]] == tools, (name, shown)
        types = {r["type"] for r in d.json("log", name)}
        assert not types & {"approval.granted", "approval.denied", "recovery.resolved"}, name
    assert "wide" not in {s["name"] for s in d.json("ps")}
    (message,) = d.json("log", "victim", "--type", "message.received")
    assert (message["data"]["sender"], message["data"]["text"]) == ("hostile", "hello")


# These two check the control socket's own refusal of a run's processes, the layer
# beneath the sandbox: with the sandbox on, a run cannot even reach the control
# socket (tests/e2e/test_sandbox.py), so here it is off, as an operator may set it.
UNCONFINED = '[run]\nsandbox = "off"\n'


def test_a_program_cannot_approve_itself_as_the_daemons_uid() -> None:
    ws = workspace()
    try:
        with running(UNCONFINED) as d:
            results = attack(d, ws)
            # as this uid the real sessionctl runs: both ways were tried, and refused
            assert "sessionctl-approve-self" in results
            assert "operator action" in results["sessionctl-approve-self"]["error"]["message"]
            assert "only ping" in results["sessionctl-socket-control"]["error"]["message"]
            helper = results["approve-self-helper"]["error"]["message"]
            assert "descends from a sessiond spawner" in helper  # no mark: its ancestry told
            check_refused(d, results)
            # The operator's answer records who gave it, from the socket; --by is a note.
            d.ctl("approve", "hostile", "--by", "ann says ok", check=True)
            (granted,) = d.json("log", "hostile", "--type", "approval.granted")
            data = granted["data"]
            assert (data["uid"], data["channel"], data["by"]) == (os.getuid(), "cli", "ann says ok")
            assert data["user"] == pwd.getpwuid(os.getuid()).pw_name
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def test_a_program_cannot_approve_itself_as_the_run_user_nobody() -> None:
    if os.geteuid() != 0:
        pytest.skip("[run] user needs a daemon running as root")
    ws = workspace()
    # nobody runs a copy it can read: the checkout may be in a folder closed to others
    with readable_by_others(HOSTILE) as (hostile,):
        try:
            # nobody may also use the daemon ([access]): still no process of the [run]
            # user is an operator, so it reaches the control socket and may only ping
            # sandbox off: this is the control socket's own refusal, which a
            # sandboxed run cannot even reach (tests/e2e/test_sandbox.py)
            config = '[access]\nusers = ["nobody"]\n[run]\nuser = "nobody"\nsandbox = "off"\n'
            with running(config) as d:
                # what nobody must reach besides its program: its workspace, and the
                # program endpoint's folder (the daemon opens the folder itself to it)
                for needed in (ws, d.root.parent):
                    if (closed := closed_to_others(needed)) is not None:
                        pytest.skip(f"nobody cannot reach {needed}: {closed} is closed to others")
                results = attack(d, ws, hostile)
                assert (ws / "results.json").stat().st_uid == 65534  # it did run as nobody
                check_refused(d, results)
                helper = results["approve-self-helper"]["error"]["message"]
                assert "uid 65534 is a run's uid" in helper
        finally:
            shutil.rmtree(ws, ignore_errors=True)
