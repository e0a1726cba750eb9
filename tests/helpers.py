"""Helpers shared by the tests (no fixtures here, plain functions)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

from sessiond.log.event_data import (
    EventData,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    ToolFinished,
    ToolIntent,
    ToolStarted,
)
from sessiond.log.store.base import Draft

T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop, the loop the daemon uses."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def tool_call(call: str, tool: str = "edit_file", path: str = "a.txt") -> list[Draft]:
    payloads: list[EventData] = [
        ToolIntent(call=call, tool=tool, args={"path": path}, risk=RiskContract(), writes=(path,)),
        PolicyDecided(call=call, tool=tool, decision="allow", rule="allow: edit_file"),
        ToolStarted(call=call, tool=tool, hashes={path: None}),
        ToolFinished(call=call, tool=tool, status="ok", exit_code=0, hashes={path: "a" * 64}),
        ObservationProjected(call=call, tool=tool, text=f"wrote {path}"),
    ]
    return [Draft(p, correlation=call) for p in payloads]
