"""`kind = "claude-code"` against the real Claude Code CLI and the real daemon.

The CLI is `@anthropic-ai/claude-code` installed by `make agents` into
tests/agents/node_modules; its model is a scripted Anthropic-compatible endpoint
on loopback (tests/agents/anthropic_stub.py). The CLI, its stream, its permission
prompt tool and its --resume are the real ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.agents.anthropic_stub import Endpoint, Turn, text, tool
from tests.e2e.harness import Daemon, running, wait_event, wait_for

CLI = Path(__file__).resolve().parent.parent / "agents" / "node_modules" / ".bin" / "claude"

if not CLI.exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"{CLI} is missing: `make agents` installs it (Node.js and npm)")
    pytest.skip(
        f"the Claude Code CLI is not installed at {CLI}: `make agents` installs it "
        "(needs Node.js and npm)",
        allow_module_level=True,
    )

# Each CLI start takes seconds (its MCP handshake with the permission tool among
# them), and the machine is loaded.
pytestmark = pytest.mark.timeout(400)


def _env(ep: Endpoint) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": ep.url,
        "ANTHROPIC_API_KEY": "sk-test-not-a-key",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }


def _spec(ws: Path, *, allow: str, ask: str = "", deny: str = "") -> str:
    return f"""name = "cc"
