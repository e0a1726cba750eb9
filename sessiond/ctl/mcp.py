"""``sessionctl mcp``: a Model Context Protocol server over stdio (docs/design.md section 12).

An agent (Claude Code, any MCP client) lists, reads, creates, forks, sends to and
wakes sessions through it. Its tools are the syscalls an agent may use, each one
request to the daemon, answered with what ``sessionctl --json`` prints; a refusal
comes back as an MCP tool error whose text is the message ``sessionctl`` prints.

``approve``, ``deny`` and ``resolve`` are not tools, by design: they are a
person's answers (docs/design.md section 8, "Who may approve"). An agent that could
call them would approve its own questions.

Where it talks: the same socket as ``sessionctl`` (``--socket``, else
``SESSIOND_SOCKET``, else the default). Inside a session's program that is the
program endpoint, and ``SESSIOND_TOKEN`` goes with every request, so the server
has exactly that run's grants; elsewhere it is the control socket, as the user.

Only ``sessionctl mcp`` imports this module, and it imports the ``mcp`` SDK (an
optional extra): ``sessionctl ps`` never loads either.

Tool sets are functions that add tools to the server (``TOOL_SETS``), so another
set (a permission prompt tool for an agent CLI) joins without touching these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson

from sessiond import __version__
from sessiond.wire import Connection, Params, RemoteError

try:
    import anyio.to_thread
    from mcp.server.mcpserver import MCPServer
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import Field
except ImportError as exc:  # the optional extra is not installed
    raise RemoteError(
        "usage",
        f"sessionctl mcp needs the MCP SDK ({exc.name} is missing): install it with "
        "pip install 'sessiond[mcp]'",
        2,
    ) from exc

# A page of `log`: enough to read a turn, small enough for a model's context.
LOG_PAGE = 100
LOG_PAGE_MAX = 1000

READ = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
ENDS = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)

Name = Annotated[str, Field(description="a session's name")]


class Daemon:
    """Where the server's requests go, and as whom (a run's token, or none)."""

    def __init__(self, socket: Path, token: str | None) -> None:
        self.socket = socket
        self.token = token

    @property
    def in_a_run(self) -> bool:
        return bool(self.token)

    def call(self, method: str, params: Params) -> Any:
        # One connection a call: a daemon restarted between two calls is simply
        # reached again, and a slow call holds nothing of the next one.
        with Connection(self.socket, 120, token=self.token) as conn:
            return conn.call(method, params)

    async def answer(self, method: str, params: Params) -> CallToolResult:
        """The daemon's answer as a tool result: its JSON (what ``sessionctl --json``
        prints), or a tool error with the text ``sessionctl`` prints."""
        try:
            result = await anyio.to_thread.run_sync(self.call, method, params)
        except RemoteError as exc:
            return error(exc)
        return ok(result)


def ok(result: Any) -> CallToolResult:
    text = orjson.dumps(result).decode()  # as `sessionctl --json` prints it
    return CallToolResult(content=[TextContent(type="text", text=text)])


def error(exc: RemoteError) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=exc.message)], is_error=True)


def syscall_tools(server: MCPServer, daemon: Daemon) -> None:
    """The syscalls an agent may use. No operator action (approve, deny, resolve,
    apply, reload) is among them."""

    def tool(annotations: ToolAnnotations) -> Callable[[Callable[..., Any]], Any]:
        return server.tool(annotations=annotations, structured_output=False)

    @tool(READ)
    async def ps() -> CallToolResult:
        """The process table: every session with its state, reason, next wake and runs."""
        return await daemon.answer("ps", {})

    @tool(READ)
    async def show(name: Name) -> CallToolResult:
        """One session in detail: state and reason, goal, triggers, next wake, the last
        gate result, pending approvals, the open turn, lineage."""
        return await daemon.answer("show", {"name": name})

    @tool(READ)
    async def log(
        name: Name,
        since: Annotated[int, Field(ge=1, description="the first seq of the page")] = 1,
        limit: Annotated[
            int, Field(ge=1, le=LOG_PAGE_MAX, description="events in the page at most")
        ] = LOG_PAGE,
        types: Annotated[
            list[str] | None, Field(description="only these event types, e.g. tool.finished")
        ] = None,
        grep: Annotated[str | None, Field(description="only events matching this regex")] = None,
    ) -> CallToolResult:
        """A session's events, a page at a time, oldest first. The answer's
        ``next_since`` is the ``since`` of the next page (null: this was the last)."""
        params = {
            "name": name, "since": since, "types": types or [], "grep": grep, "first": limit + 1,
        }  # fmt: skip
        try:
            records = await anyio.to_thread.run_sync(daemon.call, "log", params)
        except RemoteError as exc:
            return error(exc)
        page = records[:limit]
        more = len(records) > limit
        return ok({"events": page, "next_since": page[-1]["seq"] + 1 if more else None})

    @tool(READ)
    async def replay(
        name: Name,
        view: Literal["state", "messages", "trace", "audit"] = "state",
        upto: Annotated[int | None, Field(ge=1, description="rebuild up to this seq")] = None,
    ) -> CallToolResult:
        """Rebuild a session from its events and show a view (state, messages, trace or
        audit); runs nothing."""
        return await daemon.answer("replay", {"name": name, "upto": upto, "view": view})

    @tool(READ)
    async def gate(name: Name) -> CallToolResult:
        """Evaluate the resume gate now, as a dry run: each check, the verdict and the
        recovery options a person may choose."""
        return await daemon.answer("gate", {"name": name})

    @tool(WRITE)
    async def create(
        spec: Annotated[str, Field(description="the session spec, TOML text (docs/spec.md)")],
        base: Annotated[
            str | None,
            Field(description="the folder relative paths in the spec resolve from (default: "
                  "the server's working directory)"),
        ] = None,
    ) -> CallToolResult:  # fmt: skip
        """Register a session from a spec given inline (TOML). Inside a session's
        program, the new session may not be allowed more than that session."""
        folder = Path(base or ".").resolve()
        params = {"spec": spec, "base": str(folder), "source": "mcp"}
        return await daemon.answer("create", params)

    @tool(WRITE)
    async def activate(name: Name) -> CallToolResult:
        """Wake a session now: replay, the resume gate, then a run."""
        return await daemon.answer("activate", {"name": name})

    @tool(WRITE)
    async def send(
        name: Annotated[str, Field(description="the session to send to")],
        text: Annotated[str, Field(description="the message")],
    ) -> CallToolResult:
        """Put a message in a session's mailbox and messages view; wakes it if it has a
        message trigger. Inside a session's program it is sent as that session."""
        params = {"to": name, "text": text}
        if not daemon.in_a_run:  # a run sends as its own session (the endpoint says so)
            params["sender"] = "mcp"
        return await daemon.answer("send", params)

    @tool(WRITE)
    async def fork(
        name: Name,
        new: Annotated[str, Field(description="the new session's name")],
        at: Annotated[
            int | None, Field(ge=1, description="fork at this seq (default: the latest)")
        ] = None,
        with_triggers: bool = False,
    ) -> CallToolResult:
        """A new session whose log starts with this one's events up to a seq; triggers
        are not inherited unless with_triggers."""
        params = {"name": name, "new": new, "at": at, "with_triggers": with_triggers}
        return await daemon.answer("fork", params)

    @tool(ENDS)
    async def merge(
        child: Annotated[str, Field(description="the forked session to merge")],
        into: Annotated[
            str | None, Field(description="default: the session it was forked from")
        ] = None,
        summary: Annotated[str | None, Field(description="the child's result, in words")] = None,
    ) -> CallToolResult:
        """Append a child's result (summary and artifact references) to its parent's log;
        the child terminates as merged."""
        return await daemon.answer("merge", {"child": child, "into": into, "summary": summary})

    @tool(WRITE)
    async def compact(
        name: Name,
        keep: Annotated[int, Field(ge=0, description="the newest messages kept")] = 4,
    ) -> CallToolResult:
        """Record a compaction: the messages view shows a summary in place of the older
        messages; the log keeps every event."""
        return await daemon.answer("compact", {"name": name, "keep": keep})


ToolSet = Callable[[MCPServer, Daemon], None]
TOOL_SETS: tuple[ToolSet, ...] = (syscall_tools,)

INSTRUCTIONS = (
    "sessiond schedules agent sessions like an operating system schedules processes. "
    "These tools list, read, create, fork, send to and wake sessions. Approving, denying "
    "and resolving are a person's answers and are not tools here: when a session waits "
    "blocked on an approval, tell the user to run 'sessionctl approve NAME' (or deny)."
)


def server(daemon: Daemon, tool_sets: Sequence[ToolSet] = TOOL_SETS) -> MCPServer:
    srv: MCPServer = MCPServer(
        "sessiond", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    for add in tool_sets:
        add(srv, daemon)
    return srv


def serve(socket: Path, token: str | None) -> int:
    """Serve MCP on stdin/stdout until the client closes them."""
    with contextlib.suppress(KeyboardInterrupt):
        server(Daemon(socket, token)).run("stdio")
    return 0
