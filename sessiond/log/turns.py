"""Turns and their steps, as the fold keeps them (docs/design.md section 8).

A **turn** is the work one wake starts. It begins at the ``running`` that finds
no turn open and ends at the ``run.finished`` that says ``ends_turn`` (or at a
resolution that ends it). Every run in between continues it: the program runs
again from the top, and each **step** it asks for (a tool call or a model call,
in call order) is matched against the one recorded at the same slot. A step
finished ``ok`` is answered from the log; nothing runs twice.

The step table lives in ``State.turn["steps"]``, keyed by slot: the ordinal as
a string, or ``"k:" + key`` for a step that names its own key (steps started
from threads), after ``parent + ">"`` for a nested step (log/places.py).
``State.turn["calls"]`` maps a call id (a tool call's ``call``, a model step's
``request_id``) to its slot, so the events of a call find their step.
Everything here is plain data, like the rest of the state.

Statuses a step moves through::

    intent -> decided -> [approval -> approved] -> started -> ok | error | interrupted
           \\-> denied                                         (dropped: never started)

The fold functions here are called by :mod:`sessiond.log.replay`; they do not
read the clock and run nothing.
"""

from __future__ import annotations

from typing import Literal, cast

from sessiond.log.event_records import (
    DivergenceJson,
    ModelRequestedData,
    ModelRespondedData,
    ObservationProjectedData,
    RecoveryResolvedData,
    RunWake,
    ToolFinishedData,
    ToolIntentData,
    ToolStartedData,
)
from sessiond.log.places import after, asked_place, place_of, slot_of
from sessiond.log.records import StepRecord, StepStatus, TurnRecord
from sessiond.log.state import State

# Wakes that only continue the open turn: they are not work of their own, so a
# run that continues a turn takes them; other wakes wait for the next turn. An
# `activate` ("run now") continues an open turn rather than start another.
TURN_ONLY_TRIGGERS = frozenset({"approval", "resolve", "retry", "restart"})
CONTINUATION_TRIGGERS = TURN_ONLY_TRIGGERS | {"manual"}

# Steps that were asked for but never started: a later run asks again afresh.
NOT_STARTED = frozenset({"intent", "decided", "approval", "approved"})


def begin_run(s: State, seq: int) -> None:
    """A ``running`` transition: a new turn, or one more run of the open one."""
    turn = s.turn
    if turn is None:
        s.turn_number += 1
        s.turn = {
            "n": s.turn_number,
            "seq": seq,
            # the recorded wakes have their seq and time: what a run is told of them
            "wakes": cast(list[RunWake], list(s.pending_wakes)),
            "runs": 1,
            "steps": {},
            "calls": {},
            "divergence": None,
        }
        # The wakes recorded until now are this turn's work; it takes them here,
        # not at its run.started, so a run cut off in between (its program may
        # have run) leaves none of them pending to run again.
        s.pending_wakes = []
    else:
        turn["runs"] += 1
        # A continuation takes only what continues it (an approval, a retry...); a
        # message or a file change that came meanwhile waits for the next turn.
        s.pending_wakes = [w for w in s.pending_wakes if w["trigger"] not in CONTINUATION_TRIGGERS]
    _adopt_command(s)


def _adopt_command(s: State) -> None:
    """A command run is one tool call, started just before its ``running``: the
    turn's one step, kept so that a run of it that was stopped part way or failed is
    judged by its risk contract before the turn runs it again."""
    turn = s.turn
    assert turn is not None
    for call_id, call in s.calls.items():
        if call["tool"] == "command" and call["stage"] == "started":
            old = turn["steps"].get("command")
            if old is not None:
                turn["calls"].pop(old["call"], None)
            started = call.get("started")
            turn["steps"]["command"] = {
                "kind": "tool",
                "slot": "command",
                "ordinal": 0,
                "key": None,
                "name": "command",
                "digest": None,
                "call": call_id,
                "status": "started",
                "risk": call["risk"],
                "writes": call["writes"],
                "before": started.get("hashes", {}) if started else {},
            }
            turn["calls"][call_id] = "command"


def end_turn(s: State) -> None:
    s.turn = None
    # what only continued that turn (an approval, a retry) is not work of its own
    if s.pending_wakes:
        s.pending_wakes = [w for w in s.pending_wakes if w["trigger"] not in TURN_ONLY_TRIGGERS]


def _step(s: State, call: str) -> StepRecord | None:
    turn = s.turn
    if turn is None:
        return None
    slot = turn["calls"].get(call)
    return None if slot is None else turn["steps"].get(slot)


def tool_intent(s: State, d: ToolIntentData) -> None:
    turn = s.turn
    ordinal = d.get("ordinal")
    if turn is None or ordinal is None:
        return
    step = _new_step(
        turn,
        kind="tool",
        ordinal=ordinal,
        key=d.get("key"),
        name=d["tool"],
        digest=d.get("args_sha256"),
        call=d["call"],
        parent=d.get("parent"),
    )
    step["status"] = "intent"
    step["risk"] = d["risk"]
    step["writes"] = d["writes"]


