"""A step's identity at its place in the turn, in process (moved from
tests/e2e/test_step_identity.py; what needs a kill -9, and the asyncio program,
stay there). Each program is the same Python source, run from its run's folder
by the real SDK in a thread (``FakeRun.source``): its work is counted in a
ledger in its workspace (``<name>.count``). A later run of the turn that asks,
at a recorded place, for a step that differs in kind, name, args digest or key
is a divergence: the daemon answers before the work runs, and the session
blocks for a person. Nested steps have their places inside their parent's."""

from __future__ import annotations

from typing import Any

from sessiond.codec import EventRecord
from tests.e2e.test_steps_attack import PRELUDE
from tests.inproc.fakes import FakeRun
from tests.inproc.harness import Harness

POLICY = 'allow = ["charge_card", "wire_transfer", "outer", "inner*"]\nask = ["edit_file"]'
REST = ("blocked", "terminated", "suspended")


async def program(h: Harness, body: str, *, policy: str = POLICY, run: str = "") -> None:
    """Session ``agent`` whose sdk program is PRELUDE + ``body``."""

    @h.program("agent")
    async def agent(run: FakeRun) -> int:
        return await run.source(PRELUDE, body)

    spec = (
        'name = "agent"\n[run]\nkind = "sdk"\nexec = ["true", "agent"]\ncwd = "."\n'
        f"{run}\n[policy]\n{policy}\n"
    )
    await h.create(spec, "agent")


def lines(h: Harness, name: str) -> int:
    path = h.root / f"{name}.count"
    return len(path.read_text().splitlines()) if path.exists() else 0


def to(state: str) -> Any:
    return lambda r: r["data"]["to"] == state


async def seq(h: Harness) -> int:
    return int((await h.call("show", name="agent"))["seq"])


async def settled(h: Harness) -> str:
    """Once the session waits for a person or is done, and its run has ended: that
    state (sleeping between retries is not rest)."""
    await h.settle(lambda: h.session("agent").state in REST)
    return h.session("agent").state


async def blocked_after(h: Harness, since: int) -> EventRecord:
    return await h.event("agent", "lifecycle.changed", to("blocked"), after=since - 1)


async def divergences(h: Harness) -> list[dict[str, Any]]:
    return [
        e["data"]["divergence"]
        for e in await h.log("agent", types=["gate.evaluated"])
        if e["data"].get("divergence")
    ]


KEY_FROM_FILE = """
key = Path("key.txt").read_text().strip() or None
with connect() as run:
    run.step("charge_card", lambda: count("charge"), args={"cents": 500}, key=key)
    if Path("hold-after-charge").exists() and not Path("released").exists():
        hold("held")
    run.step("edit_file", lambda: count("edits"), side_effect="workspace-write")
    run.complete()
"""

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


async def test_a_changed_key_at_a_recorded_place_is_a_divergence_not_a_second_charge(
    h: Harness,
) -> None:
    """Old code: the key *was* the place, so a new key was a new place: the card was
    charged again, with no divergence, and the session completed."""
    (h.root / "key.txt").write_text("order-1\n")
    await program(h, KEY_FROM_FILE)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))  # edit_file asks
    await h.idle()
    assert lines(h, "charge") == 1
    (h.root / "key.txt").write_text("order-2\n")
    since = await seq(h) + 1
    await h.call("approve", name="agent")
    blocked = await blocked_after(h, since)
    assert "order-1" in blocked["data"]["reason"]
    assert "order-2" in blocked["data"]["reason"]
    assert await settled(h) == "blocked"
    assert (lines(h, "charge"), lines(h, "edits")) == (1, 0)
    [div] = await divergences(h)
    assert (div["recorded"]["name"], div["asked"]["name"]) == ("charge_card", "charge_card")
    # the person's choice: end the turn; nothing ran twice
    await h.call("resolve", name="agent", option="discard")
    await h.idle()
    assert lines(h, "charge") == 1


async def test_an_unkeyed_step_that_becomes_keyed_diverges_before_it_runs(h: Harness) -> None:
    """Old code: the keyed step took a slot of its own and ran again, then the next
    step diverged."""
    (h.root / "key.txt").write_text("\n")  # no key in the first run
    await program(h, KEY_FROM_FILE)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    (h.root / "key.txt").write_text("order-1\n")
    since = await seq(h) + 1
    await h.call("approve", name="agent")
    blocked = await blocked_after(h, since)
    assert "charge_card" in blocked["data"]["reason"]
    assert await settled(h) == "blocked"
    assert (lines(h, "charge"), lines(h, "edits")) == (1, 0)
    [div] = await divergences(h)
    assert (div["asked"]["name"], div["key"]) == ("charge_card", "order-1")


async def test_a_keyed_step_that_loses_its_key_diverges_before_it_runs(h: Harness) -> None:
    (h.root / "key.txt").write_text("order-1\n")
    await program(h, KEY_FROM_FILE)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    (h.root / "key.txt").write_text("\n")
    since = await seq(h) + 1
    await h.call("approve", name="agent")
    await blocked_after(h, since)
    assert await settled(h) == "blocked"
    assert (lines(h, "charge"), lines(h, "edits")) == (1, 0)
    [div] = await divergences(h)
    assert div["asked"]["name"] == "charge_card"
    assert div["key"] is None


async def test_two_keyed_steps_told_apart_only_by_their_keys_are_refused_at_the_first_run(
    h: Harness,
) -> None:
    """Two keyed steps at one place with the same kind, name and args could not be
    told from a key that changed: the second is refused before it runs, by name."""
    await program(h, TWO_KEYS_SAME_STEP)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert lines(h, "charge") == 1
    refused = (h.root / "refused.txt").read_text()
    assert "charge_card" in refused, refused
    assert "args" in refused, refused


