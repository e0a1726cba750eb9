"""Pydantic AI agents as durable sessions (docs/design.md sections 8 and 12).

::

    from pydantic_ai import Agent
    from sessiond.integrations.pydantic_ai import SessiondDurability, risk, run_turn, session

    agent = Agent(model, capabilities=[SessiondDurability()])

    @agent.tool_plain(metadata=risk("read"))
    def read_inbox() -> str: ...

    @agent.tool_plain(metadata=risk("workspace-write", writes=["outbox.txt"]))
    def write_outbox(text: str) -> str: ...

    async with session() as run:           # the run of an `sdk` session's program
        result = await run_turn(agent, "answer the mail")
        await run.sleep()

Inside ``session()``, every model request the agent makes is a
``run.model_call`` and every tool call a ``run.step``: on a later run of the
same turn (after an approval, a crash, a stop) finished requests and tool calls
are answered from the session's log, never sent or run again. Outside it (no
session), the capability does nothing: the agent runs as it always did.

This follows the shape of Pydantic AI's own durable integrations (Temporal,
DBOS, Prefect): a capability on the agent, using only Pydantic AI's public
interface (``AbstractCapability.wrap_model_request``, ``wrap_tool_execute`` and
``prepare_tools``, ``ApprovalRequired``, ``DeferredToolRequests``,
``ModelMessagesTypeAdapter``).

- **Risk contract.** A tool declares it in its metadata with :func:`risk`:
  ``risk("read")`` is ``read`` / ``safe`` / ``replay-from-event``;
  ``risk("workspace-write", writes=[…])`` is ``conditional`` /
  ``rerun-after-check``; a tool that declares nothing is ``external-write`` /
  ``unsafe`` / ``never-rerun`` (the SDK's safe default).
- **Approvals are deferred tools.** The session's policy decides each call (a
  tool on its ``ask`` list, or an ``external-write`` one it does not allow,
  needs a person). Such a call raises ``ApprovalRequired`` inside the agent, so
  the agent's run ends with ``DeferredToolRequests``; :func:`run_turn` then ends
  the program's run (``ApprovalPending``) and the session waits ``blocked``. A
  person answers through sessiond (``sessionctl approve`` / ``deny``, the web
  console, a link). The next run replays the agent up to that call and runs it
  once, or, after a denial, the agent gets Pydantic AI's denial as the tool's
  result and goes on with it. A tool declared ``requires_approval=True`` is the
  policy's to decide too (undeclared, it is ``external-write``: asked unless
  allowed by name).
- **Tool calls are keyed** by their call id (from the recorded model response,
  so the same in every run), so tools the agent runs in parallel keep their
  places whatever order they finish in.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Literal, TypedDict

from sessiond.sdk import ApprovalPending, AsyncRun, Denied, connect_async

try:
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.capabilities.abstract import WrapModelRequestHandler, WrapToolExecuteHandler
    from pydantic_ai.exceptions import ApprovalRequired
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        f"sessiond.integrations.pydantic_ai needs Pydantic AI ({exc.name} is missing): "
        "pip install 'sessiond[pydantic-ai]'"
    ) from exc

SideEffect = Literal["none", "read", "workspace-write", "external-write"]
METADATA_KEY = "sessiond"

# What a tool's nature implies, unless it says otherwise (docs/sdk.md, the gate's table).
_DEFAULTS: dict[str, tuple[str, str]] = {
    "none": ("safe", "replay-from-event"),
    "read": ("safe", "replay-from-event"),
    "workspace-write": ("conditional", "rerun-after-check"),
    "external-write": ("unsafe", "never-rerun"),
}
_KEY = re.compile(r"^[A-Za-z0-9._:/-]{1,180}$")

_current: ContextVar[AsyncRun | None] = ContextVar("sessiond_pydantic_ai_run", default=None)


class ToolRisk(TypedDict):
    """A tool's risk contract, as its ``metadata[METADATA_KEY]`` holds it."""

    side_effect: str
    idempotency: str
    resume: str
    writes: list[str]


