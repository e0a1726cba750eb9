"""Replay: the pure fold of events into a :class:`~sessiond.log.state.State`.

Replay never runs a tool, a model or a command, and never reads the clock: the
state after an event depends on the events alone. It works on records (plain
dicts) because the hot path must be fast; records come from lines whose
checksum holds and were validated by their writer. Records from outside are
validated with :func:`sessiond.log.events.decode` before they reach a log.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Literal, cast

from sessiond.log import turns
from sessiond.log.event_records import (
    ApprovalDeniedData,
    ApprovalGrantedData,
    ApprovalRequestedData,
    ArtifactJson,
    BindingObservedData,
    BudgetExhaustedData,
    ContextCompactedData,
    EventRecord,
    GateEvaluatedData,
    JsonObject,
    LifecycleChangedData,
    LogRepairedData,
    MessageReceivedData,
    MigrationData,
    ModelRequestedData,
    ModelRespondedData,
    ObservationProjectedData,
    PolicyDecidedData,
    RecoveryResolvedData,
    RunFinishedData,
    RunStartedData,
    SessionCreatedData,
    SessionForkedData,
    SessionImportedData,
    SessionMergedData,
    SessionMigratedData,
    ToolFinishedData,
    ToolIntentData,
    ToolStartedData,
    VerificationFinishedData,
    VerificationStartedData,
    WakeRequestedData,
)
from sessiond.log.events import CURRENT_VERSION, upcast
from sessiond.log.fold import STEP, Handler, call_of, replay_rows
from sessiond.log.records import (
    ApprovalRecord,
    HandoverRecord,
    SummaryRecord,
    WakeRecord,
)
from sessiond.log.spend import run_number, spent
from sessiond.log.state import MAILBOX_KEEP, RUN_DAYS_KEEP, TRANSCRIPT_KEEP, State
from sessiond.sdkwire import TranscriptItem

# A handler (log.fold.Handler) takes the payload as the TypedDict of its event type
# (log/event_records.py): the table below holds them all, so their third parameter
# is spelt for each one.


def _ref(state: State, ref: ArtifactJson | None) -> None:
    if ref:
        state.artifacts_seen += 1


def _keep(state: State, item: TranscriptItem) -> None:
    """The newest items of the messages view only (the same items as
    log.projections.transcript_item): the view itself is built from the log."""
    transcript = state.transcript
    transcript.append(item)
    if len(transcript) > TRANSCRIPT_KEEP:
        del transcript[0]


# --- identity and lineage ------------------------------------------------------


def _created(s: State, r: EventRecord, d: SessionCreatedData) -> None:
    s.name = d["name"]
    s.goal = d["goal"]
    s.description = d["description"]
    s.agent = d["agent"]
    s.priority = d["priority"]
    s.labels = dict(d["labels"])
    s.profile = d["profile"]
    s.spec = d["spec"]
    s.spec_sha256 = d["spec_sha256"]
    s.created_at = r["ts"]


def _forked(s: State, r: EventRecord, d: SessionForkedData) -> None:
    if d["child"] == r["session"]:
        # This log is the child's: its prefix is the parent's history, its future
        # its own. It has no children of its own yet and runs nothing inherited.
        s.name = d["child"]
        s.parent = d["parent"]
        s.fork_seq = d["at_seq"]
        s.children = []
        s.merged = []
        s.current_run = None
        s.pending_wakes = []
        # The open turn goes on in the child, as a forked process goes on from where
        # its parent was: steps the parent finished are replayed to the child's
        # program, never done again. (Questions the parent has open are the
        # parent's: syscalls.lineage drops them from the child.)
        s.created_at = r["ts"]
    elif d["child"] not in s.children:
        s.children.append(d["child"])


def _merged(s: State, r: EventRecord, d: SessionMergedData) -> None:
    s.merged.append(d["child"])
    for ref in d["artifacts"]:
        _ref(s, ref)
    text = f"[merged from {d['child']}] {d['summary']}"
    _keep(s, {"seq": r["seq"], "role": "user", "kind": "merge", "text": text,
              "sender": d["child"], "artifacts": d["artifacts"]})  # fmt: skip
    if d["artifacts"]:
        s.view_artifacts.append({"seq": r["seq"], "refs": list(d["artifacts"])})


def _migrated(s: State, r: EventRecord, d: SessionMigratedData) -> None:
    if d["to_profile"]:
        s.profile = d["to_profile"]
    if d["to"]:
        s.migrated_to = d["to"]
        handover = d.get("handover")
        if handover:  # the commit of a two-phase hand-over
            s.handover = {
                "id": handover,
                "role": "source",
                "peer": d["to"],
                "phase": "committed",
            }


def _handover(role: Literal["source", "target"], phase: str) -> Handler:
    """The fold of a hand-over phase (syscalls.handover): the last one is kept."""

    def fold(s: State, r: EventRecord, d: MigrationData) -> None:
        peer = d.get("to") or d.get("source") or (s.handover["peer"] if s.handover else None)
        # always named: started and aborted name `to`, arriving `source`, and a finished
        # or discarded follows its arriving
        peer = cast(str, peer)
        h: HandoverRecord = {"id": d["handover"], "role": role, "peer": peer, "phase": phase}
        if "restore" in d:
            h["restore"] = d["restore"]
        elif s.handover is not None and s.handover["id"] == d["handover"]:
            h = {**s.handover, "phase": phase}
        s.handover = h

    return fold


def _imported(s: State, r: EventRecord, d: SessionImportedData) -> None:
    s.imported_from = d["original_name"]
    s.name = r["session"]
    s.current_run = None


def _lifecycle(s: State, r: EventRecord, d: LifecycleChangedData) -> None:
    if d["to"] == "running":
        # Every run is `running` (durably) before its program starts, so this
        # counts the run numbers given out, including a run cut off before its
        # run.started whose program may have run under that number.
        s.run_number += 1
        # A new turn takes the wakes recorded until now; a run that continues the
        # open turn takes only what continues it (log.turns). Wakes cannot come in
        # between: the start holds the session's lock.
        turns.begin_run(s, r["seq"])
    s.state = d["to"]
    s.reason = d["reason"]
    s.outcome = d["outcome"]
    s.until = d["until"]
    s.last_active = r["ts"]


# --- wakes, gate, recovery -------------------------------------------------------


def _wake(s: State, r: EventRecord, d: WakeRequestedData) -> None:
    wake: WakeRecord = {"seq": r["seq"], "ts": r["ts"], "trigger": d["trigger"],
                        "details": d["details"]}  # fmt: skip
    s.pending_wakes.append(wake)
    s.last_wake = wake


def _gate(s: State, r: EventRecord, d: GateEvaluatedData) -> None:
    s.last_gate = {"seq": r["seq"], "ts": r["ts"], **d}
    turns.diverged(s, d.get("divergence"))


def _recovery(s: State, r: EventRecord, d: RecoveryResolvedData) -> None:
    s.last_recovery = {"seq": r["seq"], "ts": r["ts"], **d}
    turns.resolved(s, d)
    call = d["call"]
    if d["option"] == "discard" and call is not None:
        s.calls.pop(call, None)
        s.approvals.pop(call, None)
    elif d["option"] == "accept":
        for path, digest in d["hashes"].items():
            if path in s.bound:
                s.bound[path] = digest
            else:
                s.file_hashes[path] = digest


# --- runs ------------------------------------------------------------------------


def _run_started(s: State, r: EventRecord, d: RunStartedData) -> None:
    s.runs += 1
    s.run_number = max(s.run_number, run_number(d["run"]))
    s.current_run = {
        "run": d["run"],
        "kind": d["kind"],
        "pid": d["pid"],
        "pgid": d["pgid"],
        "proc_start": d["proc_start"],
        "wakes": d["wakes"],
        "seq": r["seq"],
        "ts": r["ts"],
        "turn": d.get("turn"),
    }
    day = r["ts"][:10]
    s.runs_by_day[day] = s.runs_by_day.get(day, 0) + 1
    if len(s.runs_by_day) > RUN_DAYS_KEEP:  # only recent days matter for runs_per_day
        for old in sorted(s.runs_by_day)[:-RUN_DAYS_KEEP]:
            del s.runs_by_day[old]
    s.tool_calls_this_run = 0
    if s.turn is not None and s.turn["runs"] <= 1:
        s.turn["wakes"] = list(d["wakes"])  # the turn's wake cause, for its later runs
    if s.turn is None or s.turn["runs"] <= 1:
        # A turn's first run (or a log from before turns): its wakes and mail are
        # delivered. A later run of the turn sees the turn's, and what came
        # meanwhile waits for the next turn.
        s.pending_wakes = []
        s.mailbox = []
    s.budget_exhausted = None
    s.last_active = r["ts"]


def _run_finished(s: State, r: EventRecord, d: RunFinishedData) -> None:
    s.current_run = None
    s.last_run = {"seq": r["seq"], "ts": r["ts"], **d}
    s.seconds_used += d["duration_ms"] // 1000
    _ref(s, d["stdout"])
    _ref(s, d["stderr"])
    # A run stopped at a stable point (for an approval, an interrupt) did not fail.
    status = d["status"]
    if status == "ok":
        s.failures_in_a_row = 0
    elif status != "interrupted":
        s.failures_in_a_row += 1
    if d.get("ends_turn") is not False:  # None: a log from before turns
        turns.end_turn(s)
    s.last_active = r["ts"]


def _message(s: State, r: EventRecord, d: MessageReceivedData) -> None:
    s.messages_received += 1
    s.mailbox.append(r["seq"])
    if len(s.mailbox) > MAILBOX_KEEP:
        del s.mailbox[0]
    _keep(s, {"seq": r["seq"], "role": d["role"], "kind": "message", "text": d["text"],
              "sender": d["sender"]})  # fmt: skip


def _model_requested(s: State, r: EventRecord, d: ModelRequestedData) -> None:
    _ref(s, d["context"])
    if d.get("replayed"):
        return  # asked again and answered from the log: nothing is pending
    turns.model_requested(s, d)
    s.pending_model = {
        "request_id": d["request_id"],
        "model": d["model"],
        "seq": r["seq"],
        "context": d["context"],
    }


def _model_responded(s: State, r: EventRecord, d: ModelRespondedData) -> None:
    s.pending_model = None
    turns.model_responded(s, d)
    s.model_replies += 1
    s.tokens_in += d["tokens_in"]
    s.tokens_out += d["tokens_out"]
    s.cost_usd += d.get("cost_usd") or 0.0
    spent(s, r["ts"][:10], d["tokens_in"] + d["tokens_out"], d.get("cost_usd") or 0.0)
    _ref(s, d["response"])
    if d["text"]:
        _keep(s, {"seq": r["seq"], "role": "assistant", "kind": "model", "text": d["text"],
                  "model": d["model"]})  # fmt: skip


# --- tool calls ---------------------------------------------------------------------


def _intent(s: State, r: EventRecord, d: ToolIntentData) -> None:
    call = d["call"]
    s.calls[call] = {
        "call": call,
        "tool": d["tool"],
        "args": d["args"],
        "risk": d["risk"],
        "writes": d["writes"],
        "stage": "intent",
        "seq": r["seq"],
    }
    s.tool_calls += 1
    s.tool_calls_this_run += 1
    if s.turn is not None:  # (a call outside a turn is no step: no call, per event)
        turns.tool_intent(s, d)


def _decided(s: State, r: EventRecord, d: PolicyDecidedData) -> None:
    call = s.calls.get(d["call"])
    if call is not None:
        call["decision"] = d["decision"]
        call["rule"] = d["rule"]
        call["stage"] = "denied" if d["decision"] == "deny" else "decided"
    if s.turn is not None:
        denied = d["decision"] == "deny"
        turns.set_status(s, d["call"], "denied" if denied else "decided", rule=d["rule"])


def _approval_requested(s: State, r: EventRecord, d: ApprovalRequestedData) -> None:
    s.approvals[d["call"]] = {
        "call": d["call"],
        "tool": d["tool"],
        "args_sha256": d["args_sha256"],
        "status": "pending",
        "requested_at": r["ts"],
        "seq": r["seq"],
    }
    call = s.calls.get(d["call"])
    if call is not None:
        call["stage"] = "approval"
    if s.turn is not None:
        turns.set_status(s, d["call"], "approval")


def _approval_granted(s: State, r: EventRecord, d: ApprovalGrantedData) -> None:
    approval = s.approvals.setdefault(d["call"], {"call": d["call"], "tool": d["tool"]})
    approval["status"] = "granted"
    approval["args_sha256"] = d["args_sha256"]
    approval["by"] = d["by"]
    approval["expires_at"] = d["expires_at"]
    approval["answered_at"] = r["ts"]
    _who(approval, d)
    call = s.calls.get(d["call"])
    if call is not None:
        call["stage"] = "approved"
    if s.turn is not None:
        turns.set_status(s, d["call"], "approved")


def _approval_denied(s: State, r: EventRecord, d: ApprovalDeniedData) -> None:
    approval = s.approvals.setdefault(d["call"], {"call": d["call"], "tool": d["tool"]})
    approval["status"] = "denied"
    approval["by"] = d["by"]
    approval["reason"] = d["reason"]
    approval["answered_at"] = r["ts"]
    _who(approval, d)
    call = s.calls.get(d["call"])
    if call is not None:
        call["stage"] = "denied"
    if s.turn is not None:
        turns.set_status(s, d["call"], "denied", rule=f"denied by {d['by'] or 'a person'}")


def _who(approval: ApprovalRecord, d: ApprovalGrantedData | ApprovalDeniedData) -> None:
    """Who answered, from the peer's credentials (events before 0.x have none)."""
    if d.get("uid") is not None:
        approval["uid"] = d["uid"]
        approval["user"] = d["user"]
        approval["channel"] = d["channel"]


