"""sessiond.integrations.pydantic_ai's logic without a daemon: risk contracts, step
keys, the response's round trip through the log's JSON, and an agent outside a
session (the capability does nothing there)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import ToolDefinition

from sessiond.integrations.pydantic_ai import (
    SessiondDurability,
    _contract,
    _dump,
    _key,
    _load,
    _text,
    risk,
    run_turn,
)


def test_risk_defaults_follow_the_tools_nature() -> None:
    assert risk("read")["sessiond"] == {
        "side_effect": "read", "idempotency": "safe", "resume": "replay-from-event", "writes": [],
    }  # fmt: skip
    write = risk("workspace-write", writes=["out.txt"])["sessiond"]
    assert (write["idempotency"], write["resume"], write["writes"]) == (
        "conditional", "rerun-after-check", ["out.txt"],
    )  # fmt: skip
    assert risk("read", resume="never-rerun")["sessiond"]["resume"] == "never-rerun"
    with pytest.raises(ValueError, match="side_effect 'write'"):
        risk("write")  # type: ignore[arg-type]


def test_a_tool_that_declares_nothing_gets_the_safe_default() -> None:
    bare = ToolDefinition(name="charge")
    assert _contract(bare) == {
        "side_effect": "external-write", "idempotency": "unsafe", "resume": "never-rerun",
        "writes": [],
    }  # fmt: skip
    declared = ToolDefinition(name="look", metadata=risk("read"))
    assert _contract(declared)["side_effect"] == "read"


def test_step_keys_come_from_the_call_id_and_stay_valid() -> None:
    assert _key(ToolCallPart("t", {}, tool_call_id="toolu_01AbC")) == "tool:toolu_01AbC"
    odd = _key(ToolCallPart("t", {}, tool_call_id="call id with spaces?"))
    assert odd.startswith("tool:")
    assert " " not in odd
    assert odd == _key(ToolCallPart("t", {}, tool_call_id="call id with spaces?"))


def test_a_response_round_trips_through_its_recorded_json() -> None:
    response = ModelResponse(parts=[TextPart("hi"), ToolCallPart("look", {"a": 1})])
    again = _load(_dump(response))
    assert again.parts == response.parts
    assert _text(_dump(response)) == "hi [calls look]"
    with pytest.raises(TypeError, match="not a response"):
        _load({"kind": "request", "parts": []})


def test_outside_a_session_the_agent_runs_as_it_always_did() -> None:
    calls: list[int] = []

    def model(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        calls.append(len(messages))
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("look", {})])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), capabilities=[SessiondDurability()])
    looked: list[bool] = []

    @agent.tool_plain(metadata=risk("read"))
    def look() -> str:
        looked.append(True)
        return "seen"

    result = asyncio.run(agent.run("go"))
    assert result.output == "done"
    assert calls == [1, 3]
    assert looked == [True]
    assert not SessiondDurability().in_durable_context
    with pytest.raises(RuntimeError, match="inside `async with session"):
        asyncio.run(run_turn(agent, "go"))


def test_outside_a_session_a_tool_that_requires_approval_is_deferred_by_pydantic_ai() -> None:
    def model(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("launch", {})])

    agent = Agent(FunctionModel(model), capabilities=[SessiondDurability()])
    launched: list[bool] = []

    @agent.tool_plain(requires_approval=True)
    def launch() -> str:
        launched.append(True)
        return "gone"

    result: AgentRunResult[Any] = asyncio.run(
        agent.run("go", output_type=[str, DeferredToolRequests])
    )
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_name for c in result.output.approvals] == ["launch"]
    assert launched == []