def risk(
    side_effect: SideEffect = "external-write",
    *,
    idempotency: Literal["safe", "conditional", "unsafe"] | None = None,
    resume: Literal[
        "replay-from-event", "rerun-after-check", "require-user-confirmation", "never-rerun"
    ]
    | None = None,
    writes: Sequence[str] = (),
) -> dict[str, ToolRisk]:
    """A tool's risk contract, as the tool's ``metadata=``. ``idempotency`` and
    ``resume`` default from ``side_effect``; ``writes`` are the workspace paths a
    ``workspace-write`` tool may change (hashed before and after, checked by the gate)."""
    if side_effect not in _DEFAULTS:
        raise ValueError(f"side_effect {side_effect!r}: one of {', '.join(_DEFAULTS)}")
    default_idem, default_resume = _DEFAULTS[side_effect]
    contract: ToolRisk = {
        "side_effect": side_effect,
        "idempotency": idempotency or default_idem,
        "resume": resume or default_resume,
        "writes": list(writes),
    }
    return {METADATA_KEY: contract}


def _contract(tool: ToolDefinition) -> ToolRisk:
    declared = (tool.metadata or {}).get(METADATA_KEY)
    contract = dict(declared) if isinstance(declared, dict) else risk()[METADATA_KEY]
    return {
        "side_effect": contract["side_effect"],
        "idempotency": contract["idempotency"],
        "resume": contract["resume"],
        "writes": list(contract.get("writes") or ()),
    }


def _key(call: ToolCallPart) -> str:
    """The step's key: the call id from the (recorded) model response; hashed when
    it holds characters a step key may not."""
    cid = call.tool_call_id
    if _KEY.match(cid):
        return f"tool:{cid}"
    return "tool:" + hashlib.sha256(cid.encode()).hexdigest()[:32]


# pydantic-ai's own JSON form of a response (its format, changes with it)
def _dump(response: ModelResponse) -> dict[str, Any]:
    """A response in pydantic-ai's JSON form (its own format): what the step records."""
    # pydantic's dump_python: Any by its own type
    value: dict[str, Any] = ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
    return value


def _load(value: Any) -> ModelResponse:
    (message,) = ModelMessagesTypeAdapter.validate_python([value])
    if not isinstance(message, ModelResponse):
        raise TypeError(f"the recorded model step holds a {type(message).__name__}, not a response")
    return message


def _text(value: Any) -> str:
    """What the messages view shows of a response: its text and the tools it calls."""
    try:
        response = _load(value)
    except (TypeError, ValueError):
        return ""
    shown = []
    for part in response.parts:
        if isinstance(part, TextPart):
            shown.append(part.content)
        elif isinstance(part, ToolCallPart):
            shown.append(f"[calls {part.tool_name}]")
    return " ".join(shown)


