"""A step's place and identity in its turn (log/places.py), and the fold's use of them."""

from __future__ import annotations

from typing import Any, cast

from sessiond.log import turns
from sessiond.log.event_records import DivergenceJson, RecoveryResolvedData, ToolIntentData
from sessiond.log.places import Asked, after, asked_place, judge, place_of, slot_of
from sessiond.log.records import StepRecord
from sessiond.log.state import State


def step(
    ordinal: int,
    name: str,
    *,
    key: str | None = None,
    digest: str | None = "d",
    call: str = "r1.1",
    status: str = "ok",
    kind: str = "tool",
    parent: str | None = None,
    steps: dict[str, StepRecord] | None = None,
) -> StepRecord:
    slot = slot_of(ordinal, key, parent)
    st: dict[str, Any] = {
        "kind": kind,
        "slot": slot,
        "ordinal": ordinal,
        "key": key,
        "name": name,
        "digest": digest,
        "call": call,
        "status": status,
    }
    if parent:
        st["parent"] = parent
        st["place"] = [list(p) for p in asked_place(steps or {}, ordinal, key, parent)]
    return cast(StepRecord, st)


def table(*steps: StepRecord) -> dict[str, StepRecord]:
    return {st["slot"]: st for st in steps}


def ask(name: str, ordinal: int, key: str | None = None, **kw: Any) -> Asked:
    return Asked(
        kind=kw.get("kind", "tool"),
        name=name,
        digest=kw.get("digest", "d"),
        ordinal=ordinal,
        key=key,
        parent=kw.get("parent"),
        strict=kw.get("strict", False),
    )


def test_slots_at_the_top_level_are_what_they_always_were() -> None:
    assert slot_of(3, None) == "3"
    assert slot_of(3, "fetch-a") == "k:fetch-a"
    assert slot_of(2, "x", "1") == "1>k:x"
    assert slot_of(2, None, "k:a/b") == "k:a/b>2"  # a key may hold '/', never '>'


def test_places_order_keyed_groups_unkeyed_steps_and_nested_ones() -> None:
    group1 = ((1, "k:a"),)
    one = ((2, "1"),)
    inside_one = ((2, "1"), (2, "1"))
    two = ((4, "2"),)
    assert after(one, group1)
    assert not after(group1, one)
    assert after(inside_one, one)  # a child comes after its parent started
    assert not after(one, inside_one)
    assert after(two, inside_one)
    assert not after(inside_one, two)
    assert not after(((1, "k:b"),), group1)  # keyed steps of one group: no order
    assert not after(group1, ((1, "k:b"),))


def test_a_step_at_its_recorded_place_must_be_the_same_in_all_four() -> None:
    steps = table(step(1, "charge_card"), step(1, "ship", key="k"))
    assert judge(steps, ask("charge_card", 1), "r2").verdict == "same"
    assert judge(steps, ask("wire_transfer", 1), "r2").verdict == "diverged"
    assert judge(steps, ask("charge_card", 1, digest="other"), "r2").verdict == "diverged"
    assert judge(steps, ask("charge_card", 1, kind="model"), "r2").verdict == "diverged"
    assert judge(steps, ask("ship", 1, "k"), "r2").verdict == "same"


def test_a_model_steps_request_is_part_of_its_identity_only_when_strict() -> None:
    steps = table(step(1, "m-1", kind="model"))
    assert judge(steps, ask("m-1", 1, kind="model", digest="x"), "r2").verdict == "same"
    strict = ask("m-1", 1, kind="model", digest="x", strict=True)
    assert judge(steps, strict, "r2").verdict == "diverged"


def test_whatever_the_recorded_steps_status_another_step_may_not_take_its_place() -> None:
    for status in ("rerun", "error", "interrupted", "approval", "approved", "denied"):
        steps = table(step(1, "charge_card", status=status))
        judged = judge(steps, ask("wire_transfer", 1), "r2")
        assert judged.verdict == "diverged", status
        assert judged.recorded is not None
        assert judged.recorded["name"] == "charge_card"
    # a step dropped before it started ran nothing: the place is free
    steps = table(step(1, "charge_card", status="dropped"))
    assert judge(steps, ask("wire_transfer", 1), "r2").verdict == "new"


def test_a_changed_key_an_added_key_and_a_dropped_key_diverge() -> None:
    keyed = table(step(1, "charge_card", key="order-1"))
    judged = judge(keyed, ask("charge_card", 1, "order-2"), "r2")
    assert judged.verdict == "diverged"
    assert judged.recorded is not None
    assert judged.recorded["key"] == "order-1"
    assert judge(keyed, ask("charge_card", 1), "r2").verdict == "diverged"
    unkeyed = table(step(1, "charge_card"))
    assert judge(unkeyed, ask("charge_card", 1, "order-1"), "r2").verdict == "diverged"


def test_twins_told_apart_only_by_key_are_refused_in_the_run_that_takes_them() -> None:
    steps = table(step(1, "charge_card", key="a", call="r1.1"))
    judged = judge(steps, ask("charge_card", 1, "b"), "r1")
    assert judged.verdict == "refused"
    assert "args" in judged.why
    # with different args they are two steps
    assert judge(steps, ask("charge_card", 1, "b", digest="e"), "r1").verdict == "new"