async def test_nested_steps_replay_with_no_false_divergence(h: Harness) -> None:
    """Old code: the inner steps took the ordinals after their parent's, so the next
    run (which replays the parent without calling its fn) asked for edit_file where
    inner_a was recorded: a false divergence on every continuation."""
    await program(h, NESTED)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    await h.call("approve", name="agent")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert await divergences(h) == []
    assert [lines(h, n) for n in ("outer", "inner_a", "inner_b", "edits")] == [1, 1, 1, 1]
    assert (h.root / "both.txt").read_text() == "AB"
    intents = await h.log("agent", types=["tool.intent"])
    parents = {e["data"]["tool"]: e["data"].get("parent") for e in intents}
    assert parents == {"outer": None, "inner_a": "1", "inner_b": "1", "edit_file": None}


async def test_an_approval_inside_a_nested_step_runs_each_inner_step_once(h: Harness) -> None:
    """A step inside a parent asks a person: the run ends inside the parent. The next
    run enters the parent again (its own code is not a step), replays the inner step
    that finished and runs the approved one once. Old code: the parent, an unsafe
    step, was recorded failed, and the turn blocked for good."""
    (h.root / "plan.txt").write_text("edit_file\n")
    await program(h, NESTED_ASKS)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    await h.call("approve", name="agent")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert await divergences(h) == []
    assert [lines(h, n) for n in ("inner_pay", "edit_file", "after")] == [1, 1, 1]
    assert lines(h, "outer") == 2  # the parent's own code, not a step


async def test_a_divergence_inside_a_nested_step_is_found_before_the_work(h: Harness) -> None:
    (h.root / "plan.txt").write_text("edit_file\n")
    await program(h, NESTED_ASKS)
    await h.call("activate", name="agent")
    await h.event("agent", "lifecycle.changed", to("blocked"))
    await h.idle()
    (h.root / "plan.txt").write_text("inner_wipe\n")
    since = await seq(h) + 1
    await h.call("approve", name="agent")
    blocked = await blocked_after(h, since)
    assert "inner_wipe" in blocked["data"]["reason"]
    assert await settled(h) == "blocked"
    assert [lines(h, n) for n in ("inner_pay", "edit_file", "inner_wipe", "after")] == [1, 0, 0, 0]
    since = await seq(h) + 1
    await h.call("resolve", name="agent", option="accept")  # the new path inside the parent
    await h.event("agent", "lifecycle.changed", to("terminated"), after=since - 1)
    await h.idle()
    assert [lines(h, n) for n in ("inner_pay", "edit_file", "inner_wipe", "after")] == [1, 0, 1, 1]


async def test_a_failed_nested_step_is_judged_alone_and_rerun_once(h: Harness) -> None:
    """The step inside fails: it alone blocks (its parent ended 'stopped', not
    failed), one --rerun runs it once more, and the step before it is replayed."""
    await program(h, NESTED_FAILS)
    await h.call("activate", name="agent")
    assert await settled(h) == "blocked"
    reason = (await h.call("show", name="agent"))["reason"]
    assert "inner_ship" in reason
    assert "outer" not in reason.replace("inner_ship", "")
    (h.root / "fixed").write_text("")
    await h.call("resolve", name="agent", option="rerun")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert [lines(h, n) for n in ("outer", "inner_pay", "ship")] == [2, 1, 2]
    assert await divergences(h) == []


async def test_rerun_of_a_failed_step_is_refused_to_another_step_at_its_place(h: Harness) -> None:
    """Old code: --rerun marked charge_card to run again, and the next run's
    wire_transfer at that place ran in its stead, with no divergence."""
    (h.root / "which.txt").write_text("charge_card\n")
    await program(h, FAILS_ONCE)
    await h.call("activate", name="agent")
    assert await settled(h) == "blocked"  # a failed unsafe step: a person decides
    assert lines(h, "charge_card") == 1
    (h.root / "which.txt").write_text("wire_transfer\n")
    since = await seq(h) + 1
    await h.call("resolve", name="agent", option="rerun")
    blocked = await blocked_after(h, since)
    assert "wire_transfer" in blocked["data"]["reason"]
    assert "charge_card" in blocked["data"]["reason"]
    assert await settled(h) == "blocked"
    assert (lines(h, "charge_card"), lines(h, "wire_transfer")) == (1, 0)


async def test_rerun_of_a_failed_step_runs_that_step_once_more(h: Harness) -> None:
    (h.root / "which.txt").write_text("charge_card\n")
    await program(h, FAILS_ONCE)
    await h.call("activate", name="agent")
    assert await settled(h) == "blocked"
    (h.root / "fixed").write_text("")
    await h.call("resolve", name="agent", option="rerun")
    await h.event("agent", "lifecycle.changed", to("terminated"))
    await h.idle()
    assert lines(h, "charge_card") == 2
    assert await divergences(h) == []


async def test_a_program_cannot_end_its_own_step_stopped_nor_invent_a_parent(h: Harness) -> None:
    """A step ends 'stopped' (safe to enter again) only where a step inside it stopped
    the run or failed: a program cannot so clear its own half-done unsafe step."""
    await program(h, CLAIMS)
    await h.call("activate", name="agent")
    assert await settled(h) == "blocked"
    assert "cannot end 'stopped'" in (h.root / "refused-stopped.txt").read_text()
    assert "not a step under way" in (h.root / "refused-parent.txt").read_text()
    assert "charge_card" in (await h.call("show", name="agent"))["reason"]
    assert lines(h, "charge") == 1
    assert await h.log("agent", types=["tool.finished"]) == []