@dataclass(init=False)
class SessiondDurability(AbstractCapability[AgentDepsT]):
    """Makes an agent's model requests and tool calls sessiond steps, inside
    :func:`session`; does nothing outside one.

    ``strict_requests``: a model request that differs from the one recorded at
    the same place in the turn is a divergence (the session blocks) instead of
    being answered from the log. Off by default: Pydantic AI puts timestamps in
    requests.
    """

    strict_requests: bool = False

    def __init__(self, *, strict_requests: bool = False) -> None:
        self.strict_requests = strict_requests

    @property
    def in_durable_context(self) -> bool:
        return _current.get() is not None

    async def prepare_tools(
        self,
        ctx: RunContext[AgentDepsT],  # noqa: ARG002 - the hook's signature
        tool_defs: list[ToolDefinition],
    ) -> list[ToolDefinition]:
        """In a session, a tool declared ``requires_approval=True`` is the session
        policy's to decide: it becomes a plain tool call, a step, that the policy asks
        a person about (undeclared, it is ``external-write``: asked unless the policy
        allows it by name). Pydantic AI would otherwise defer it itself, before any
        step, in every run of the turn."""
        if _current.get() is None:
            return tool_defs
        return [replace(t, kind="function") if t.kind == "unapproved" else t for t in tool_defs]

    async def wrap_model_request(
        self,
        ctx: RunContext[AgentDepsT],  # noqa: ARG002 - the hook's signature
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        run = _current.get()
        if run is None:
            return await handler(request_context)
        request = {
            "messages": ModelMessagesTypeAdapter.dump_python(request_context.messages, mode="json"),
            "parameters": to_jsonable_python(
                request_context.model_request_parameters, fallback=repr
            ),
        }

        async def send() -> dict[str, Any]:  # pydantic-ai's JSON form (_dump)
            return _dump(await handler(request_context))

        recorded = await run.model_call(
            request_context.model.model_name, request, send, strict=self.strict_requests,
            text=_text,
        )  # fmt: skip
        # The same value on the first run as on a replay: the one the log holds.
        return _load(recorded)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[AgentDepsT],  # noqa: ARG002 - the hook's signature
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],  # the hook's signature: the tool's own args
        handler: WrapToolExecuteHandler,
    ) -> Any:
        run = _current.get()
        if run is None or tool_def.kind != "function":
            return await handler(args)

        async def work() -> Any:
            return to_jsonable_python(await handler(args), fallback=repr)

        try:
            return await run.step(
                tool_def.name, work, args=to_jsonable_python(args, fallback=repr),
                key=_key(call), key_is_id=True, **_contract(tool_def),
            )  # fmt: skip
        except ApprovalPending as exc:
            # A deferred tool call: the agent's run ends with DeferredToolRequests.
            raise ApprovalRequired(metadata={METADATA_KEY: str(exc)}) from exc
        except Denied as exc:
            # What Pydantic AI tells the model of a denied call (ToolDenied), with why.
            return f"The tool call was denied: {exc}"


@asynccontextmanager
async def session() -> AsyncIterator[AsyncRun]:
    """The run of this session's program (``sessiond.sdk.connect_async``), with the
    agents' :class:`SessiondDurability` bound to it. A ``StopRun`` leaving the block
    (a pending approval, a stop, a divergence) ends the program with exit 0: the
    turn goes on in a later run."""
    async with connect_async() as run:
        token = _current.set(run)
        try:
            yield run
        finally:
            _current.reset(token)


async def run_turn(
    agent: Agent[AgentDepsT, Any], user_prompt: str | None = None, **kwargs: Any
) -> AgentRunResult[Any]:
    """``agent.run(...)`` inside :func:`session`, with ``DeferredToolRequests`` among
    its output types. A tool call that waits for a person's answer ends this run of
    the program (``ApprovalPending``); the agent continues with the answer in the
    next one. Deferred calls of the agent's own (not sessiond's) are returned as
    Pydantic AI returns them."""
    if _current.get() is None:
        raise RuntimeError("run_turn runs inside `async with session():` (a session's program)")
    wanted = kwargs.pop("output_type", None) or agent.output_type
    types = list(wanted) if isinstance(wanted, list | tuple) else [wanted]
    result: AgentRunResult[Any] = await agent.run(
        user_prompt, output_type=[*types, DeferredToolRequests], **kwargs
    )
    out = result.output
    if isinstance(out, DeferredToolRequests):
        ours = [
            c for c in out.approvals if METADATA_KEY in (out.metadata.get(c.tool_call_id) or {})
        ]
        if ours:
            names = ", ".join(c.tool_name for c in ours)
            raise ApprovalPending(
                f"{names} waits for a person's answer (sessionctl approve/deny); the agent "
                "continues in the next run"
            )
    return result


__all__ = ["METADATA_KEY", "SessiondDurability", "risk", "run_turn", "session"]
