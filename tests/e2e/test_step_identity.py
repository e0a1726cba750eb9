"""A step's identity at its place in the turn: kind, name, args digest and key.

Each program counts the work its steps really do in a ledger in its workspace
(``<name>.count``, one line per execution: every run is a new process). A later
run of the turn that asks, at a recorded place, for a step that differs in any of
the four is a divergence: the daemon answers before the work runs, the SDK raises
``Diverged``, and the session blocks for a person. Nested steps (a step whose
``fn`` takes steps) have their places inside their parent's.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.harness import Daemon, wait_event, wait_for
from tests.e2e.test_steps_attack import d, lines, program, seq, settled, to

__all__ = ["d"]  # the daemon fixture, shared with the attack suite

POLICY = 'allow = ["charge_card", "wire_transfer", "outer", "inner*"]\nask = ["edit_file"]'


def blocked_after(d: Daemon, since: int) -> dict[str, Any]:
    event: dict[str, Any] = wait_event(
        d, "agent", "lifecycle.changed", since=since, match=to("blocked")
    )
    return event


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


def test_a_changed_key_at_a_recorded_place_is_a_divergence_not_a_second_charge(
    d: Daemon,
) -> None:
    """Old code: the key *was* the place, so a new key was a new place: the card was
    charged again, with no divergence, and the session completed."""
    (d.root / "key.txt").write_text("order-1\n")
    program(d, KEY_FROM_FILE, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))  # edit_file asks
    assert lines(d, "charge") == 1
    (d.root / "key.txt").write_text("order-2\n")
    since = seq(d) + 1
    d.ctl("approve", "agent", check=True)
    blocked = blocked_after(d, since)
    assert "order-1" in blocked["data"]["reason"]
    assert "order-2" in blocked["data"]["reason"]
    assert settled(d) == "blocked"
    assert (lines(d, "charge"), lines(d, "edits")) == (1, 0)
    [div] = divergences(d)
    assert (div["recorded"]["name"], div["asked"]["name"]) == ("charge_card", "charge_card")
    # the person's choice: end the turn; nothing ran twice
    d.ctl("resolve", "agent", "--discard", check=True)
    assert lines(d, "charge") == 1


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


def test_an_unkeyed_step_that_becomes_keyed_diverges_before_it_runs(d: Daemon) -> None:
    """Old code: the keyed step took a slot of its own and ran again, then the next
    step diverged."""
    (d.root / "key.txt").write_text("\n")  # no key in the first run
    program(d, KEY_FROM_FILE, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    (d.root / "key.txt").write_text("order-1\n")
    since = seq(d) + 1
    d.ctl("approve", "agent", check=True)
    blocked = blocked_after(d, since)
    assert "charge_card" in blocked["data"]["reason"]
    assert settled(d) == "blocked"
    assert (lines(d, "charge"), lines(d, "edits")) == (1, 0)
    [div] = divergences(d)
    assert (div["asked"]["name"], div["key"]) == ("charge_card", "order-1")


def test_a_keyed_step_that_loses_its_key_diverges_before_it_runs(d: Daemon) -> None:
    (d.root / "key.txt").write_text("order-1\n")
    program(d, KEY_FROM_FILE, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    (d.root / "key.txt").write_text("\n")
    since = seq(d) + 1
    d.ctl("approve", "agent", check=True)
    blocked_after(d, since)
    assert settled(d) == "blocked"
    assert (lines(d, "charge"), lines(d, "edits")) == (1, 0)
    [div] = divergences(d)
    assert div["asked"]["name"] == "charge_card"
    assert div["key"] is None


TWO_KEYS_SAME_STEP = """
from sessiond.sdk import RemoteError
with connect() as run:
    run.step("charge_card", lambda: count("charge"), args={"cents": 500}, key="a")
    try:
        run.step("charge_card", lambda: count("charge"), args={"cents": 500}, key="b")
    except RemoteError as exc:
        Path("refused.txt").write_text(str(exc))
    run.complete()
