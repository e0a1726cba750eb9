"""The claude-code kind's spec keys and its stream parsing (a fake run stands in
for the daemon; the real CLI and daemon are in tests/e2e/test_claude_code.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sessiond.integrations.claude_code import Driver, _answer_note
from sessiond.integrations.claude_permission import risk_of
from sessiond.table.agent_spec import DRIVER, side_effect_of
from sessiond.table.spec import BadSpec, parse_spec

SPEC = """name = "cc"
[run]
kind = "claude-code"
[claude_code]
prompt = "Tidy the notes."
allowed_tools = ["Read", "Bash(git status)"]
model = "claude-sonnet"
max_turns = 5
cli = "bin/claude"
[policy]
deny = ["WebFetch"]
allow = ["Bash"]
"""


def test_a_claude_code_spec_runs_the_driver_with_its_keys(tmp_path: Path) -> None:
    spec = parse_spec(SPEC, base=tmp_path)
    assert spec.run is not None
    assert spec.run.exec[1:] == DRIVER
    assert spec.claude_code is not None
    assert spec.claude_code.allowed_tools == ["Read", "Bash(git status)"]
    assert spec.claude_code.cli == str(tmp_path / "bin" / "claude")  # from the spec's folder


def test_the_claude_code_table_belongs_to_its_kind_and_names_real_tools(tmp_path: Path) -> None:
    other = SPEC.replace('kind = "claude-code"', 'exec = ["true"]')
    with pytest.raises(BadSpec, match='set \\[run\\] kind = "claude-code"'):
        parse_spec(other, base=tmp_path)
    with pytest.raises(BadSpec, match="not a Claude Code tool name"):
        parse_spec(SPEC.replace('"Read",', '"Read; rm -rf /",'), base=tmp_path)
    # a tool the CLI would run unasked must be one the policy allows
    asked = SPEC.replace('allow = ["Bash"]', 'ask = ["Read"]\nallow = ["Bash"]')
    with pytest.raises(
        BadSpec, match=re.escape("policy asks a person about Read (ask: Read); add Read")
    ):
        parse_spec(asked, base=tmp_path)
    with pytest.raises(BadSpec, match=re.escape("about Bash (default: external-write asks)")):
        parse_spec(SPEC.replace('allow = ["Bash"]', ""), base=tmp_path)
    with pytest.raises(BadSpec, match="max_turns"):
        parse_spec(SPEC.replace("max_turns = 5", "max_turns = 0"), base=tmp_path)


class FakeRun:
    """What the driver asks of the daemon, recorded; every step may run."""

    run_id = "r1"
    session = "cc"
    turn = 1

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.models: list[dict[str, Any]] = []

    def _call(self, method: str, **params: Any) -> dict[str, Any]:
        self.calls.append((method, params))
        return {"status": "run", "call": f"r1.{len(self.calls)}"}

    def model_call(self, model: str, request: Any, fn: Any, **kw: Any) -> Any:
        response = fn()
        self.models.append({"model": model, "key": kw["key"], "usage": kw["usage"](response),
                            "text": kw["text"](response)})  # fmt: skip
        return response


def _assistant(mid: str, *blocks: dict[str, Any], tin: int = 10, tout: int = 1) -> dict[str, Any]:
    return {"type": "assistant", "message": {"id": mid, "model": "m", "content": list(blocks),
            "usage": {"input_tokens": tin, "output_tokens": tout}}}  # fmt: skip


def test_the_stream_becomes_model_and_tool_steps_with_the_runs_totals(tmp_path: Path) -> None:
    run = FakeRun()
    driver = Driver(run, {"allowed_tools": ["Read"]}, tmp_path)  # type: ignore[arg-type]
    read = {"type": "tool_use", "id": "tu1", "name": "Read", "input": {"file_path": "a"}}
    for event in [
        {"type": "system", "subtype": "init", "session_id": "sid-1"},
        _assistant("m1", {"type": "text", "text": "Reading."}),
        _assistant("m1", read),  # the same response, one more block
        {"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": "tu1", "content": "hello"}]}},
        _assistant("m2", {"type": "text", "text": "Done."}),
        {"type": "result", "total_cost_usd": 0.5,
         "usage": {"input_tokens": 25, "output_tokens": 30}},
    ]:  # fmt: skip
        driver.line(event)
    assert (tmp_path / "session-id").read_text() == "sid-1"
    assert [m["key"] for m in run.models] == ["cc.m1", "cc.m2"]
    assert run.models[0]["text"] == 'Reading.\n[Read {"file_path":"a"}]'
    # the last response makes the sums the run's totals
    assert run.models[0]["usage"] == (10, 1)
    assert run.models[1]["usage"] == (15, 29)
    (begin, params), (done, end) = run.calls
    assert (begin, params["name"], params["key"], params["args"]) == (
        "sdk.step", "Read", "cc.tu1", {"file_path": "a"})  # fmt: skip
    assert params["risk"]["side_effect"] == "read"
    assert (done, end["status"], end["result"]) == ("sdk.step_done", "ok", "hello")


def test_a_call_the_permission_tool_began_is_only_finished_here(tmp_path: Path) -> None:
    run = FakeRun()
    driver = Driver(run, {}, tmp_path)  # type: ignore[arg-type]
    (driver.rundir / "calls").mkdir()
    (driver.rundir / "calls" / "tu9.json").write_text('{"call": "r1.7", "key": "k"}')
    write = {"type": "tool_use", "id": "tu9", "name": "Write", "input": {"file_path": "b"}}
    driver.line(_assistant("m1", write))
    result = {"type": "tool_result", "tool_use_id": "tu9", "content": "no", "is_error": True}
    driver.line({"type": "user", "message": {"content": [result]}})
    assert run.calls == [
        ("sdk.step_done", {"call": "r1.7", "observation": "Write: no", "status": "error",
                           "error": "no", "error_class": "execution"})]  # fmt: skip


def test_the_spec_check_and_the_permission_tool_agree_on_each_tools_nature() -> None:
    for tool in ["Read", "Grep", "Edit", "Write", "Bash", "WebFetch", "mcp__x__y", "Task"]:
        assert side_effect_of(tool) == risk_of(tool)["side_effect"]


def test_risk_follows_the_tools_nature_and_answers_are_told_to_the_model() -> None:
    assert risk_of("Grep")["side_effect"] == "read"
    assert risk_of("Edit")["side_effect"] == "workspace-write"
    assert risk_of("Bash")["side_effect"] == "external-write"
    assert risk_of("mcp__x__y")["resume"] == "never-rerun"
    denied = [{"call": "r1.2", "tool": "Write", "status": "denied", "reason": "no"}]
    assert "denied your call to Write: no" in _answer_note(denied, "r1.2")
    assert _answer_note(denied, "r1.3") == ""


def test_a_call_the_permission_tool_refused_is_not_recorded_again(tmp_path: Path) -> None:
    run = FakeRun()
    driver = Driver(run, {}, tmp_path)  # type: ignore[arg-type]
    (driver.rundir / "calls").mkdir()
    (driver.rundir / "calls" / "tu5.json").write_text('{"call": "r1.3", "status": "replayed"}')
    write = {"type": "tool_use", "id": "tu5", "name": "Write", "input": {"file_path": "b"}}
    driver.line(_assistant("m1", write))
    result = {
        "type": "tool_result",
        "tool_use_id": "tu5",
        "content": "already ran",
        "is_error": True,
    }
    driver.line({"type": "user", "message": {"content": [result]}})
    assert run.calls == []


def test_a_transcript_is_put_back_only_under_the_private_projects_folder() -> None:
    from sessiond.runs.agents import _transcript_path

    assert str(_transcript_path({"path": "projects/-w/abc.jsonl"})) == "projects/-w/abc.jsonl"
    for bad in ["../x/abc.jsonl", "projects/../abc.jsonl", "/etc/abc.jsonl",
                "projects/-w/abc.sh", "projects/a/b/abc.jsonl", 7]:  # fmt: skip
        assert _transcript_path({"path": bad}) is None
