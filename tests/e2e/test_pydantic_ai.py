"""examples/pydantic-agent end to end: a Pydantic AI agent as a durable session.

Its model is Pydantic AI's FunctionModel with a script that logs each request it
answers to model-calls.log, so the tests count what was really sent.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from tests.e2e.harness import Daemon, running, wait_event

EXAMPLE = Path(__file__).parents[2] / "examples" / "pydantic-agent"
NAME = "pydantic-agent"


def setup(d: Daemon) -> Path:
    """The example as its README says, with this venv's Python and this checkout."""
    target = d.root / "example"
    shutil.copytree(EXAMPLE, target)
    spec = target / "pydantic-agent.toml"
    root = Path(__file__).parents[2]
    text = spec.read_text().replace('exec = ["python3"', f'exec = ["{sys.executable}"')
    text = text.replace('timeout = "5m"', f'timeout = "5m"\nenv = {{ PYTHONPATH = "{root}" }}')
    spec.write_text(text)
    d.ctl("create", str(spec), check=True)
    return target / "workspace"


def changed_to(d: Daemon, state: str, since: int = 1, *, after_run: bool = False) -> dict[str, Any]:
    """The first change to ``state`` from seq ``since`` (with ``after_run``: the end of
    a run, not the "approved" hop of a blocked session)."""

    def wanted(r: dict[str, Any]) -> bool:
        return r["data"]["to"] == state and (not after_run or r["data"]["from"] == "running")

    return wait_event(d, NAME, "lifecycle.changed", since=since, match=wanted, timeout=90)


def model_calls(workspace: Path) -> list[str]:
    return (workspace / "model-calls.log").read_text().splitlines()


def last_seq(d: Daemon) -> int:
    seq: int = d.json("show", NAME)["seq"]
    return seq


def test_an_approval_round_trip_runs_the_write_once_and_sends_no_request_twice() -> None:
    with running() as d:
        ws = setup(d)
        d.ctl("send", NAME, "new mail", check=True)
        blocked = changed_to(d, "blocked")
        assert blocked["data"]["reason"].startswith("approval pending for write_outbox")
        assert not (ws / "outbox.txt").exists()
        assert len(model_calls(ws)) == 2  # read the inbox; answer it
        mark = last_seq(d)
        d.ctl("approve", NAME, check=True)
        changed_to(d, "sleeping", since=mark, after_run=True)
        assert (ws / "outbox.txt").read_text() == (
            "Re: Lunch on Friday at noon? -- yes, see you then.\n"
        )
        # the rerun replayed both earlier requests from the log: one new request only
        assert len(model_calls(ws)) == 3
        log = d.json("log", NAME)
        replayed = [r for r in log if r["type"] == "model.requested" and r["data"].get("replayed")]
        assert len(replayed) == 2
        (final,) = [r for r in log if r["type"] == "model.responded"][-1:]
        assert final["data"]["text"] == "I answered the mail in outbox.txt."
        tools = [r["data"]["tool"] for r in log if r["type"] == "tool.started"]
        assert tools == ["read_inbox", "write_outbox"]  # each ran once across two runs
        # the end state the README shows: two runs of one turn, asleep for the next mail
        assert [r["data"]["turn"] for r in log if r["type"] == "run.started"] == [1, 1]
        assert d.json("show", NAME)["state"] == "sleeping"
        (intent,) = [
            r for r in log if r["type"] == "tool.intent" and r["data"]["tool"] == "read_inbox"
        ]
        assert intent["data"]["risk"]["side_effect"] == "read"


def test_a_denial_reaches_the_agent_which_answers_with_it() -> None:
    with running() as d:
        ws = setup(d)
        d.ctl("send", NAME, "new mail", check=True)
        changed_to(d, "blocked")
        mark = last_seq(d)
        d.ctl("deny", NAME, "--reason", "not on Fridays", check=True)
        changed_to(d, "sleeping", since=mark)  # a denial does not wake it by itself
        mark = last_seq(d)
        d.ctl("activate", NAME, check=True)  # the next wake continues the turn
        changed_to(d, "sleeping", since=mark, after_run=True)
        assert not (ws / "outbox.txt").exists()
        log = d.json("log", NAME)
        final = [r for r in log if r["type"] == "model.responded"][-1]
        assert final["data"]["text"].startswith(
            "I did not answer the mail. The tool call was denied"
        )
        assert len(model_calls(ws)) == 3


def test_a_kill_9_after_the_models_tool_call_continues_the_turn_without_asking_again() -> None:
    """The read tool blocks (its inbox is a FIFO) after the model asked for it; the
    daemon is killed with -9 there. At the restart the turn continues: the model's
    request is answered from the log, not sent again, and the tool runs."""
    with running() as d:
        ws = setup(d)
        (ws / "inbox.txt").unlink()
        os.mkfifo(ws / "inbox.txt")
        d.ctl("send", NAME, "new mail", check=True)
        wait_event(d, NAME, "tool.started", match=lambda r: r["data"]["tool"] == "read_inbox")
        assert len(model_calls(ws)) == 1  # the model asked for the read
        d.kill9()
        # the program and the read it was blocked in are stopped with the daemon;
        # the inbox is a plain file for the next run
        (ws / "inbox.txt").unlink()
        (ws / "inbox.txt").write_text("Lunch on Friday at noon?\n")
        mark = last_seq_offline(d)
        d.start()
        changed_to(d, "blocked", since=mark)  # the turn went on, up to the write's question
        calls = model_calls(ws)
        assert len(calls) == 2, calls  # request 1 was not sent again; request 2 was new
        mark = last_seq(d)
        d.ctl("approve", NAME, check=True)
        changed_to(d, "sleeping", since=mark, after_run=True)
        assert len(model_calls(ws)) == 3
        assert (ws / "outbox.txt").read_text().count("Re: Lunch") == 1
        log = d.json("log", NAME)
        sent = [r for r in log if r["type"] == "model.requested" and not r["data"].get("replayed")]
        assert len(sent) == 3


def last_seq_offline(d: Daemon) -> int:
    """The last seq in the session's log file, with the daemon down."""
    path = d.state_dir / "sessions" / NAME / "events.jsonl"
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_a_tool_that_requires_approval_is_asked_through_sessiond_and_runs_once() -> None:
    """Pydantic AI's own ``requires_approval=True``: in a session, the policy asks a
    person (an undeclared tool is external-write), and the approved call runs once."""
    program = Path(__file__).parent / "programs" / "pydantic_approval.py"
    root = Path(__file__).parents[2]
    with running() as d:
        spec = f"""name = "launcher"
[run]
kind = "sdk"
exec = ["{sys.executable}", "{program}"]
cwd = "."
env = {{ PYTHONPATH = "{root}" }}
"""
        d.ctl("create", str(d.write_spec("launcher", spec)), check=True)
        d.ctl("activate", "launcher", check=True)
        blocked = wait_event(
            d, "launcher", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked",
            timeout=90,
        )  # fmt: skip
        assert blocked["data"]["reason"].startswith("approval pending for launch")
        assert not (d.root / "launches.log").exists()
        d.ctl("approve", "launcher", check=True)
        done = wait_event(
            d, "launcher", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated",
            timeout=90,
        )  # fmt: skip
        assert done["data"]["outcome"] == "completed"
        assert (d.root / "launches.log").read_text() == "moon\n"
        (intent,) = d.json("log", "launcher", "--type", "tool.intent")
        assert intent["data"]["risk"]["side_effect"] == "external-write"