# The handlers below run for most events of a busy session, so a call keeps the
# data of its started and finished events as they are (records are never
# mutated) instead of copying their fields.


def _tool_started(s: State, r: EventRecord, d: ToolStartedData) -> None:
    call = s.calls.get(d["call"]) or call_of(s, d)
    call["stage"] = "started"
    call["started"] = d
    call["started_seq"] = r["seq"]
    if s.turn is not None:
        turns.tool_started(s, d)


def _tool_finished(s: State, r: EventRecord, d: ToolFinishedData) -> None:
    call = s.calls.get(d["call"]) or call_of(s, d)
    call["stage"] = "finished"
    call["finished"] = d
    call["finished_seq"] = r["seq"]
    if s.turn is not None:
        turns.tool_finished(s, d)
    if d["hashes"]:
        s.file_hashes.update(d["hashes"])
    if d["output"]:
        s.artifacts_seen += 1
    if d["diff"]:
        s.artifacts_seen += 1


def _observed(s: State, r: EventRecord, d: ObservationProjectedData) -> None:
    call, tool, text, seq = d["call"], d["tool"], d["text"], r["seq"]
    if s.turn is not None:
        turns.observed(s, d)
    s.calls.pop(call, None)
    if s.approvals:
        s.approvals.pop(call, None)
    s.last_observation = {"seq": seq, "call": call, "tool": tool, "text": text}
    # _keep, inline: the handler of one event in five of a busy session
    transcript = s.transcript
    transcript.append({"seq": seq, "role": "tool", "kind": "observation", "text": text,
                       "tool": tool, "call": call})  # fmt: skip
    if len(transcript) > TRANSCRIPT_KEEP:
        del transcript[0]


