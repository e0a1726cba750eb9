"""The ``[claude_code]`` table of a spec whose ``[run] kind = "claude-code"``, and
the ``[codex]`` table of one whose ``[run] kind = "codex"``.

Such a run is the Claude Code CLI headless (``claude -p … --output-format
stream-json``), driven by ``sessiond.integrations.claude_code``: its stream is
parsed into ``model.*`` and ``tool.*`` events, its tool permissions are the
session's policy (docs/agents.md). A codex run is the Codex CLI (``codex exec
--json``), driven by ``sessiond.integrations.codex``: its model calls go through
the daemon's gateway, its tool calls are decided by the policy through a hook.
Kept apart from sessiond.table.spec so that module stays the size of one idea.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# What a run of an agent CLI kind executes unless the spec names its own program.
DRIVER = ["-m", "sessiond.integrations.claude_code"]
DRIVERS = {"claude-code": DRIVER, "codex": ["-m", "sessiond.integrations.codex"]}

# Claude Code's tool names (Read, Bash, mcp__server__tool) and its rule forms (Bash(git *)).
TOOL_RULE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\(.{1,500}\))?")


# The side effect of Claude Code's own tools (any other, Bash or an MCP tool, is
# external-write); sessiond.integrations.claude_permission declares the same.
READ_TOOLS = frozenset({"Read", "Glob", "Grep", "LS", "NotebookRead", "TodoWrite", "WebSearch"})
WORKSPACE_TOOLS = frozenset({"Edit", "MultiEdit", "Write", "NotebookEdit"})


def side_effect_of(tool: str) -> str:
    if tool in READ_TOOLS:
        return "read"
    return "workspace-write" if tool in WORKSPACE_TOOLS else "external-write"


def check_allowed_tools(tools: list[str], policy: Any) -> None:
    """A tool the CLI runs without asking (``allowed_tools``) must be one the
    session's policy allows (or denies: the deny list is the CLI's too, and wins).
    Else the CLI would run what the policy asks a person about."""
    from sessiond.table.policy import decide  # policy imports spec, which imports this

    for rule in tools:
        name = rule.split("(", 1)[0]
        verdict = decide(policy, name, side_effect_of(name))
        if verdict.decision == "ask":
            raise ValueError(
                f"claude_code.allowed_tools: {rule!r} would run without asking, but the "
                f"session's policy asks a person about {name} ({verdict.rule}); add {name} "
                "to [policy] allow, or take it out of allowed_tools"
            )


def driver_argv(kind: object = "claude-code") -> list[str] | None:
    """The driver a run of an agent CLI kind runs; None for other kinds."""
    driver = DRIVERS.get(kind) if isinstance(kind, str) else None
    return None if driver is None else [sys.executable, *driver]


def check_agent_tables(kind: str | None, claude_code: Any, codex: Any, policy: Any) -> None:
    """An agent CLI's table goes with its kind; a tool the Claude Code CLI runs
    unasked must be one the policy allows."""
    for table, its_kind, name in ((claude_code, "claude-code", "claude_code"),
                                  (codex, "codex", "codex")):  # fmt: skip
        if table is not None and kind != its_kind:
            raise ValueError(
                f'[{name}] configures a run of kind "{its_kind}": set [run] kind = '
                f'"{its_kind}", or remove the table'
            )
    if claude_code is not None:
        check_allowed_tools(claude_code.allowed_tools, policy)


class ClaudeCodeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # The prompt of a turn; a message's text (a `message` wake) is added below it.
    prompt: str = Field(default="", max_length=100_000)
    # Tools the CLI may use without asking (its --allowedTools); the policy's deny
    # list is passed as --disallowedTools, and every other tool asks sessiond.
    allowed_tools: list[str] = Field(default_factory=list)
    model: str = ""  # --model; empty: the CLI's default
    max_turns: int | None = Field(default=None, ge=1, le=10_000)  # --max-turns
    append_system_prompt: str = Field(default="", max_length=100_000)
    # The CLI to run: a path (relative to the spec file's folder once parsed) or a
    # name looked up in PATH.
    cli: str = "claude"
    # --bare: no CLAUDE.md, hooks, plugins or skills; a small tool set
    bare: bool = False

    @field_validator("allowed_tools")
    @classmethod
    def _tools(cls, tools: list[str]) -> list[str]:
        bad = [t for t in tools if not TOOL_RULE.fullmatch(t)]
        if bad:
            raise ValueError(
                f"{', '.join(repr(t) for t in bad)}: not a Claude Code tool name or rule "
                "(Read, Bash, Bash(git status), mcp__server__tool)"
            )
        return list(dict.fromkeys(tools))

    @field_validator("cli")
    @classmethod
    def _cli(cls, cli: str) -> str:
        if not cli.strip():
            raise ValueError("cli must name the Claude Code program (a path or 'claude')")
        return cli


class CodexSpec(BaseModel):
    """``[codex]``: how a ``kind = "codex"`` run drives ``codex exec``. Its tool
    calls are the session's policy (every one is asked of the daemon by a hook:
    there is no list of tools run unasked), its model calls go through the
    daemon's gateway (the OpenAI Responses route)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # The prompt of a turn; a message's text (a `message` wake) is added below it.
    prompt: str = Field(default="", max_length=100_000)
    model: str = ""  # --model; empty: the CLI's default (the gateway must serve it)
    # Added to the model's instructions (the CLI's developer_instructions).
    developer_instructions: str = Field(default="", max_length=100_000)
    # The CLI to run: a path (relative to the spec file's folder once parsed) or a
    # name looked up in PATH.
    cli: str = "codex"

    @field_validator("cli")
    @classmethod
    def _cli(cls, cli: str) -> str:
        if not cli.strip():
            raise ValueError("cli must name the Codex program (a path or 'codex')")
        return cli
