"""A scripted SDK agent for the tests: reads, asks to edit, edits, verifies, completes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sessiond.sdk import ApprovalPending, Denied, connect

with connect() as run:
    ctx = run.context()
    Path("context.seen").write_text(f"{len(ctx['messages'])} {ctx['wakes'][0]['trigger']}\n")
    with run.tool("read_file", {"path": "f.txt"}, side_effect="read", idempotency="safe") as call:
        call.finish(output=Path("f.txt").read_text(), observation="read f.txt")
    request = {"messages": ctx["messages"], "note": "scripted model"}
    run.model(
        model="scripted-1",
        request=request,
        response={"say": "edit f.txt"},
        tokens_in=120,
        tokens_out=8,
        text="I will edit f.txt",
        tools=["read_file", "edit_file"],
    )
    try:
        with run.tool(
            "edit_file",
            {"path": "f.txt"},
            writes=["f.txt"],
            side_effect="workspace-write",
            idempotency="unsafe",
            resume="require-user-confirmation",
        ) as call:
            Path("f.txt").write_text(Path("f.txt").read_text() + "fixed\n")
            with open("edits.count", "a") as f:
                f.write("edit\n")
            call.finish(observation="appended 'fixed' to f.txt")
    except ApprovalPending:
        sys.exit(0)  # the session runs again once a person answers
    except Denied:
        run.sleep()
        sys.exit(0)
    run.verify(
        "f.txt ends with fixed", ok=Path("f.txt").read_text().endswith("fixed\n"), output="checked"
    )
    if os.environ.get("AGENT_SEND_TO"):
        run.send(os.environ["AGENT_SEND_TO"], "f.txt is fixed")
    run.complete(summary="f.txt fixed and verified")
