"""What `show`, `gate` and `replay --view` print: projections of a session."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from sessiond.config import ProfileConfig
from sessiond.describe import describe
from sessiond.errors import InvalidInput
from sessiond.log.pace import batches, collector_paused, encode_paced
from sessiond.log.projections import PAGE_DEFAULT, messages_page, trace
from sessiond.log.replay import replay
from sessiond.log.state import State
from sessiond.log.store.base import ArtifactStore, Record
from sessiond.replies import CauseView, GateCheck, GateReport, SessionDetail, SpecFacts, TurnView
from sessiond.table.gate import GateVerdict, evaluate
from sessiond.table.recovery import Cause, answers_of, cause, options_of
from sessiond.table.sessions import Session, last_active, next_wake
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
        "gc.collected",
        "migration.started",
        "migration.aborted",
        "migration.arriving",
        "migration.finished",
        "migration.discarded",
    }
)


def _turn(s: State) -> TurnView | None:
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


def detail(session: Session) -> SessionDetail:
    """Everything `sessionctl show` prints about one session."""
    spec = session.spec
    base: SpecFacts = {
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
    # Written out, key by key, not unpacked: the answer's keys keep their order, and
    # mypy sees each one.
    if session.journal_or_none is None:
        return {
            "name": base["name"],
            "goal": base["goal"],
            "description": base["description"],
            "agent": base["agent"],
            "priority": base["priority"],
            "labels": base["labels"],
            "program": base["program"],
            "kind": base["kind"],
            "triggers": base["triggers"],
            "next_wake": base["next_wake"],
            "pid": base["pid"],
            "state": "blocked",
            "reason": session.broken,
            "seq": None,
        }
    s = session.journal.state
    return {
        "name": base["name"],
        "goal": base["goal"] or s.goal,
        "description": base["description"],
        "agent": base["agent"] or s.agent,
        "priority": base["priority"],
        "labels": base["labels"],
        "program": base["program"],
        "kind": base["kind"],
        "triggers": base["triggers"],
        "next_wake": base["next_wake"],
        "pid": base["pid"],
        "state": session.state,
        "reason": session.held or s.reason,
        "held": session.held is not None,  # blocked in memory, not yet recorded (full disk)
        "outcome": s.outcome,
        "until": s.until,
        "seq": s.seq,
        "created_at": s.created_at,
        "last_active": last_active(s),
        "runs": s.runs,
        "turns": s.turn_number,  # turns begun (docs/design.md section 8), the open one included
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
            "cost_usd": round(s.cost_usd, 6),  # what the replies were reported to cost
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


def gate_verdict(
    session: Session,
    now: str,
    has_artifact: Any = None,
    *,
    artifacts: ArtifactStore | None = None,
    profiles: dict[str, ProfileConfig] | None = None,
) -> GateVerdict:
    """The resume gate evaluated now on a session that has its log; records nothing.
    The log is checked by its writer (``verify``), the artifacts continuing needs by
    ``artifacts.verify_many`` (``has_artifact``, the older form: only whether they
    are there)."""
    from sessiond.runs.workspace import workspace_hasher

    state = session.journal.state
    damaged = artifacts.verify_many(state.live_artifacts()) if artifacts is not None else None
    spec = session.spec
    if spec is not None and profiles is not None:  # the budget under the runner profile
        spec = under_profile(spec, state.profile, profiles)
    return evaluate(
        state,
        spec,
        now=now,
        hash_file=workspace_hasher(spec),
        has_artifact=has_artifact,
        log_error=session.journal.log.verify(),
        check_artifact=damaged.get if damaged is not None else None,
    )


def causes_of(session: Session, verdict: GateVerdict | None) -> tuple[Cause, ...]:
    """Why the session may not go on now, each with the answers that change it: the
    gate's causes, or what holds it outside the gate (no log, a hand-over, a block
    the disk did not take). A session that is not blocked has none to resolve."""
    if session.journal_or_none is None:
        return (cause("log", session.broken or "its log cannot be read"),)
    if session.held is not None:
        return (cause("held", session.held),)
    if session.state == "arriving":
        return (cause("arriving", "it is arriving from another daemon (a hand-over)"),)
    return verdict.causes if verdict is not None else ()


def gate_report(
    session: Session,
    now: str,
    has_artifact: Any = None,
    *,
    artifacts: ArtifactStore | None = None,
    profiles: dict[str, ProfileConfig] | None = None,
) -> GateReport:
    """The resume gate evaluated now, as a dry run: each check, the outcome, the
    recovery options (exactly those that would change something: table.recovery)
    and why. Records nothing."""
    if session.journal_or_none is None:
        check: GateCheck = {"name": "log intact", "ok": False, "detail": session.broken or ""}
        broken = [_cause(c) for c in causes_of(session, None)]
        return {"session": session.name, "ok": False, "outcome": "blocked", "checks": [check],
                "options": [], "answers": [], "causes": broken, "dry_run": True}  # fmt: skip
    verdict = gate_verdict(session, now, has_artifact, artifacts=artifacts, profiles=profiles)
    causes = causes_of(session, verdict)
    held = session.held is not None or session.state == "arriving"
    return {
        "session": session.name,
        "ok": verdict.ok and not held,
        "outcome": "blocked" if held else verdict.outcome,
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in verdict.checks],
        "options": list(options_of(causes)),
        "answers": list(answers_of(causes)),
        "causes": [_cause(c) for c in causes],
        "actions": verdict.actions,
        "dry_run": True,
    }


def _cause(c: Cause) -> CauseView:
    return {"kind": c.kind, "detail": c.detail, "options": list(c.options),
            "answers": list(c.answers), "todo": c.todo}  # fmt: skip


async def replay_view(
    name: str,
    read: Callable[[], Iterable[Record]],
    view: str,
    *,
    live: State | None = None,
    cursor: int | None = None,
    limit: int | None = None,
) -> Any:
    """Rebuild from events and show one view; runs nothing. ``read`` gives the
    records (up to where the view stands); they are read, folded and described a
    batch at a time, so the loop serves others meanwhile. The messages view is one
    page (``cursor``, ``limit``); ``live`` is the fold of the records where they end,
    when the caller has it (the session's own state), else they are folded first."""
    if view not in VIEWS:
        raise InvalidInput(f"no view {view!r}; the views are {', '.join(VIEWS)}")
    if view != "messages" and (cursor is not None or limit is not None):
        raise InvalidInput("cursor and limit page the messages view only; drop them")
    if view in ("trace", "audit"):
        lines: list[str] = []
        async for batch in batches(read()):
            lines += trace(
                [r for r in batch if r["type"] in AUDIT_TYPES] if view == "audit" else batch
            )
        return lines
    if live is not None:
        return await _view(live, read, view, cursor, limit, rebuilt=False)
    with collector_paused():  # a long log's fold: its objects are freed by reference counts
        state = State(session=name)
        async for batch in batches(read()):
            replay(batch, state)
        return await _view(state, read, view, cursor, limit, rebuilt=True)


async def _view(
    state: State,
    read: Callable[[], Iterable[Record]],
    view: str,
    cursor: int | None,
    limit: int | None,
    *,
    rebuilt: bool,
) -> Any:
    if view == "messages":
        page, next_cursor = await messages_page(
            read(), state, cursor=cursor, limit=limit or PAGE_DEFAULT
        )
        return {"messages": page, "next_cursor": next_cursor, "upto": state.seq}
    # The state's JSON as the answer's result, encoded once: decoding it back to
    # dicts first (three times the encoding's cost) held the loop for tens of ms.
    # A state rebuilt here is held by nothing else, so it is encoded a slice at a
    # time; the session's live state may change at the next await, so it is
    # encoded whole (it is small: DESIGN's bounded state, a few KB).
    if rebuilt:
        return orjson.Fragment(await encode_paced(state))
    return orjson.Fragment(orjson.dumps(state))


__all__ = ["VIEWS", "describe", "detail", "gate_report", "replay_view"]
