"""A step's identity at its place in the turn: kind, name, args digest and key.

Each program counts the work its steps really do in a ledger in its workspace
(``<name>.count``, one line per execution: every run is a new process). A later
run of the turn that asks, at a recorded place, for a step that differs in any of
the four is a divergence: the daemon answers before the work runs, the SDK raises
``Diverged``, and the session blocks for a person. Nested steps (a step whose
``fn`` takes steps) have their places inside their parent's. What needs no real
process runs in process (tests/inproc/test_step_identity.py); here, a kill -9
right after a keyed step, and an asyncio program.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.harness import Daemon, wait_event, wait_for
from tests.e2e.test_steps_attack import d, lines, program, settled, to

__all__ = ["d"]  # the daemon fixture, shared with the attack suite

POLICY = 'allow = ["charge_card", "wire_transfer", "outer", "inner*"]\nask = ["edit_file"]'


def divergences(d: Daemon) -> list[dict[str, Any]]:
    return [
        e["data"]["divergence"]
        for e in d.json("log", "agent", "--type", "gate.evaluated")
        if e["data"].get("divergence")
    ]


# --- the key is part of a step's identity ------------------------------------------

KEY_FROM_FILE = """
key = Path("key.txt").read_text().strip() or None
with connect() as run:
    run.step("charge_card", lambda: count("charge"), args={"cents": 500}, key=key)
    if Path("hold-after-charge").exists() and not Path("released").exists():
        hold("held")
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


def test_a_changed_key_is_a_divergence_even_when_the_step_was_the_last_recorded(
    d: Daemon,
) -> None:
    """The run is cut off (the daemon killed -9) right after the keyed step: nothing
    after it is recorded, and still its new key at the same place does not run it."""
    (d.root / "key.txt").write_text("order-1\n")
    (d.root / "hold-after-charge").write_text("")
    program(d, KEY_FROM_FILE, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_for((d.root / "held.reached").exists, what="the charge to finish")
    d.kill9()
    (d.root / "key.txt").write_text("order-2\n")
    (d.root / "released").write_text("")
    (d.root / "held").write_text("")
    d.start()
    assert settled(d) == "blocked"
    assert (lines(d, "charge"), lines(d, "edits")) == (1, 0)
    [div] = divergences(d)
    assert div["asked"]["name"] == "charge_card"
    assert div["key"] == "order-2"


# --- nested steps ------------------------------------------------------------------


NESTED_ASYNC = """
import asyncio
async def main():
    async with connect_async() as run:
        async def outer():
            a = await run.step("inner_a", lambda: count("inner_a", "A"), **SAFE)
            said = await run.model_call("m-1", {"q": a}, lambda: count("model") and {"say": "B"})
            return a + said["say"]
        both = await run.step("outer", outer, **SAFE)
        Path("both.txt").write_text(both)
        await run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
        await run.complete()
asyncio.run(main())
"""


def test_nested_steps_and_model_calls_in_an_async_program(d: Daemon) -> None:
    program(d, NESTED_ASYNC, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert divergences(d) == []
    assert [lines(d, n) for n in ("inner_a", "model", "edits")] == [1, 1, 1]
    assert (d.root / "both.txt").read_text() == "AB"
    [requested] = d.json("log", "agent", "--type", "model.requested")
    assert requested["data"]["parent"] == "1"