goal = "keep notes"
[run]
kind = "claude-code"
cwd = "{ws}"
timeout = "5m"
retries = 0
[claude_code]
prompt = "Copy a.txt to b.txt."
allowed_tools = [{allow}]
model = "stub-model"
max_turns = 10
cli = "{CLI}"
[policy]
ask = [{ask}]
deny = [{deny}]
[[trigger]]
type = "message"
"""


def _events(d: Daemon, etype: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = d.json("log", "cc", "--type", etype)
    return out


def _state(d: Daemon) -> str:
    return str(d.json("show", "cc")["state"])


def _tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for m in request["messages"]
        if isinstance(m.get("content"), list)
        for block in m["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def test_read_allowed_write_approved_then_resumed_on_the_next_wake(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n")
    # A workspace's own settings cannot allow what the session's policy asks about.
    (ws / ".claude").mkdir()
    (ws / ".claude" / "settings.json").write_text('{"permissions": {"allow": ["Write"]}}')
    write = {"file_path": str(ws / "b.txt"), "content": "hello\n"}
    script = [
        Turn(tool("Read", file_path=str(ws / "a.txt")), input_tokens=120, output_tokens=30),
        Turn(text("Writing it."), tool("Write", **write), input_tokens=150, output_tokens=40),
        # the next run of the turn, after the approval: the model asks again
        Turn(tool("Write", **write)),
        Turn(text("Copied.")),
        # the next wake (a message): the CLI's session goes on with --resume
        Turn(text("Still here.")),
    ]
    with Endpoint(script) as ep, running(env=_env(ep)) as d:
        spec = d.write_spec("cc", _spec(ws, allow='"Read"', ask='"Write"'))
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "cc", check=True)
        asked = wait_event(d, "cc", "approval.requested", timeout=120)
        assert asked["data"]["tool"] == "Write"
        wait_for(lambda: _state(d) == "blocked", 60, "the session blocked on the question")
        assert not (ws / "b.txt").exists()  # nothing written before a person said yes
        assert len(ep.requests) == 2, [r["messages"][-1] for r in ep.requests]

        d.ctl("approve", "cc", check=True)
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")
        assert (ws / "b.txt").read_text() == "hello\n"
        finished = {e["data"]["tool"]: e["data"] for e in _events(d, "tool.finished")}
        assert finished["Read"]["status"] == "ok"
        assert "hello" in finished["Read"]["result"]
        assert finished["Write"]["status"] == "ok"
        writes = [e for e in _events(d, "tool.started") if e["data"]["tool"] == "Write"]
        assert len(writes) == 1  # approved once, run once
        decided = {e["data"]["tool"]: e["data"]["decision"] for e in _events(d, "policy.decided")}
        assert decided["Write"] == "ask"
        assert decided["Read"] == "allow"

        responded = _events(d, "model.responded")
        assert len(responded) == 4, [(r["seq"], r["data"].get("text")) for r in responded] + [
            (e["seq"], e["type"], e["data"].get("tool") or e["data"].get("status"))
            for e in d.json("log", "cc")
        ]
        assert responded[0]["data"]["model"] == "stub-model"
        assert responded[0]["data"]["tokens_in"] == 120
        assert responded[1]["data"]["text"].startswith("Writing it.")
        # the last response of a CLI run brings the run's totals (its result line);
        # the run the question stopped has what the stream showed of each response
        assert responded[2]["data"]["tokens_out"] + responded[3]["data"]["tokens_out"] == 40
        assert d.json("show", "cc")["budget_used"]["tokens"] >= 120 + 150 + 100 + 100 + 40

        # The next wake resumes the CLI's session: the whole history is sent again.
        d.ctl("send", "cc", "Anything else?", check=True)
        wait_event(d, "cc", "model.responded", match=lambda r: r["data"]["text"] == "Still here.",
                   timeout=120)  # fmt: skip
        wait_for(lambda: _state(d) == "sleeping", 60, "the second turn ended")
        last = ep.requests[-1]
        flat = repr(last["messages"])
        assert "Copy a.txt to b.txt." in flat
        assert "Anything else?" in flat
        assert any("hello" in repr(b) for b in _tool_results(last))
        assert len(ep.requests) == 5
        transcripts = [e for e in _events(d, "tool.finished")
                       if e["data"]["tool"] == "claude-code.transcript"]  # fmt: skip
        assert transcripts
        assert transcripts[-1]["data"]["result_ref"]["ref"].startswith("sha256:")


def test_a_policy_denial_is_the_clis_own_rule_and_the_model_sees_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [
        Turn(tool("Bash", command=f"echo no > {ws / 'c.txt'}", description="write c")),
        Turn(text("Could not.")),
    ]
    with Endpoint(script) as ep, running(env=_env(ep)) as d:
        # Bash is even allowed up front: the policy's deny still wins
        spec = d.write_spec("cc", _spec(ws, allow='"Bash"', deny='"Bash"'))
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "cc", check=True)
        wait_for(lambda: _state(d) == "sleeping", 120, "the turn ended")
        assert not (ws / "c.txt").exists()
        assert len(ep.requests) == 2
        result = _tool_results(ep.requests[1])
        assert result
        assert result[0].get("is_error")
        decided = [e["data"] for e in _events(d, "policy.decided") if e["data"]["tool"] == "Bash"]
        assert decided
        assert decided[0]["decision"] == "deny"
        assert not [e for e in _events(d, "tool.started") if e["data"]["tool"] == "Bash"]


def test_a_person_denies_and_the_model_is_told_why(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    write = {"file_path": str(ws / "b.txt"), "content": "x\n"}
    script = [
        Turn(tool("Write", **write)),
        Turn(text("Fine.")),  # the turn goes on at the next wake, told the answer
        Turn(text("Next.")),  # then the message that woke it starts the next turn
    ]
    with Endpoint(script) as ep, running(env=_env(ep)) as d:
        spec = d.write_spec("cc", _spec(ws, allow="", ask='"Write"'))
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "cc", check=True)
        wait_event(d, "cc", "approval.requested", timeout=120)
        wait_for(lambda: _state(d) == "blocked", 60, "the session blocked on the question")
        d.ctl("deny", "cc", "--reason", "not today", check=True)
        wait_for(lambda: _state(d) == "sleeping", 60, "the session sleeps on the denial")
        assert len(ep.requests) == 1
        # The next wake continues the turn: the CLI's session resumes and the model is
        # told the answer; the message itself starts the turn after it.
        d.ctl("send", "cc", "What now?", check=True)
        wait_event(d, "cc", "model.responded", match=lambda r: r["data"]["text"] == "Next.",
                   timeout=120)  # fmt: skip
        wait_for(lambda: _state(d) == "sleeping", 60, "the turns ended")
        assert not (ws / "b.txt").exists()
        assert "denied your call to Write: not today" in repr(ep.requests[1]["messages"])
        assert "What now?" in repr(ep.requests[2]["messages"])
        assert not [e for e in _events(d, "tool.started") if e["data"]["tool"] == "Write"]


def test_a_fork_resumes_the_clis_session_from_the_stored_transcript(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = [Turn(text("Parent here.")), Turn(text("Child here."))]
    with Endpoint(script) as ep, running(env=_env(ep)) as d:
        spec = d.write_spec("cc", _spec(ws, allow='"Read"'))
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "cc", check=True)
        wait_for(lambda: _state(d) == "sleeping" and len(ep.requests) == 1, 120, "turn 1")
        wait_event(d, "cc", "tool.finished",
                   match=lambda r: r["data"]["tool"] == "claude-code.transcript")  # fmt: skip
        d.ctl("fork", "cc", "--as", "kid", "--with-triggers", check=True)
        d.ctl("send", "kid", "And you?", check=True)
        wait_event(d, "kid", "model.responded",
                   match=lambda r: r["data"]["text"] == "Child here.", timeout=120)  # fmt: skip
        flat = repr(ep.requests[1]["messages"])
        # the child's CLI had the parent's conversation: restored, then --resume
        assert "Copy a.txt to b.txt." in flat
        assert "Parent here." in flat
        assert "And you?" in flat
