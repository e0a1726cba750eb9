"""A coding agent in the style of one fixing a failing test, driven by a scripted
"model" so it runs offline and deterministically.

Where a real model client plugs in: `ScriptedModel.complete()` below. Replace it
with a call to your provider (send `messages` and `tools`, get text and a tool
call back) and keep the `run.model(...)` record around it unchanged: that record
is what makes the run auditable and resumable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sessiond.sdk import ApprovalPending, Denied, connect

TOOLS = ["read_file", "run_tests", "edit_file"]


class ScriptedModel:
    """Stands in for an LLM: the same context always gets the same answer."""

    name = "scripted-coder-1"

    def complete(self, messages: list[dict[str, Any]], source: str, failures: str) -> dict[str, Any]:
        if "a - b" in source:
            return {
                "text": f"The test fails ({failures.strip()}); add() subtracts. Change it to a + b.",
                "edit": source.replace("a - b", "a + b"),
                "usage": {"in": 40 * len(messages) + len(source), "out": 30},
            }
        return {"text": "Nothing to change.", "edit": None, "usage": {"in": 50, "out": 5}}


def run_tests() -> tuple[bool, str]:
    done = subprocess.run([sys.executable, "test_calc.py"], capture_output=True, text=True)
    return done.returncode == 0, done.stdout + done.stderr


with connect() as run:
    ctx = run.context()
    with run.tool("read_file", {"path": "calc.py"}, side_effect="read", idempotency="safe") as call:
        source = Path("calc.py").read_text()
        call.finish(output=source, observation=f"read calc.py ({len(source)} bytes)")
    with run.tool("run_tests", {"cmd": "test_calc.py"}, side_effect="read", idempotency="safe") as call:
        ok, output = run_tests()
        call.finish(status="ok", output=output, observation=f"tests {'pass' if ok else 'fail'}: {output.strip()}")
    if ok:
        run.complete(summary="the tests already pass")
        sys.exit(0)

    model = ScriptedModel()
    started = time.monotonic()
    answer = model.complete(ctx["messages"], source, output)
    run.model(
        model=model.name,
        request={"messages": ctx["messages"], "source": source, "failures": output, "tools": TOOLS},
        response=answer,
        tokens_in=answer["usage"]["in"],
        tokens_out=answer["usage"]["out"],
        text=answer["text"],
        tools=TOOLS,
        started=started,
    )
    try:
        with run.tool("edit_file", {"path": "calc.py", "content": answer["edit"]}, writes=["calc.py"],
                      side_effect="workspace-write", idempotency="unsafe",
                      resume="require-user-confirmation") as call:
            if os.environ.get("FIXTESTS_PAUSE"):  # the crash drill: time to kill -9 the daemon
                time.sleep(float(os.environ["FIXTESTS_PAUSE"]))
            Path("calc.py").write_text(answer["edit"])
            call.finish(observation="calc.py: add() now returns a + b")
    except ApprovalPending:
        sys.exit(0)  # a person answers with sessionctl approve/deny; the session runs again
    except Denied:
        run.sleep()
        sys.exit(0)
    ok, output = run_tests()
    run.verify("test_calc.py", ok=ok, output=output)
    if ok:
        run.complete(summary="fixed add() in calc.py; the tests pass")
    else:
        run.sleep()
