"""Turns and durable steps in process: the real SDK (sessiond.sdk.Run) in a thread,
its calls through the program endpoint's dispatch table. A program that runs again
for its turn never repeats a step that finished; an approval or a denial continues
the turn (moved from tests/e2e/test_sdk.py and tests/e2e/test_steps.py; what needs a
real process, a kill -9 mid-step, stays there)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from sessiond.sdk import Denied
from tests.inproc.fakes import FakeRun
from tests.inproc.harness import Harness

SPEC = """name = "agent"
goal = "fix f.txt"
[run]
kind = "sdk"
exec = ["true", "agent"]
cwd = "."
[policy]
allow = ["charge_card"]
ask = ["edit_file"]
"""


class Agent:
    """tests/e2e/programs/agent.py in process: reads, (charges), asks a model, asks to
    edit, edits, verifies, completes. ``work`` counts each piece of real work."""

    def __init__(self, h: Harness, *, charge: bool = False) -> None:
        self.charge = charge
        self.work: Counter[str] = Counter()
        self.seen: list[str] = []  # what each run's context said: messages and wake
        self.receipts: list[str] = []
        (h.root / "f.txt").write_text("broken\n")
        h.program("agent")(self.program)

    async def program(self, fake: FakeRun) -> int:
        return await fake.sdk(lambda run: self.main(run, Path(fake.cwd)))

    def main(self, run: Any, cwd: Path) -> int:
        ctx = run.context()
        self.seen.append(f"{len(ctx['messages'])} {ctx['wakes'][0]['trigger']}")

        def read() -> str:
            self.work["read"] += 1
            return (cwd / "f.txt").read_text()

        text = run.step(
            "read_file", read, args={"path": "f.txt"}, side_effect="read", idempotency="safe",
            resume="replay-from-event",
        )  # fmt: skip
        if self.charge:

            def charge() -> dict[str, Any]:
                self.work["charge"] += 1
                return {"charged": 42, "key": run.key()}

            receipt = run.step("charge_card", charge, args={"amount": 42})
            self.receipts.append(f"{receipt['charged']} {receipt['key']}")

        def model() -> dict[str, Any]:
            self.work["model"] += 1
            return {
                "say": "edit f.txt",
                "content": [{"type": "text", "text": "I will edit f.txt"}],
                "usage": {"input_tokens": 120, "output_tokens": 8},
            }

        request = {"messages": ctx["messages"], "note": "scripted model", "file": text}
        assert run.model_call("scripted-1", request, model)["say"] == "edit f.txt"

        def edit() -> str:
            self.work["edits"] += 1
            (cwd / "f.txt").write_text(text + "fixed\n")
            return "appended 'fixed' to f.txt"

        try:
            run.step(
                "edit_file", edit, args={"path": "f.txt"}, writes=["f.txt"],
                side_effect="workspace-write", idempotency="unsafe",
                resume="require-user-confirmation",
            )  # fmt: skip
        except Denied:
            self.work["denied"] += 1
            run.sleep()
            return 0
        ok = (cwd / "f.txt").read_text().endswith("fixed\n")
        run.verify("f.txt ends with fixed", ok=ok, output="checked")
        run.complete(summary="f.txt fixed and verified")
        return 0


def to(state: str) -> Any:
    return lambda r: r["data"]["to"] == state


async def test_an_approval_round_trip_runs_the_edit_exactly_once(h: Harness) -> None:
    agent = Agent(h)
    await h.create(SPEC, "agent")
    await h.call("activate", name="agent")
    blocked = await h.event("agent", "lifecycle.changed", to("blocked"))
    assert blocked["data"]["reason"].startswith("approval pending for edit_file")
    await h.idle()
    (pending,) = (await h.call("show", name="agent"))["pending_approvals"]
    assert pending["tool"] == "edit_file"
    assert agent.work["edits"] == 0  # the block did not run
    await h.call("approve", name="agent", by="ann")
    done = await h.event("agent", "lifecycle.changed", to("terminated"))
    assert done["data"]["outcome"] == "completed"
    assert done["data"]["reason"] == "completed: f.txt fixed and verified"
    await h.idle()
    assert agent.work["edits"] == 1  # once
    assert (h.root / "f.txt").read_text() == "broken\nfixed\n"
    types = await h.types("agent")
    assert types.count("approval.requested") == 1  # the same intent was not asked again
    assert types.count("approval.granted") == 1
    finished = await h.log("agent", types=["tool.finished"])
    edit = [r for r in finished if r["data"]["tool"] == "edit_file"]
    assert len(edit) == 1
    assert edit[0]["data"]["diff"] is not None  # the text change is kept as a diff
    model = (await h.log("agent", types=["model.requested"]))[0]["data"]
    assert model["model"] == "scripted-1"
    assert model["ordinal"] == 2  # read_file was step 1
    context = h.store.artifacts("agent").get(model["context"]["ref"])
    assert b'"note":"scripted model"' in context
    responded = (await h.log("agent", types=["model.responded"]))[0]["data"]
    assert (responded["tokens_in"], responded["tokens_out"]) == (120, 8)
    verified = (await h.log("agent", types=["verification.finished"]))[-1]["data"]
    assert verified["ok"] is True
    policy = [r["data"]["rule"] for r in await h.log("agent", types=["policy.decided"])]
    assert "default: read allowed" in policy
    assert "ask: edit_file" in policy


async def test_a_denial_is_replayed_as_a_denial_in_every_later_run_of_the_turn(
    h: Harness,
) -> None:
    agent = Agent(h)
    await h.create(SPEC, "agent")
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    await h.call("deny", name="agent", reason="not today")
    assert agent.work["edits"] == 0
    first = (await h.call("show", name="agent"))["seq"]
    await h.call("activate", name="agent")  # continues the turn: the program runs again
    slept = await h.event("agent", "lifecycle.changed", to("sleeping"), after=first)
    assert slept["data"]["reason"] == "the program chose to sleep"
    await h.idle()
    # The rerun got Denied at the same step without a new question, and ran nothing.
    assert agent.work["denied"] == 1
    assert agent.work["edits"] == 0
    assert (await h.types("agent")).count("approval.requested") == 1
    assert (agent.work["read"], agent.work["model"]) == (1, 1)  # replayed, not done again
    view = await h.messages("agent")
    assert any("edit_file was denied" in m["content"] for m in view)


async def test_an_approval_continues_the_turn_and_repeats_no_finished_step(h: Harness) -> None:
    agent = Agent(h, charge=True)
    await h.create(SPEC, "agent")
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    assert (agent.work["charge"], agent.work["model"], agent.work["edits"]) == (1, 1, 0)
    run1 = (await h.call("show", name="agent"))["last_run"]
    assert run1["status"] != "failed"  # a stop for an approval is not a failed run
    await h.call("approve", name="agent")
    done = await h.event("agent", "lifecycle.changed", to("terminated"))
    assert done["data"]["outcome"] == "completed"
    await h.idle()
    assert dict(agent.work) == {"read": 1, "charge": 1, "model": 1, "edits": 1}
    started = [r["data"]["tool"] for r in await h.log("agent", types=["tool.started"])]
    assert (started.count("charge_card"), started.count("edit_file")) == (1, 1)
    runs = await h.log("agent", types=["run.started"])
    assert [r["data"]["turn"] for r in runs] == [1, 1]  # two runs, one turn
    # Both runs saw the turn's own wake, not the approval that continued it.
    assert len(agent.seen) == 2
    assert agent.seen[0] == agent.seen[1]
    assert agent.seen[0].endswith(" manual")
    # The charge's stable key is the same in both runs (the second got it replayed).
    assert agent.receipts == ["42 agent.t1.2", "42 agent.t1.2"]
    finished = await h.log("agent", types=["run.finished"])
    assert [r["data"]["ends_turn"] for r in finished] == [False, True]