"""


def test_two_keyed_steps_told_apart_only_by_their_keys_are_refused_at_the_first_run(
    d: Daemon,
) -> None:
    """Two keyed steps at one place with the same kind, name and args could not be
    told from a key that changed: the second is refused before it runs, by name."""
    program(d, TWO_KEYS_SAME_STEP, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert lines(d, "charge") == 1
    refused = (d.root / "refused.txt").read_text()
    assert "charge_card" in refused, refused
    assert "args" in refused, refused


# --- nested steps ------------------------------------------------------------------

NESTED = """
def outer():
    count("outer")
    a = run.step("inner_a", lambda: count("inner_a", "A"), **SAFE)
    b = run.step("inner_b", lambda: count("inner_b", "B"), args={"a": a}, **SAFE)
    return a + b
with connect() as run:
    both = run.step("outer", outer, **SAFE)
    Path("both.txt").write_text(both)
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""


def test_nested_steps_replay_with_no_false_divergence(d: Daemon) -> None:
    """Old code: the inner steps took the ordinals after their parent's, so the next
    run (which replays the parent without calling its fn) asked for edit_file where
    inner_a was recorded: a false divergence on every continuation."""
    program(d, NESTED, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert divergences(d) == []
    assert [lines(d, n) for n in ("outer", "inner_a", "inner_b", "edits")] == [1, 1, 1, 1]
    assert (d.root / "both.txt").read_text() == "AB"
    intents = d.json("log", "agent", "--type", "tool.intent")
    parents = {e["data"]["tool"]: e["data"].get("parent") for e in intents}
    assert parents == {"outer": None, "inner_a": "1", "inner_b": "1", "edit_file": None}


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


NESTED_ASKS = """
def outer():
    count("outer")
    run.step("inner_pay", lambda: count("inner_pay"), **SAFE)
    which = Path("plan.txt").read_text().strip()
    run.step(which, lambda: count(which), side_effect="workspace-write")
    return "done"
with connect() as run:
    run.step("outer", outer)                        # external-write, unsafe, never-rerun
    run.step("inner_after", lambda: count("after"), **SAFE)
    run.complete()
"""


def test_an_approval_inside_a_nested_step_runs_each_inner_step_once(d: Daemon) -> None:
    """A step inside a parent asks a person: the run ends inside the parent. The next
    run enters the parent again (its own code is not a step), replays the inner step
    that finished and runs the approved one once. Old code: the parent, an unsafe
    step, was recorded failed, and the turn blocked for good."""
    (d.root / "plan.txt").write_text("edit_file\n")
    program(d, NESTED_ASKS, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    d.ctl("approve", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert divergences(d) == []
    assert [lines(d, n) for n in ("inner_pay", "edit_file", "after")] == [1, 1, 1]
    assert lines(d, "outer") == 2  # the parent's own code, not a step


def test_a_divergence_inside_a_nested_step_is_found_before_the_work(d: Daemon) -> None:
    (d.root / "plan.txt").write_text("edit_file\n")
    program(d, NESTED_ASKS, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("blocked"))
    (d.root / "plan.txt").write_text("inner_wipe\n")
    since = seq(d) + 1
    d.ctl("approve", "agent", check=True)
    blocked = blocked_after(d, since)
    assert "inner_wipe" in blocked["data"]["reason"]
    assert settled(d) == "blocked"
    assert [lines(d, n) for n in ("inner_pay", "edit_file", "inner_wipe", "after")] == [1, 0, 0, 0]
    since = seq(d) + 1
    d.ctl("resolve", "agent", "--accept", check=True)  # the new path inside the parent
    wait_event(d, "agent", "lifecycle.changed", since=since, match=to("terminated"))
    assert [lines(d, n) for n in ("inner_pay", "edit_file", "inner_wipe", "after")] == [1, 0, 1, 1]


NESTED_FAILS = """
def outer():
    count("outer")
    run.step("inner_pay", lambda: count("inner_pay"), **SAFE)
    def ship():
        count("ship")
        if not Path("fixed").exists():
            raise RuntimeError("the carrier said 503")
        return "shipped"
    return run.step("inner_ship", ship)             # unsafe: a person decides
with connect() as run:
    run.step("outer", outer)
    run.complete()
"""


def test_a_failed_nested_step_is_judged_alone_and_rerun_once(d: Daemon) -> None:
    """The step inside fails: it alone blocks (its parent ended 'stopped', not
    failed), one --rerun runs it once more, and the step before it is replayed."""
    program(d, NESTED_FAILS, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    assert settled(d) == "blocked"
    reason = d.json("show", "agent")["reason"]
    assert "inner_ship" in reason
    assert "outer" not in reason.replace("inner_ship", "")
    (d.root / "fixed").write_text("")
    d.ctl("resolve", "agent", "--rerun", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert [lines(d, n) for n in ("outer", "inner_pay", "ship")] == [2, 1, 2]
    assert divergences(d) == []


# --- resolve --rerun reruns exactly the step it names ------------------------------

FAILS_ONCE = """
which = Path("which.txt").read_text().strip()
def work():
    count(which)
    if not Path("fixed").exists():
        raise RuntimeError("the payment service said 503")
    return "paid"
with connect() as run:
    run.step(which, work, args={"cents": 500})
    run.complete()
"""


def test_rerun_of_a_failed_step_is_refused_to_another_step_at_its_place(d: Daemon) -> None:
    """Old code: --rerun marked charge_card to run again, and the next run's
    wire_transfer at that place ran in its stead, with no divergence."""
    (d.root / "which.txt").write_text("charge_card\n")
    program(d, FAILS_ONCE, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    assert settled(d) == "blocked"  # a failed unsafe step: a person decides
    assert lines(d, "charge_card") == 1
    (d.root / "which.txt").write_text("wire_transfer\n")
    since = seq(d) + 1
    d.ctl("resolve", "agent", "--rerun", check=True)
    blocked = blocked_after(d, since)
    assert "wire_transfer" in blocked["data"]["reason"]
    assert "charge_card" in blocked["data"]["reason"]
    assert settled(d) == "blocked"
    assert (lines(d, "charge_card"), lines(d, "wire_transfer")) == (1, 0)


def test_rerun_of_a_failed_step_runs_that_step_once_more(d: Daemon) -> None:
    (d.root / "which.txt").write_text("charge_card\n")
    program(d, FAILS_ONCE, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    assert settled(d) == "blocked"
    (d.root / "fixed").write_text("")
    d.ctl("resolve", "agent", "--rerun", check=True)
    wait_event(d, "agent", "lifecycle.changed", match=to("terminated"))
    assert lines(d, "charge_card") == 2
    assert divergences(d) == []


# --- what a program may not claim -------------------------------------------------

CLAIMS = """
from sessiond.sdk import RemoteError
with connect() as run:
    began = run._begin(kind="tool", name="charge_card", ordinal=1, args={"cents": 500})
    count("charge")
    try:   # no step inside it, no stop: 'stopped' would make it safe to run again
        run._call("sdk.step_done", call=began["call"], status="stopped")
    except RemoteError as exc:
        Path("refused-stopped.txt").write_text(str(exc))
    try:   # a parent that is not a step under way in this run
        run._begin(kind="tool", name="inner_x", ordinal=1, parent="r9.9", args={})
    except RemoteError as exc:
        Path("refused-parent.txt").write_text(str(exc))
    raise SystemExit(3)
"""


def test_a_program_cannot_end_its_own_step_stopped_nor_invent_a_parent(d: Daemon) -> None:
    """A step ends 'stopped' (safe to enter again) only where a step inside it stopped
    the run or failed: a program cannot so clear its own half-done unsafe step."""
    program(d, CLAIMS, policy=POLICY)
    d.ctl("activate", "agent", check=True)
    assert settled(d) == "blocked"
    assert "cannot end 'stopped'" in (d.root / "refused-stopped.txt").read_text()
    assert "not a step under way" in (d.root / "refused-parent.txt").read_text()
    assert "charge_card" in d.json("show", "agent")["reason"]
    assert lines(d, "charge") == 1
    assert d.json("log", "agent", "--type", "tool.finished") == []
