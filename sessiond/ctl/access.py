"""Other ways in: ``sessionctl web`` (a login for the web console, docs/design.md
section 11) and ``sessionctl mcp`` (the syscalls over MCP for agents, section 12).
The MCP SDK is imported only by ``mcp``: ``sessionctl ps`` stays lean.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from sessiond.paths import default_socket
from sessiond.wire import Connection


def serve_mcp(args: argparse.Namespace) -> int:
    """`sessionctl mcp`: a server that connects per tool call, so it needs no
    daemon to start."""
    from sessiond.ctl import mcp

    return mcp.serve(args.socket or default_socket(), os.environ.get("SESSIOND_TOKEN"))


def web_login(conn: Connection, args: argparse.Namespace) -> tuple[Any, str]:  # noqa: ARG001
    r = conn.call("web.login", {})
    text = (
        f"{r['url']}\n(a new login for {r['user']}: open it in a browser; "
        "your earlier one no longer works)"
    )
    return r, text
