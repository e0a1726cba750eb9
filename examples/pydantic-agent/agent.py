"""A Pydantic AI agent as a durable sessiond session.

It answers the mail: it reads workspace/inbox.txt (a read tool) and writes a
reply to workspace/outbox.txt (a write tool that the session's policy asks a
person about). The model is Pydantic AI's FunctionModel with a script, so it
runs offline; every request it answers is logged in model-calls.log, which
shows that a request answered once is never sent again, whatever happens to
the program or the daemon. Put a real model (``Agent("anthropic:…")``) in its
place and nothing else changes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from sessiond.integrations.pydantic_ai import SessiondDurability, risk, run_turn, session


def scripted_model(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
    """The model: read the inbox, answer it, then say what happened."""
    with open("model-calls.log", "a") as calls:  # one line a request actually sent
        calls.write(f"request with {len(messages)} messages\n")
    returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("read_inbox", {})])
    answer = returned[-1]
    if answer.tool_name == "read_inbox":
        reply = f"Re: {str(answer.content).strip()} -- yes, see you then."
        return ModelResponse(parts=[ToolCallPart("write_outbox", {"text": reply})])
    if "denied" in str(answer.content):
        return ModelResponse(parts=[TextPart(f"I did not answer the mail. {answer.content}")])
    return ModelResponse(parts=[TextPart("I answered the mail in outbox.txt.")])


agent = Agent(
    FunctionModel(scripted_model),
    instructions="You answer the mail in the inbox.",
    capabilities=[SessiondDurability()],
)


@agent.tool_plain(metadata=risk("read"))
def read_inbox() -> str:
    """Read the newest mail."""
    return Path("inbox.txt").read_text().strip()


@agent.tool_plain(metadata=risk("workspace-write", writes=["outbox.txt"]))
def write_outbox(text: str) -> str:
    """Send a reply (appended to outbox.txt)."""
    with open("outbox.txt", "a") as outbox:
        outbox.write(text + "\n")
    return "sent"


async def main() -> None:
    async with session() as run:
        result = await run_turn(agent, "Answer the new mail.")
        print(result.output)
        await run.sleep()  # the turn is done; the next message wakes it again


if __name__ == "__main__":
    asyncio.run(main())