# --- context, verification, budget, bindings, repairs ------------------------------------


def _compacted(s: State, r: EventRecord, d: ContextCompactedData) -> None:
    """Replace the items of the range by the summary, where the range began.

    An earlier summary inside the range goes too: the new summary covers it, and
    what that one stood in for (``hides``). The fold keeps the summaries in force;
    the view (log.projections) hides every item one of them stands in for.
    """
    lo, hi = d["from_seq"], d["to_seq"]
    summary: TranscriptItem = {
        "seq": lo,
        "role": "system",
        "kind": "summary",
        "text": f"Summary of earlier context (events {lo}-{hi}): {d['summary']}",
        "range": [lo, hi],
        "compacted_at": r["seq"],
        "artifacts": [d["artifact"]] if d["artifact"] else [],
    }
    before = [t for t in s.transcript if t["seq"] < lo]
    after = [t for t in s.transcript if t["seq"] > hi]
    s.transcript = [*before, summary, *after][-TRANSCRIPT_KEEP:]
    hides = hi
    kept: list[SummaryRecord] = []
    for old in s.summaries:
        if lo <= old["seq"] <= hi:
            hides = max(hides, old["hides"])
        else:
            kept.append(old)
    s.summaries = [*kept, {**summary, "hides": hides}]
    s.view_artifacts = [a for a in s.view_artifacts if not lo <= a["seq"] <= hi]
    if summary["artifacts"]:
        s.view_artifacts.append({"seq": lo, "refs": summary["artifacts"]})
    s.compactions += 1
    s.last_compaction = {"seq": r["seq"], "from_seq": lo, "to_seq": hi, "method": d["method"]}
    _ref(s, d["artifact"])


