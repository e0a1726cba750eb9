"""A session's program that uses `sessionctl mcp` from inside its run.

It sends to the session named in argv[1] and tries a create its spec does not
grant, and writes what each answered to argv[2] (JSON).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import anyio
import orjson
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import TextContent


async def main() -> None:
    to, out = sys.argv[1], Path(sys.argv[2])
    sessionctl = shutil.which("sessionctl")
    assert sessionctl is not None
    env = {k: v for k, v in os.environ.items() if k.startswith("SESSIOND_")}
    params = StdioServerParameters(command=sessionctl, args=["mcp"], env=env)
    answers = {}
    async with Client(params) as client:
        for name, args in (
            ("send", {"name": to, "text": "from inside a run"}),
            ("create", {"spec": 'name = "sneaky"\n'}),
        ):
            result = await client.call_tool(name, args)
            (block,) = result.content
            assert isinstance(block, TextContent)
            answers[name] = {"error": result.is_error, "text": block.text}
    out.write_bytes(orjson.dumps(answers))


anyio.run(main)
