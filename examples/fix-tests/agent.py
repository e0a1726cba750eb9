"""A coding agent in the style of one fixing a failing test, driven by a scripted
"model" so it runs offline and deterministically.

Where a real model client plugs in: `ScriptedModel.complete()` below. Replace it
with a call to your provider (send `messages` and `tools`, get text and a tool
call back) and keep the `run.model_call(...)` around it unchanged: it records the
request and the response, and a later run of the same turn gets the recorded
response back without asking the model again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sessiond.sdk import Denied, connect

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


def run_tests() -> list[Any]:
    done = subprocess.run([sys.executable, "test_calc.py"], capture_output=True, text=True)
    return [done.returncode == 0, done.stdout + done.stderr]


with connect() as run:
    # Every run of a turn starts here. Steps that finished in an earlier run of the
    # turn (before an approval, a crash, a retry) are answered from the log: the
    # tests are not run again, the model is not asked again, the edit is not redone.
    ctx = run.context()
    source = run.step("read_file", lambda: Path("calc.py").read_text(), args={"path": "calc.py"},
                      side_effect="read", idempotency="safe", resume="replay-from-event")
    ok, output = run.step("run_tests", run_tests, args={"cmd": "test_calc.py"},
                          side_effect="read", idempotency="safe", resume="replay-from-event")
    if ok:
        run.complete(summary="the tests already pass")
        sys.exit(0)

    model = ScriptedModel()
    request = {"messages": ctx["messages"], "source": source, "failures": output, "tools": TOOLS}
    answer = run.model_call(model.name, request,
                            lambda: model.complete(ctx["messages"], source, output),
                            usage=lambda r: (r["usage"]["in"], r["usage"]["out"]))

    def edit() -> str:
        if os.environ.get("FIXTESTS_PAUSE"):  # the crash drill: time to kill -9 the daemon
            time.sleep(float(os.environ["FIXTESTS_PAUSE"]))
        Path("calc.py").write_text(answer["edit"])
        return "calc.py: add() now returns a + b"

    try:
        # Needs a person's approval (policy ask). Without one, ApprovalPending ends this
        # run; after `sessionctl approve` the next run replays the steps above and
        # makes this edit once.
        run.step("edit_file", edit, args={"path": "calc.py", "content": answer["edit"]},
                 writes=["calc.py"], side_effect="workspace-write", idempotency="unsafe",
                 resume="require-user-confirmation")
    except Denied:
        run.sleep()
        sys.exit(0)
    ok, output = run_tests()
    run.verify("test_calc.py", ok=ok, output=output)
    if ok:
        run.complete(summary="fixed add() in calc.py; the tests pass")
    else:
        run.sleep()