def _new_step(
    turn: TurnRecord,
    *,
    kind: Literal["tool", "model"],
    ordinal: int,
    key: str | None,
    name: str,
    digest: str | None,
    call: str,
    parent: str | None = None,
) -> StepRecord:
    """A step asked for at its slot; one recorded there before (not replayed: it did
    not finish ok) gives way, its events stay in the log. A nested step keeps its
    parent's slot and its whole place (steps at the top level carry neither: their
    ordinal and key are their place, as in logs written before nesting)."""
    slot = slot_of(ordinal, key, parent)
    old = turn["steps"].get(slot)
    if old is not None:
        turn["calls"].pop(old["call"], None)
    step: StepRecord = {
        "kind": kind,
        "slot": slot,
        "ordinal": ordinal,
        "key": key,
        "name": name,
        "digest": digest,
        "call": call,
        "status": "started",
    }
    turn["steps"][slot] = step
    if parent:
        place = asked_place(turn["steps"], ordinal, key, parent)
        step["parent"] = parent
        step["place"] = [[position, segment] for position, segment in place]
    turn["calls"][call] = slot
    return step


def set_status(s: State, call: str, status: StepStatus, *, rule: str | None = None) -> None:
    step = _step(s, call)
    if step is not None:
        step["status"] = status
        if rule is not None:
            step["rule"] = rule


def tool_started(s: State, d: ToolStartedData) -> None:
    step = _step(s, d["call"])
    if step is not None:
        step["status"] = "started"
        step["before"] = d["hashes"]


def tool_finished(s: State, d: ToolFinishedData) -> None:
    step = _step(s, d["call"])
    if step is None:
        return
    step["status"] = d["status"]
    if d["status"] == "ok":
        step["result_kind"] = d.get("result_kind")
        step["result"] = d.get("result")
        step["result_ref"] = d.get("result_ref")
    else:
        step["error"] = d.get("error_class") or d["status"]


def observed(s: State, d: ObservationProjectedData) -> None:
    """An observation closes a call; one that discards a call never started drops its step."""
    step = _step(s, d["call"])
    if step is not None and d.get("source") == "discarded" and step["status"] in NOT_STARTED:
        step["status"] = "dropped"


def model_requested(s: State, d: ModelRequestedData) -> None:
    turn = s.turn
    ordinal = d.get("ordinal")
    if turn is None or ordinal is None or d.get("replayed"):
        return
    _new_step(
        turn,
        kind="model",
        ordinal=ordinal,
        key=d.get("key"),
        name=d["model"],
        digest=d.get("request_sha256"),
        call=d["request_id"],
        parent=d.get("parent"),
    )


def model_responded(s: State, d: ModelRespondedData) -> None:
    step = _step(s, d["request_id"])
    if step is None:
        return
    if d["status"] == "ok":
        step["status"] = "ok"
        step["result_kind"] = "json"
        step["result_ref"] = d.get("response")
        step["tokens"] = [d["tokens_in"], d["tokens_out"]]
    else:
        step["status"] = "error"
        step["error"] = d.get("error_class") or d["status"]


def diverged(s: State, divergence: DivergenceJson | None) -> None:
    if s.turn is not None and divergence is not None:
        s.turn["divergence"] = divergence


def resolved(s: State, d: RecoveryResolvedData) -> None:
    """A person's recovery choice, as it bears on the open turn."""
    turn = s.turn
    if turn is None:
        return
    if d.get("ends_turn"):
        end_turn(s)
        return
    at = turn["divergence"]
    turn["divergence"] = None
    start = d.get("from_ordinal")
    if start is not None:
        # the new path from here on: the steps recorded from the divergent place on
        # stay in the log but are no longer answered from it
        # (divergences recorded before nesting name no slots: a step at the top level)
        key = at.get("key") if at else None
        asked, recorded = (at.get("asked"), at.get("recorded")) if at else (None, None)
        slot = (asked.get("slot") if asked else None) or slot_of(start, key)
        parent = slot.rpartition(">")[0] or None  # a key holds no '>'
        here = asked_place(turn["steps"], start, key, parent)
        gone = {slot, recorded.get("slot") if recorded else None}
        for each, step in list(turn["steps"].items()):
            if each in gone or after(place_of(step), here):
                del turn["steps"][each]
                turn["calls"].pop(step["call"], None)
        return
    call = d.get("call")
    chosen = _step(s, call) if call else None
    if chosen is None or chosen["status"] not in ("error", "interrupted", "started"):
        return
    if d["option"] == "rerun":
        chosen["status"] = "rerun"  # a person chose to run it again
    elif d["option"] == "accept":
        # the world as it is stands for this step's work: it is done, with no result
        chosen["status"] = "ok"
        chosen["result_kind"] = "json"
        chosen["result"] = None
        chosen["result_ref"] = None


def bad_steps(s: State) -> list[StepRecord]:
    """Steps of the open turn that finished with an error and were not resolved: the
    gate judges them by their risk contract before a later run may reach them again.
    (A step closed as ``interrupted`` was already judged safe to run again.)"""
    if s.turn is None:
        return []
    steps = s.turn["steps"].values()
    # A command stopped part way (interrupt, shutdown, timeout) did not finish its work
    # either: it is judged like a failed step. (An sdk step is only ever closed as
    # ``interrupted`` by the gate itself, once judged safe to run again, or as a
    # parent a step inside which stopped the run: its own code runs again.)
    return [
        st
        for st in steps
        if st["status"] == "error" or (st["status"] == "interrupted" and st["slot"] == "command")
    ]
