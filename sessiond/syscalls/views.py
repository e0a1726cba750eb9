"""What `show`, `gate` and `replay --view` print: projections of a session."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from sessiond.config import ProfileConfig
from sessiond.describe import describe
from sessiond.log.pace import BATCH, Pacer, batches, collector_paused, encode_paced, release
from sessiond.log.projections import messages, trace
from sessiond.log.replay import replay
from sessiond.log.state import State
from sessiond.log.store.base import ArtifactStore
from sessiond.table.sessions import Session, next_wake
from sessiond.table.spec import under_profile

VIEWS = ("state", "messages", "trace", "audit")

AUDIT_TYPES = frozenset(
    {
        "lifecycle.changed",
        "gate.evaluated",
        "recovery.resolved",
        "run.started",
        "run.finished",
        "model.requested",
        "model.responded",
        "tool.intent",
        "policy.decided",
        "approval.requested",
        "approval.granted",
        "approval.denied",
        "tool.started",
        "tool.finished",
        "verification.finished",
        "budget.exhausted",
        "log.repaired",
        "session.migrated",
        "session.merged",
        "session.forked",
        "session.imported",
        "migration.started",
        "migration.aborted",
        "migration.arriving",
        "migration.finished",
        "migration.discarded",
    }
)


def _turn(s: State) -> dict[str, Any] | None:
    """The open turn for `show`: its number, its runs so far, its steps by status."""
    turn = s.turn
    if turn is None:
        return None
    statuses: dict[str, int] = {}
    for step in turn["steps"].values():
        statuses[step["status"]] = statuses.get(step["status"], 0) + 1
    return {
        "n": turn["n"],
        "runs": turn["runs"],
        "steps": statuses,
        "wakes": [w.get("trigger") for w in turn["wakes"]],
        "divergence": turn["divergence"],
    }


def detail(session: Session) -> dict[str, Any]:
    """Everything `sessionctl show` prints about one session."""
    spec = session.spec
    base: dict[str, Any] = {
        "name": session.name,
        "goal": spec.goal if spec else "",
        "description": spec.description if spec else "",
        "agent": spec.agent if spec else "",
        "priority": spec.priority if spec else 0,
        "labels": dict(spec.labels) if spec else {},
        "program": list(spec.run.exec) if spec and spec.run else None,
        "kind": spec.run.kind if spec and spec.run else None,
        "triggers": spec.trigger_summary() if spec else [],
        "next_wake": (session.wake_fn or next_wake)(session),
        "pid": session.run.pid if session.run else None,
    }
    if session.journal is None:
        return {**base, "state": "blocked", "reason": session.broken, "seq": None}
    s = session.journal.state
    return {
        **base,
        "goal": base["goal"] or s.goal,
        "agent": base["agent"] or s.agent,
        "state": session.state,
        "reason": session.held or s.reason,
        "held": session.held is not None,  # blocked in memory, not yet recorded (full disk)
        "outcome": s.outcome,
        "until": s.until,
        "seq": s.seq,
        "created_at": s.created_at,
        "last_active": s.last_active,
        "runs": s.runs,
        "turns": s.turn_number,  # turns begun (DESIGN.md section 8), the open one included
        "turn": _turn(s),
        "model_replies": s.model_replies,
        "profile": s.profile,
        "current_run": s.current_run,
        "last_run": s.last_run,
        "pending_wakes": len(s.pending_wakes),
        "last_wake": s.last_wake,
        "last_gate": s.last_gate,
        "pending_approvals": list(s.pending_approvals().values()),
        # answered and not yet used up, each with who answered (uid, user, channel)
        "answered_approvals": [
            a for a in s.approvals.values() if a.get("status") in ("granted", "denied")
        ],
        "last_recovery": s.last_recovery,
        "grants": list(spec.run.grants) if spec and spec.run else [],
        "tools_in_flight": list(s.in_flight().values()),
        "last_observation": s.last_observation,
        "budget_used": {
            "runs_today": s.runs_by_day.get((s.last_ts or "")[:10], 0),
            "seconds": s.seconds_used,
            "tokens": s.tokens_in + s.tokens_out,
            "tool_calls_this_run": s.tool_calls_this_run,
        },
        "budget_exhausted": s.budget_exhausted,
        "parent": s.parent,
        "fork_seq": s.fork_seq,
        "children": list(s.children),
        "merged": list(s.merged),
        "imported_from": s.imported_from,
        "migrated_to": s.migrated_to,
        "handover": s.handover,  # the last hand-over to or from another daemon
        "mailbox": len(s.mailbox),
        "compactions": s.compactions,
        "repairs": len(s.repairs),
    }


def gate_report(
    session: Session,
    now: str,
    has_artifact: Any = None,
    *,
    artifacts: ArtifactStore | None = None,
    profiles: dict[str, ProfileConfig] | None = None,
) -> dict[str, Any]:
    """The resume gate evaluated now, as a dry run: each check, the outcome, the
    recovery options. Records nothing. The log is checked by its writer
    (``verify``), the artifacts continuing needs by ``artifacts.verify_many``
    (``has_artifact``, the older form: only whether they are there)."""
    from sessiond.runs.workspace import workspace_hasher
    from sessiond.table.gate import evaluate

    if session.journal is None:
        check = {"name": "log intact", "ok": False, "detail": session.broken or ""}
        return {"session": session.name, "ok": False, "outcome": "blocked", "checks": [check],
                "options": [], "dry_run": True}  # fmt: skip
    state = session.journal.state
    damaged = artifacts.verify_many(state.live_artifacts()) if artifacts is not None else None
    spec = session.spec
    if spec is not None and profiles is not None:  # the budget under the runner profile
        spec = under_profile(spec, state.profile, profiles)
    verdict = evaluate(
        state,
        spec,
        now=now,
        hash_file=workspace_hasher(spec),
        has_artifact=has_artifact,
        log_error=session.journal.log.verify(),
        check_artifact=damaged.get if damaged is not None else None,
    )
    return {
        "session": session.name,
        "ok": verdict.ok,
        "outcome": verdict.outcome,
        "checks": [c.as_dict() for c in verdict.checks],
        "options": list(verdict.options),
        "actions": verdict.actions,
        "dry_run": True,
    }


async def replay_view(name: str, records: Iterable[dict[str, Any]], view: str) -> Any:
    """Rebuild from events and show one view; runs nothing. The records are read,
    folded and described a batch at a time, so the loop serves others meanwhile."""
    if view not in VIEWS:
        from sessiond.errors import InvalidInput

        raise InvalidInput(f"no view {view!r}; the views are {', '.join(VIEWS)}")
    if view in ("trace", "audit"):
        lines: list[str] = []
        async for batch in batches(records):
            lines += trace(
                [r for r in batch if r["type"] in AUDIT_TYPES] if view == "audit" else batch
            )
        return lines
    with collector_paused():  # a state of this size is freed by reference counts
        return await _rebuilt_view(name, records, view)


async def _rebuilt_view(name: str, records: Iterable[dict[str, Any]], view: str) -> Any:
    state = State(session=name)
    async for batch in batches(records):
        replay(batch, state)
    if view == "messages":
        # The view item by item, a batch of the transcript at a time (a long
        # session's is tens of thousands of items).
        items = messages(State(session=name, goal=state.goal))
        transcript = state.transcript
        pacer = Pacer()
        for start in range(0, len(transcript), BATCH):
            part = State(session=name, transcript=transcript[start : start + BATCH])
            items += messages(part)
            await pacer.tick()
        await release(transcript, pacer)
        return items
    # The state's JSON as the answer's result, encoded once (decoding it back to
    # dicts first, three times the encoding's cost, held the loop for tens of ms),
    # a slice at a time; nothing else holds this state, so it cannot change.
    return orjson.Fragment(await encode_paced(state))


__all__ = ["VIEWS", "describe", "detail", "gate_report", "replay_view"]
