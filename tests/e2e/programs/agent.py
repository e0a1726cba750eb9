"""A scripted SDK agent for the tests: reads, (charges), asks a model, asks to edit,
edits, verifies, completes.

Every piece of real work appends a line to a count file (``read.count``,
``charge.count``, ``model.count``, ``edits.count``): every run is a new process,
so the files are how a test sees that a finished step never ran twice. A test can
hold the program at a point by naming a file in ``AGENT_HOLD_<POINT>``: the
program writes ``<file>.reached`` and waits until ``<file>`` exists.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from sessiond.sdk import Denied, connect


def count(name: str, word: str) -> None:
    with open(f"{name}.count", "a") as f:
        f.write(f"{word}\n")


def hold(point: str) -> None:
    """Test only: wait here (as a slow tool would) until the test lets go."""
    name = os.environ.get(f"AGENT_HOLD_{point}")
    if not name:
        return
    Path(f"{name}.reached").write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not Path(name).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def read() -> str:
    count("read", "read")
    return Path("f.txt").read_text()


def charge() -> dict[str, Any]:
    count("charge", "charge")
    return {"charged": 42, "key": run.key()}


def model() -> dict[str, Any]:
    count("model", "model")
    return {
        "say": "edit f.txt",
        "content": [{"type": "text", "text": "I will edit f.txt"}],
        "usage": {"input_tokens": 120, "output_tokens": 8},
    }


with connect() as run:
    ctx = run.context()
    with open("context.seen", "a") as f:
        f.write(f"{len(ctx['messages'])} {ctx['wakes'][0]['trigger']}\n")
    text = run.step(
        "read_file", read, args={"path": "f.txt"}, side_effect="read", idempotency="safe",
        resume="replay-from-event",
    )  # fmt: skip
    if os.environ.get("AGENT_CHARGE"):
        receipt = run.step("charge_card", charge, args={"amount": 42})
        Path("receipt.seen").write_text(f"{receipt['charged']} {receipt['key']}\n")
        hold("AFTER_CHARGE")
    request = {"messages": ctx["messages"], "note": "scripted model", "file": text}
    answer = run.model_call("scripted-1", request, model)
    assert answer["say"] == "edit f.txt"

    def edit() -> str:
        count("edits", "edit")
        hold("IN_EDIT")
        Path("f.txt").write_text(text + "fixed\n")
        return "appended 'fixed' to f.txt"

    try:
        run.step(
            "edit_file", edit, args={"path": "f.txt"}, writes=["f.txt"],
            side_effect="workspace-write", idempotency="unsafe",
            resume="require-user-confirmation",
        )  # fmt: skip
    except Denied:
        count("denied", "denied")
        run.sleep()
        sys.exit(0)
    run.verify(
        "f.txt ends with fixed", ok=Path("f.txt").read_text().endswith("fixed\n"), output="checked"
    )
    if os.environ.get("AGENT_SEND_TO"):
        run.send(os.environ["AGENT_SEND_TO"], "f.txt is fixed")
    run.complete(summary="f.txt fixed and verified")
