"""SDK programs through the real daemon: tool calls, policy, approvals, tokens, budgets.
What needs no real process runs in process: the approval and denial round trips
(tests/inproc/test_steps.py), an approval's expiry and a command's approval
(test_gate.py), retries and budgets (test_scheduling.py)."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import orjson

from tests.e2e.harness import Daemon, running, short_dir, wait_event, wait_for

AGENT = Path(__file__).parent / "programs" / "agent.py"
SPEC = """name = "agent"
goal = "fix f.txt"
[run]
kind = "sdk"
exec = ["{python}", "{agent}"]
cwd = "."
env = {{ PYTHONPATH = "{root}" }}
[policy]
ask = ["edit_file"]
approval_ttl = "{ttl}"
"""


def test_a_run_token_works_only_for_its_own_run_and_session() -> None:
    with running() as d:
        spy = d.root / "spy.py"
        spy.write_text(
            "import os, time, pathlib\n"
            # whole or not there: the test reads it once it exists
            "pathlib.Path('token.new').write_text(os.environ['SESSIOND_TOKEN'])\n"
            "os.replace('token.new', 'token')\n"
            "time.sleep(float(os.environ.get('HOLD', '0')))\n"
        )
        for name, hold in (("a", "30"), ("b", "0")):
            spec = (
                f'name = "{name}"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{spy}"]\n'
                f'cwd = "{d.root / name}"\nenv = {{ HOLD = "{hold}" }}\n'
            )
            (d.root / name).mkdir()
            d.ctl("create", str(d.write_spec(name, spec)), check=True)
        d.ctl("activate", "b", check=True)
        wait_event(d, "b", "run.finished")
        ended = (d.root / "b" / "token").read_text()
        d.ctl("activate", "a", check=True)
        wait_for((d.root / "a" / "token").exists, timeout=30, what="a's program to start")
        live = (d.root / "a" / "token").read_text()
        assert "SESSIOND_TOKEN" not in (d.state_dir / "sessions" / "a" / "events.jsonl").read_text()
        assert live not in (d.state_dir / "sessions" / "a" / "events.jsonl").read_text()
        assert _rpc(d, "sdk.context", {"token": live, "session": "a"})["ok"] is True
        other = _rpc(d, "sdk.context", {"token": live, "session": "b"})
        assert other["error"]["code"] == "token_refused"
        assert "belongs to session 'a'" in other["error"]["message"]
        stale = _rpc(d, "sdk.context", {"token": ended, "session": "b"})
        assert stale["error"]["code"] == "token_refused"
        assert "run that has ended" in stale["error"]["message"]
        d.ctl("cancel", "a", check=True)
        after = _rpc(d, "sdk.step", {"token": live, "session": "a", "name": "x", "ordinal": 1})
        assert after["error"]["code"] == "token_refused"


def _rpc(d: Daemon, method: str, params: dict[str, object]) -> dict[str, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(d.socket))
    sock.sendall(orjson.dumps({"id": 1, "method": method, "params": params}) + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        data += sock.recv(65536)
    sock.close()
    reply: dict[str, Any] = orjson.loads(data)
    return reply


def test_redact_patterns_are_masked_in_artifacts() -> None:
    with running() as d:
        spec = (
            'name = "r"\nredact = ["sk-[A-Za-z0-9]{10,}"]\n[run]\n'
            'exec = ["sh", "-c", "echo key=sk-$(echo abcdefghij)klmnop"]\n'
        )
        d.ctl("create", str(d.write_spec("r", spec)), check=True)
        d.ctl("activate", "r", check=True)
        finished = wait_event(d, "r", "run.finished")
        ref = finished["data"]["stdout"]["ref"][7:]
        stored = (d.state_dir / "sessions" / "r" / "artifacts" / ref).read_text()
        assert stored == "key=[REDACTED]\n"
        log = (d.state_dir / "sessions" / "r" / "events.jsonl").read_text()
        assert "sk-abcdefghijklmnop" not in log


def test_an_interrupt_lets_the_current_block_finish_then_stops() -> None:
    looper = Path(__file__).parent / "programs" / "looper.py"
    root = Path(__file__).parents[2]
    with running() as d:
        spec = (
            f'name = "loop"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{looper}"]\n'
            f'cwd = "."\nenv = {{ PYTHONPATH = "{root}" }}\n'
        )
        d.ctl("create", str(d.write_spec("loop", spec)), check=True)
        d.ctl("activate", "loop", check=True)
        wait_event(d, "loop", "tool.started")
        shown = d.json("interrupt", "loop")
        assert shown["state"] == "sleeping"
        assert shown["last_run"]["status"] == "interrupted"
        finished = d.json("log", "loop", "--type", "tool.finished")
        started = d.json("log", "loop", "--type", "tool.started")
        assert len(finished) == len(started)  # no block was cut in the middle
        assert all(r["data"]["status"] == "ok" for r in finished)
        assert (d.root / "stopped").exists()  # it stopped at a stable point by itself
        assert d.json("show", "loop")["tools_in_flight"] == []


def test_an_approval_given_for_another_command_is_not_used() -> None:
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        spec = (
            'name = "c"\n[run]\nexec = ["sh", "-c", "echo old >> ran.txt"]\ncwd = "."\n'
            '[policy]\nask = ["command"]\n'
        )
        d.ctl("create", str(d.write_spec("c", spec)), check=True)
        d.ctl("activate", "c", check=True)
        assert d.json("show", "c")["state"] == "blocked"
        d.stop()
        stored = d.state_dir / "sessions" / "c" / "spec.toml"
        stored.write_text(stored.read_text().replace("echo old", "echo new"))
        d.start()
        d.ctl("approve", "c", check=True)  # approves the call whose intent showed `echo old`
        asked = wait_event(
            d, "c", "approval.requested", match=lambda r: r["data"]["call"] != "r1.command"
        )
        assert not (root / "ran.txt").exists()  # neither command ran on the old approval
        discarded = d.json("log", "c", "--type", "observation.projected")
        assert [r["data"]["source"] for r in discarded] == ["discarded"]
        intent = d.json("log", "c", "--type", "tool.intent")[-1]["data"]
        assert intent["call"] == asked["data"]["call"]
        assert intent["args"]["exec"] == ["sh", "-c", "echo new >> ran.txt"]
        d.ctl("approve", "c", check=True)
        wait_event(d, "c", "run.finished")
        assert (root / "ran.txt").read_text() == "new\n"
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_daemon_started_with_a_relative_socket_hands_programs_an_absolute_one() -> None:
    root = short_dir()
    d = Daemon(root, relative_socket=True)
    try:
        d.start()
        (root / "ws").mkdir()  # the program runs here, not where the daemon started
        (root / "ws" / "f.txt").write_text("broken\n")
        spec = (
            SPEC.format(
                python=sys.executable, agent=AGENT, root=Path(__file__).parents[2], ttl="1h"
            )
            .replace('cwd = "."', 'cwd = "ws"')
            .replace('ask = ["edit_file"]', 'allow = ["edit_file"]')
        )
        d.ctl("create", str(d.write_spec("agent", spec)), check=True)
        d.ctl("activate", "agent", check=True)
        done = wait_event(
            d, "agent", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        assert done["data"]["outcome"] == "completed", done
        assert (root / "ws" / "f.txt").read_text() == "broken\nfixed\n"
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)