def _verification_started(s: State, r: EventRecord, d: VerificationStartedData) -> None:
    s.last_verification = {"seq": r["seq"], "check": d["check"], "ok": None}


def _verification_finished(s: State, r: EventRecord, d: VerificationFinishedData) -> None:
    s.last_verification = {"seq": r["seq"], "check": d["check"], "ok": d["ok"]}
    _ref(s, d["output"])
    verdict = "passed" if d["ok"] else "failed"
    text = f"verification {d['check']!r} {verdict}"
    _keep(s, {"seq": r["seq"], "role": "tool", "kind": "verification", "text": text})


def _budget(s: State, r: EventRecord, d: BudgetExhaustedData) -> None:
    s.budget_exhausted = {"seq": r["seq"], "ts": r["ts"], **d}


def _binding(s: State, r: EventRecord, d: BindingObservedData) -> None:
    s.bound.update(d["hashes"])


def _repaired(s: State, r: EventRecord, d: LogRepairedData) -> None:
    s.repairs.append({"seq": r["seq"], "ts": r["ts"], **d})


def _spec_applied(s: State, r: EventRecord, d: JsonObject) -> None:
    """Nothing to fold: the spec in force is spec.toml; this event records who changed it."""


def _gc_collected(s: State, r: EventRecord, d: JsonObject) -> None:
    """Nothing to fold: a gc removes only what continuing does not need (its evidence)."""


