"""`sessionctl mcp` driven by the MCP SDK's own client over stdio, against the real daemon."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult, TextContent

from sessiond.wire import Connection, RemoteError
from tests.e2e.harness import SESSIONCTL, Daemon, running, short_dir, wait_event

SPEC = """name = "inbox"
goal = "read my mail"
[run]
kind = "command"
exec = ["true"]
[[trigger]]
type = "message"
"""

SYSCALLS = {"ps", "show", "log", "replay", "gate", "create", "activate", "send", "fork",
            "merge", "compact"}  # fmt: skip
READ_ONLY = {"ps", "show", "log", "replay", "gate"}
OPERATOR = {"approve", "deny", "resolve", "apply", "reload"}


def text(result: CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextContent)
    return block.text


def value(result: CallToolResult) -> Any:
    assert not result.is_error, text(result)
    return orjson.loads(text(result))


def with_client(
    env: dict[str, str], body: Callable[[Client], Awaitable[None]], cwd: Path | None = None
) -> None:
    params = StdioServerParameters(command=SESSIONCTL, args=["mcp"], env=env, cwd=cwd)

    async def main() -> None:
        with anyio.fail_after(60):
            async with Client(params) as client:
                await body(client)

    anyio.run(main)


def mcp_env(d: Daemon) -> dict[str, str]:
    return {"SESSIOND_SOCKET": str(d.socket), "PATH": d.env["PATH"]}


def test_an_mcp_client_lists_the_syscalls_and_reads_creates_sends_and_pages_the_log() -> None:
    with running() as d:

        async def body(client: Client) -> None:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == SYSCALLS
            for name, tool in tools.items():
                assert tool.annotations is not None
                assert tool.annotations.read_only_hint is (name in READ_ONLY), name

            assert value(await client.call_tool("ps", {})) == []
            created = value(await client.call_tool("create", {"spec": SPEC}))
            assert created["name"] == "inbox"
            assert created["state"] == "sleeping"  # armed by its message trigger
            for n in range(3):
                sent = value(await client.call_tool("send", {"name": "inbox", "text": f"m{n}"}))
                assert sent["seq"] > 0
            (row,) = value(await client.call_tool("ps", {}))
            assert row["name"] == "inbox"

            # the log, a page at a time, reaches every event exactly once
            seen: list[dict[str, Any]] = []
            since: int | None = 1
            while since is not None:
                page = value(
                    await client.call_tool("log", {"name": "inbox", "since": since, "limit": 2})
                )
                assert len(page["events"]) <= 2
                seen.extend(page["events"])
                since = page["next_since"]
            assert [r["seq"] for r in seen] == list(range(1, len(seen) + 1))
            texts = [r["data"]["text"] for r in seen if r["type"] == "message.received"]
            assert texts == ["m0", "m1", "m2"]
            senders = {r["data"]["sender"] for r in seen if r["type"] == "message.received"}
            assert senders == {"mcp"}

        with_client(mcp_env(d), body, cwd=d.root)
        # what the client did is what the daemon holds, as sessionctl sees it
        assert len(d.json("log", "inbox")) >= 3
        # the page is cut in the daemon (`first`): the rest of the log is not sent
        with Connection(d.socket) as conn:
            page = conn.call("log", {"name": "inbox", "since": 2, "first": 2})
            assert [r["seq"] for r in page] == [2, 3]
            with pytest.raises(RemoteError, match=r"first .* goes with neither"):
                conn.call("log", {"name": "inbox", "first": 2, "limit": 1})


def test_operator_tools_are_absent_and_refusals_carry_sessionctls_text() -> None:
    with running() as d:
        ctl = d.ctl("show", "nobody")
        assert ctl.returncode == 4
        expected = ctl.stderr.strip().removeprefix("sessionctl: ")

        async def body(client: Client) -> None:
            for name in OPERATOR:
                refused = await client.call_tool(name, {"name": "inbox"})
                assert refused.is_error
                assert f"Unknown tool: {name}" in text(refused)
            missing = await client.call_tool("show", {"name": "nobody"})
            assert missing.is_error
            assert text(missing) == expected
            bad = await client.call_tool("create", {"spec": "name = 'x'\nnope = 1\n"})
            assert bad.is_error
            assert "nope" in text(bad)

        with_client(mcp_env(d), body)
        assert d.json("ps") == []  # nothing was created by the refused calls


def test_sessionctl_ps_does_not_load_the_mcp_sdk() -> None:
    """`sessionctl ps` stays lean: the MCP SDK and pydantic load only for `sessionctl mcp`."""
    probe = (
        "import sys\n"
        "from sessiond.ctl import main\n"
        "code = main(['--socket', '/nonexistent/s.sock', 'ps'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mcp', 'mcp_types', 'pydantic', 'anyio', 'pydantic_ai'))\n"
        "print(code, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "3 []"


def test_inside_a_run_the_server_uses_the_program_endpoint_and_its_grants() -> None:
    """A run's `sessionctl mcp` speaks for that run: it sends as its session, and a
    method its spec does not grant is refused there, with the endpoint's reason."""
    program = Path(__file__).parent / "programs" / "mcp_client.py"
    with running() as d:
        d.ctl("create", str(d.write_spec("inbox", SPEC)), check=True)
        out = d.root / "answers.json"
        spec = f"""name = "caller"
[run]
kind = "command"
exec = ["{sys.executable}", "{program}", "inbox", "{out}"]
"""
        d.ctl("create", str(d.write_spec("caller", spec)), check=True)
        d.ctl("activate", "caller", check=True)
        wait_event(d, "caller", "run.finished")
        answers = orjson.loads(out.read_bytes())
        assert not answers["send"]["error"], answers
        assert answers["create"]["error"]
        assert "may not call create: its spec does not grant it" in answers["create"]["text"]
        (message,) = d.json("log", "inbox", "--type", "message.received")
        assert message["data"]["sender"] == "caller"  # as its session, not as "mcp"
        assert "sneaky" not in {r["name"] for r in d.json("ps")}


def test_the_server_starts_without_a_daemon_and_says_what_sessionctl_says() -> None:
    """Registered in a client before the daemon runs, it answers each call with the
    "not reachable" text of sessionctl (and reaches the daemon once it is up)."""
    root = short_dir()
    daemon = Daemon(root)
    try:
        socket = daemon.socket
        env = {"SESSIOND_SOCKET": str(socket), "PATH": os.environ.get("PATH", "")}
        ctl = subprocess.run(
            [SESSIONCTL, "ps"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert ctl.returncode == 3

        async def body(client: Client) -> None:
            down = await client.call_tool("ps", {})
            assert down.is_error
            assert text(down) == ctl.stderr.strip().removeprefix("sessionctl: ")
            await anyio.to_thread.run_sync(daemon.start)
            assert value(await client.call_tool("ps", {})) == []  # the same server, now served

        with_client(env, body)
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
