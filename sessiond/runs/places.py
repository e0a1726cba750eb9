"""Steps at their places (log/places.py), the daemon's side: nested steps and
divergences (docs/design.md section 8)."""

from __future__ import annotations

from typing import cast

from sessiond.errors import InvalidInput, Refused
from sessiond.log.event_data import (
    GateCheck,
    GateEvaluated,
    ObservationProjected,
    StepDivergence,
    StepRef,
    ToolFinished,
)
from sessiond.log.event_records import DivergenceJson
from sessiond.log.places import Asked
from sessiond.log.records import StepRecord, TurnRecord
from sessiond.log.store.base import Draft
from sessiond.runs.tokens import RunGrant
from sessiond.runs.workspace import workspace_hasher
from sessiond.table.gate import describe_divergence
from sessiond.table.sessions import Session


def parent_slot(turn: TurnRecord, grant: RunGrant, call: str | None) -> str | None:
    """The slot of the step a nested step is taken in (``call``: its call id), which
    must be under way in this run; None for a step at the top level."""
    if call is None:
        return None
    slot = turn["calls"].get(call)
    step = turn["steps"].get(slot) if slot is not None else None
    if step is None or step["status"] != "started" or not call.startswith(f"{grant.run}."):
        raise InvalidInput(
            f"parent {call!r} is not a step under way in this run: a nested step is taken "
            "inside its parent's fn, while the parent runs"
        )
    grant.frames.add(call)
    return str(slot)


def divergence(asked: Asked, recorded: StepRecord) -> tuple[GateEvaluated, str]:
    """The gate's verdict on a step that is not the one recorded: both steps, and the
    reason a person reads."""
    slot = asked.slot
    found = StepDivergence(
        ordinal=asked.ordinal,
        key=asked.key,
        recorded=StepRef(
            kind=recorded["kind"],
            name=recorded["name"],
            digest=recorded.get("digest"),
            slot=recorded.get("slot"),
        ),
        asked=StepRef(kind=asked.kind, name=asked.name, digest=asked.digest, slot=slot),
    )
    reason = describe_divergence(cast(DivergenceJson, found.model_dump(mode="json")))
    gate = GateEvaluated(
        ok=False,
        checks=(GateCheck(name="steps match", ok=False, detail=reason),),
        options=("accept", "discard"),
        outcome="blocked",
        divergence=found,
    )
    return gate, reason


def stopped(
    s: Session, grant: RunGrant, call: str, step: StepRecord, turn: TurnRecord
) -> list[Draft]:
    """A step inside this one stopped the run (an approval, a stop, a divergence) or
    failed (the gate judges that one on its own): nothing of this step's own failed.
    It is recorded cut off and safe to enter again, so a later run takes it anew and
    replays the steps inside it that finished (a model step is left waiting: it is
    asked again). Only for a step that took steps in this run, while the run is
    being stopped or one of them failed: a program cannot clear its own half-done
    step that way."""
    inside = f"{step['slot']}>"
    failed = any(
        st["status"] == "error"
        and st["slot"].startswith(inside)
        and st["call"].startswith(f"{grant.run}.")
        for st in turn["steps"].values()
    )
    stopping = s.run is not None and s.run.stop_requested is not None
    if call not in grant.frames or not (stopping or failed):
        raise Refused(
            f"step call {call!r} cannot end 'stopped': that is for a step a step inside "
            "which stopped the run or failed"
        )
    if step["kind"] == "model":
        return []
    hasher = workspace_hasher(s.spec)
    tool = step["name"]
    text = f"{tool} stopped at a step inside it; a later run enters it again"
    return [
        Draft(
            ToolFinished(
                call=call,
                tool=tool,
                status="interrupted",
                error_class="lifecycle",
                hashes={w: hasher(w) for w in step.get("writes") or []},
            ),
            correlation=call,
        ),
        Draft(ObservationProjected(call=call, tool=tool, text=text), correlation=call),
    ]
