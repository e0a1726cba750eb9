"""A Pydantic AI agent whose one tool is declared ``requires_approval=True`` and
nothing else: inside a session, sessiond's policy asks a person about it."""

from __future__ import annotations

import asyncio

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sessiond.integrations.pydantic_ai import SessiondDurability, run_turn, session


def model(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("launch", {"target": "moon"})])
    return ModelResponse(parts=[TextPart("launched")])


agent = Agent(FunctionModel(model), capabilities=[SessiondDurability()])


@agent.tool_plain(requires_approval=True)
def launch(target: str) -> str:
    with open("launches.log", "a") as f:
        f.write(target + "\n")
    return f"launched to {target}"


async def main() -> None:
    async with session() as run:
        result = await run_turn(agent, "launch")
        await run.complete(summary=str(result.output))


asyncio.run(main())