HANDLERS: dict[str, Handler] = {
    "session.created": _created,
    "session.forked": _forked,
    "session.merged": _merged,
    "session.migrated": _migrated,
    "session.imported": _imported,
    "lifecycle.changed": _lifecycle,
    "wake.requested": _wake,
    "gate.evaluated": _gate,
    "recovery.resolved": _recovery,
    "run.started": _run_started,
    "run.finished": _run_finished,
    "message.received": _message,
    "model.requested": _model_requested,
    "model.responded": _model_responded,
    "tool.intent": _intent,
    "policy.decided": _decided,
    "approval.requested": _approval_requested,
    "approval.granted": _approval_granted,
    "approval.denied": _approval_denied,
    "tool.started": _tool_started,
    "tool.finished": _tool_finished,
    "observation.projected": _observed,
    "context.compacted": _compacted,
    "verification.started": _verification_started,
    "verification.finished": _verification_finished,
    "budget.exhausted": _budget,
    "binding.observed": _binding,
    "log.repaired": _repaired,
    "spec.applied": _spec_applied,
    "gc.collected": _gc_collected,
    "migration.started": _handover("source", "started"),
    "migration.aborted": _handover("source", "aborted"),
    "migration.arriving": _handover("target", "arriving"),
    "migration.finished": _handover("target", "finished"),
    "migration.discarded": _handover("target", "discarded"),
}

assert set(HANDLERS) == set(CURRENT_VERSION), "every event type needs a fold handler"


# A plain dict: faster than the read-only mapping in the loop below.
_VERSIONS: dict[str, int] = dict(CURRENT_VERSION)


def apply(state: State, record: EventRecord) -> State:
    """Fold one record into ``state`` (in place) and return it."""
    etype = record["type"]
    if record["v"] != _VERSIONS.get(etype):
        record = upcast(record)
    HANDLERS[etype](state, record, record["data"])
    state.seq = record["seq"]
    state.last_id = record["id"]
    state.last_ts = record["ts"]
    return state


def replay(records: Iterable[EventRecord], state: State) -> State:
    """Fold ``records`` into ``state``; the hot loop of start-up and ``sessionctl replay``.

    The state after it is exactly the one ``apply`` leaves record by record
    (tests/log/test_fold_equivalence.py).
    """
    if isinstance(records, list):
        return replay_rows(records, state, HANDLERS)
    it = iter(records)
    while rows := list(islice(it, STEP)):
        replay_rows(rows, state, HANDLERS)
    return state


def replay_all(session: str, records: Iterable[EventRecord]) -> State:
    return replay(records, State(session=session))
