"""The permission prompt tool of a ``claude-code`` run: an MCP server on stdio
that the Claude Code CLI starts (``--permission-prompt-tool
mcp__sessiond__permission`` with ``--mcp-config … --strict-mcp-config``).

The CLI calls it for every tool call it was not told to allow up front, with
``tool_name``, ``input`` and ``tool_use_id``. Each call is a durable step of the
run's turn, asked of the daemon over the run's program endpoint with the run's
token (the CLI passes its environment on). The session's policy decides:

- ``run`` (allowed, or approved by a person earlier in the turn): answered
  ``{"behavior":"allow","updatedInput":…}``; the call's id is left for the
  driver, which records the tool's end from the CLI's stream;
- ``denied``: ``{"behavior":"deny","message":…}``, which the model sees;
- ``replayed`` (the same call finished earlier in this turn): denied with its
  recorded result, so a finished tool call is never run twice;
- ``ask``: a person must answer. This run ends here: the driver is told (a line
  on its notice pipe) and stops the CLI; the session waits ``blocked``. After
  ``sessionctl approve`` the next run resumes the CLI's session and the same call
  is allowed, once. A run's program can never answer its own question: approve
  and deny are operator actions, refused on the program endpoint.

The answer is one text block holding JSON (Claude Code refuses structured
content), so the tool is declared with ``structured_output=False``.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from sessiond.sdkwire import StepAnswer
from sessiond.wire import Connection, RemoteError

# The risk contract of Claude Code's own tools; any other (Bash, WebFetch, MCP
# tools) is the safe default, external-write. (sessiond.table.agent_spec has the
# same sets, for the spec's check of allowed_tools against the policy.)
# How long a question waits for the driver to record the response that asks it.
RECORD_WAIT = 30.0
READ_TOOLS = frozenset({"Read", "Glob", "Grep", "LS", "NotebookRead", "TodoWrite", "WebSearch"})
WORKSPACE_TOOLS = frozenset({"Edit", "MultiEdit", "Write", "NotebookEdit"})


# The CLI's input to a tool: that tool's own JSON, whatever it takes.
ToolInput = dict[str, Any]


class Permission(TypedDict):
    """The permission tool's answer to the CLI: allow (with the input as asked) or
    deny, and why."""

    behavior: Literal["allow", "deny"]
    message: NotRequired[str]
    updatedInput: NotRequired[ToolInput]


def risk_of(tool: str) -> dict[str, str]:
    if tool in READ_TOOLS:
        return {"side_effect": "read", "idempotency": "safe", "resume": "replay-from-event"}
    if tool in WORKSPACE_TOOLS:
        return {
            "side_effect": "workspace-write",
            "idempotency": "unsafe",
            "resume": "require-user-confirmation",
        }
    return {"side_effect": "external-write", "idempotency": "unsafe", "resume": "never-rerun"}


def digest12(tool: str, tool_input: Any) -> str:
    return hashlib.sha256(
        orjson.dumps([tool, tool_input], option=orjson.OPT_SORT_KEYS)
    ).hexdigest()[:12]


class Asker:
    """Asks the daemon about each call and keeps what the driver needs."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket = Path(env["SESSIOND_SOCKET"])
        self.token = env["SESSIOND_TOKEN"]
        self.session = env["SESSIOND_SESSION"]
        self.calls = Path(env["SESSIOND_AGENT_RUNDIR"]) / "calls"
        self.notice = Path(env["SESSIOND_AGENT_RUNDIR"]) / "notice"
        self.recorded = Path(env["SESSIOND_AGENT_RUNDIR"]) / "recorded"
        self.seen: dict[str, int] = {}

    def wait_recorded(self, tool_use_id: str, limit: float = RECORD_WAIT) -> None:
        """Wait until the driver has the response that made this call on record.

        The CLI writes the response to its stream, then asks us; the driver reads
        the stream on its own time. A question ends the run, so a response the
        driver had not recorded yet would be missing from the log (seen on a
        loaded machine). Bounded: a CLI that asks first is answered anyway."""
        if not tool_use_id:
            return
        marker = self.recorded / tool_use_id
        deadline = time.monotonic() + limit
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def key(self, tool: str, tool_input: Any) -> str:
        """The step's key: the same for the same call in every run of the turn (a
        resumed CLI asks again with a new tool_use_id), the nth such call its own."""
        base = f"cc.{tool}.{digest12(tool, tool_input)}"
        self.seen[base] = self.seen.get(base, 0) + 1
        return f"{base}.{self.seen[base]}"

    def tell_driver(self, what: str) -> None:
        with open(self.notice, "a", encoding="utf-8") as f:
            f.write(what + "\n")
            f.flush()

    def decide(self, tool: str, tool_input: ToolInput, tool_use_id: str) -> Permission | None:
        """The answer to the CLI; None where a person must answer (the CLI is stopped)."""
        self.wait_recorded(tool_use_id)
        key = self.key(tool, tool_input)
        params = {
            "token": self.token, "session": self.session, "kind": "tool", "name": tool,
            "ordinal": 1, "key": key, "key_is_id": True, "args": tool_input,
            "risk": risk_of(tool),
        }  # fmt: skip
        try:
            with Connection(self.socket, 60) as conn:
                answer: StepAnswer = conn.call("sdk.step", params)
        except (RemoteError, OSError) as exc:
            return {"behavior": "deny", "message": f"sessiond could not decide: {exc}"}
        status = answer["status"]
        if status in ("run", "denied", "replayed") and tool_use_id:
            # For the driver: this call is recorded (it finishes a "run" one).
            self.calls.mkdir(exist_ok=True)
            tmp = self.calls / f".{tool_use_id}.tmp"
            tmp.write_bytes(orjson.dumps({"call": answer["call"], "key": key, "status": status}))
            tmp.rename(self.calls / f"{tool_use_id}.json")
        if status == "run":
            return {"behavior": "allow", "updatedInput": tool_input}
        if status == "replayed":
            result = answer.get("result")
            return {
                "behavior": "deny",
                "message": f"{tool} already ran in this turn (call {answer['call']}); it is not "
                f"run twice. Its result: {orjson.dumps(result).decode()[:2000]}",
            }
        if status == "denied":
            return {"behavior": "deny", "message": f"{tool} was denied: {answer.get('rule', '')}"}
        if status == "ask":
            self.tell_driver(f"ask {answer['call']} {tool}")
            return None
        self.tell_driver(f"stop {status}")
        reason = answer.get("reason") or answer.get("rule") or status
        return {"behavior": "deny", "message": f"sessiond stops this run: {reason}"}


def serve() -> int:
    import anyio
    from mcp.server.mcpserver import MCPServer

    asker = Asker(dict(os.environ))
    server = MCPServer("sessiond")

    @server.tool(
        name="permission",
        description="sessiond decides whether a tool call may run (the session's policy)",
        structured_output=False,
    )
    # (``input`` spelt out: the MCP server makes the tool's schema from these annotations)
    async def permission(tool_name: str, input: dict[str, Any], tool_use_id: str = "") -> str:
        verdict = await anyio.to_thread.run_sync(asker.decide, tool_name, input, tool_use_id)
        if not verdict:
            # A person must answer: the driver stops the CLI; this answer never comes.
            await anyio.sleep_forever()
        return orjson.dumps(verdict).decode()

    server.run("stdio")
    return 0


if __name__ == "__main__":
    raise SystemExit(serve())