def test_a_new_keyed_step_in_a_group_the_record_went_past_diverges() -> None:
    steps = table(step(1, "fetch", key="a"), step(1, "pay", call="r1.2"))
    judged = judge(steps, ask("refund", 1, "b", digest="z"), "r2")
    assert judged.verdict == "diverged"
    assert judged.recorded is not None
    assert judged.recorded["name"] == "pay"
    # this run's own steps are not the record (its threads and tasks race)
    assert judge(steps, ask("refund", 1, "b", digest="z"), "r1").verdict == "new"
    # in a group the record did not go past, a new key is a thread the earlier run
    # did not get to
    assert judge(table(step(1, "fetch", key="a")), ask("f", 1, "b"), "r2").verdict == "new"


def test_an_unkeyed_step_past_the_record_is_new() -> None:
    steps = table(step(1, "look"), step(2, "pay", call="r1.2"))
    assert judge(steps, ask("ship", 3), "r2").verdict == "new"


def test_nested_steps_are_judged_at_their_place_inside_the_parent() -> None:
    outer = step(1, "outer", status="started", call="r2.1")
    steps = table(outer)
    inner = step(1, "inner_a", parent="1", steps=steps, call="r1.2")
    steps = table(outer, inner)
    assert place_of(inner) == ((2, "1"), (2, "1"))
    assert judge(steps, ask("inner_a", 1, parent="1"), "r2").verdict == "same"
    assert judge(steps, ask("inner_b", 1, parent="1"), "r2").verdict == "diverged"
    assert judge(steps, ask("inner_b", 2, parent="1"), "r2").verdict == "new"
    # the next step at the top level is not where the inner one was recorded
    assert judge(steps, ask("edit_file", 2), "r2").verdict == "new"


def _intent(fields: dict[str, Any]) -> ToolIntentData:
    """A tool.intent payload with what the fold reads and these tests leave out."""
    return cast(ToolIntentData, {"risk": {}, "writes": [], "args_sha256": "d", **fields})


def _accept(fields: dict[str, Any]) -> RecoveryResolvedData:
    """A recovery.resolved payload, as much of it as the turn's fold reads."""
    return cast(RecoveryResolvedData, fields)


def _state() -> State:
    s = State(session="agent")
    turns.begin_run(s, 1)
    return s


def test_the_fold_keeps_a_nested_steps_parent_and_place_and_none_for_others() -> None:
    s = _state()
    turns.tool_intent(s, _intent({"call": "r1.1", "tool": "outer", "ordinal": 1}))
    turns.tool_intent(s, _intent({"call": "r1.2", "tool": "inner", "ordinal": 1, "parent": "1"}))
    assert s.turn is not None
    top, inner = s.turn["steps"]["1"], s.turn["steps"]["1>1"]
    assert "parent" not in top
    assert "place" not in top  # the state of logs without nesting stays as it was
    assert inner["parent"] == "1"
    assert inner["place"] == [[2, "1"], [2, "1"]]


def test_accepting_a_divergence_inside_a_parent_drops_only_what_comes_after_it() -> None:
    s = _state()
    for call, tool, ordinal, key, parent in (
        ("r1.1", "pay", 1, "k", None),
        ("r1.2", "outer", 1, None, None),
        ("r1.3", "inner_a", 1, None, "1"),
        ("r1.4", "inner_b", 2, None, "1"),
        ("r1.5", "after", 2, None, None),
    ):
        turns.tool_intent(
            s,
            _intent(
                {"call": call, "tool": tool, "ordinal": ordinal, "key": key}
                | ({"parent": parent} if parent else {})
            ),
        )
    assert s.turn is not None
    s.turn["divergence"] = cast(
        DivergenceJson, {"ordinal": 2, "key": None, "asked": {"slot": "1>2"}}
    )
    turns.resolved(s, _accept({"option": "accept", "from_ordinal": 2}))
    assert sorted(s.turn["steps"]) == ["1", "1>1", "k:k"]


def test_accepting_an_old_divergence_keeps_the_keyed_steps_before_it() -> None:
    """A divergence recorded before nesting (no parent, no slot) is read as before."""
    s = _state()
    for call, ordinal, key in (("r1.1", 1, "a"), ("r1.2", 1, None), ("r1.3", 2, "b")):
        turns.tool_intent(s, _intent({"call": call, "tool": "t", "ordinal": ordinal, "key": key}))
    assert s.turn is not None
    s.turn["divergence"] = cast(DivergenceJson, {"ordinal": 1, "key": None})
    turns.resolved(s, _accept({"option": "accept", "from_ordinal": 1}))
    assert sorted(s.turn["steps"]) == ["k:a"]


def test_accepting_a_changed_key_drops_the_step_under_the_old_key() -> None:
    """Else the old key's step would be the new one's twin again, for ever."""
    s = _state()
    turns.tool_intent(s, _intent({"call": "r1.1", "tool": "t", "ordinal": 1, "key": "a"}))
    assert s.turn is not None
    s.turn["divergence"] = cast(
        DivergenceJson,
        {"ordinal": 1, "key": "b", "asked": {"slot": "k:b"}, "recorded": {"slot": "k:a"}},
    )
    turns.resolved(s, _accept({"option": "accept", "from_ordinal": 1}))
    assert s.turn["steps"] == {}


def test_keys_that_are_recorded_ids_tell_twin_steps_apart() -> None:
    """An agent's tool calls are keyed by the ids in its recorded model responses:
    the same tool with the same args twice is two calls, in one run or two."""
    steps = table(step(1, "Read", key="cc.a", call="r1.1"))
    by_id = Asked("tool", "Read", "d", 1, "cc.b", None, key_is_id=True)
    assert judge(steps, by_id, "r1").verdict == "new"
    assert judge(steps, by_id, "r2").verdict == "new"
