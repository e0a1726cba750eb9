"""The state of a session: what a fold of its events leaves behind.

Plain data (dicts, lists, strings, numbers) so that it serialises to a snapshot
with orjson as it is, and compares equal after a round trip. The fold that
builds it is :mod:`sessiond.log.replay`.

Tool calls move through stages, keyed by their call id; a call keeps the data of
its ``tool.started`` and ``tool.finished`` events under ``started`` and
``finished``::

    intent -> decided -> [approval -> approved] -> started -> finished -> (observed: removed)
                      \\-> denied                                        (denial observed: removed)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypedDict

from sessiond.log.event_records import JsonObject
from sessiond.log.records import (
    ApprovalRecord,
    BudgetRecord,
    CallRecord,
    CurrentRun,
    HandoverRecord,
    LastCompaction,
    LastGate,
    LastObservation,
    LastRecovery,
    LastRun,
    LastVerification,
    PendingModel,
    RepairRecord,
    SummaryRecord,
    TurnRecord,
    ViewArtifacts,
    WakeRecord,
)
from sessiond.sdkwire import ArtifactJson, TranscriptItem

# Bump when the fold's meaning changes: snapshots of another version are ignored.
# 7: the transcript is the newest TRANSCRIPT_KEEP items only, beside the summaries
# in force and the artifacts the view shows (the view is built from the log).
# 8: the replies' reported cost is summed (cost_usd).
# 9: the replies' tokens and cost by day, run and turn (model_spend: the gateway's budgets).
REDUCER_VERSION = 9

# The state must stay small however long a session lives, because start-up loads
# it from a snapshot: history is in the log, the state keeps what continuing
# needs. Hence the bounds below and the compaction of the transcript.
MAILBOX_KEEP = 100
TRANSCRIPT_KEEP = 8
RUN_DAYS_KEEP = 7

PENDING_STAGES = frozenset({"intent", "decided", "approval", "approved"})


class ModelSpend(TypedDict, total=False):
    """What the model replies cost: lists, as JSON keeps them (a snapshot's own form)."""

    days: dict[str, list[float]]  # "YYYY-MM-DD": [tokens, cost]
    run: list[float]  # [run n, tokens, cost]
    turn: list[float]  # [turn n, tokens, cost]


SpendKey = Literal["run", "turn"]


@dataclass(slots=True)
class State:
    session: str
    seq: int = 0
    last_id: str | None = None
    last_ts: str | None = None

    # identity (from session.created, fork, import, migrate)
    name: str = ""
    goal: str = ""
    description: str = ""
    agent: str = ""
    priority: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    profile: str = "default"
    spec: JsonObject = field(default_factory=dict)
    spec_sha256: str | None = None
    created_at: str | None = None
    last_active: str | None = None

    # lifecycle
    state: str = "created"
    reason: str = ""
    outcome: str | None = None
    until: str | None = None

    # lineage
    parent: str | None = None
    fork_seq: int | None = None
    children: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    imported_from: str | None = None
    migrated_to: str | None = None
    # the last hand-over to or from another daemon (syscalls.handover): id, role
    # (source, target), peer, phase (started, committed, aborted; arriving,
    # finished, discarded) and, on a target, the state it becomes at the finish
    handover: HandoverRecord | None = None

    # runs and budget use
    runs: int = 0
    # The highest run number given out, including a run cut off between its
    # `running` and its run.started (its program may have run): never reused.
    run_number: int = 0
    model_replies: int = 0  # model.responded events (before 0.6 `show` called this "turns")
    # The open turn (docs/design.md section 8): the work one wake started, until a run
    # ends it. Its wakes, and its steps by slot (the ordinal, or "k:" + a key),
    # each with its kind, name, args digest, call, status and (when ok) result.
    turn: TurnRecord | None = None
    turn_number: int = 0  # turns begun, the open one included
    current_run: CurrentRun | None = None
    last_run: LastRun | None = None
    failures_in_a_row: int = 0
    runs_by_day: dict[str, int] = field(default_factory=dict)
    seconds_used: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0  # the model replies' reported cost (model.responded cost_usd)
    # The same by day (the last RUN_DAYS_KEEP), for the open run and the open turn.
    # The gateway's budgets read it, so what was spent survives a restart.
    model_spend: ModelSpend = field(default_factory=ModelSpend)
    tool_calls: int = 0
    tool_calls_this_run: int = 0
    budget_exhausted: BudgetRecord | None = None

    # wakes and the gate
    pending_wakes: list[WakeRecord] = field(default_factory=list)
    last_wake: WakeRecord | None = None
    last_gate: LastGate | None = None
    last_recovery: LastRecovery | None = None

    # tool calls and approvals
    calls: dict[str, CallRecord] = field(default_factory=dict)
    approvals: dict[str, ApprovalRecord] = field(default_factory=dict)
    last_observation: LastObservation | None = None
    last_verification: LastVerification | None = None
    pending_model: PendingModel | None = None

    # the workspace: hashes of bound files and of files written by tools
    bound: dict[str, str | None] = field(default_factory=dict)
    file_hashes: dict[str, str | None] = field(default_factory=dict)

    # evidence and context
    artifacts_seen: int = 0
    messages_received: int = 0
    # seqs of messages received since the last run started (the last MAILBOX_KEEP);
    # their text is in the transcript (and the log)
    mailbox: list[int] = field(default_factory=list)
    # The newest TRANSCRIPT_KEEP items of the messages view, in seq order, with
    # compacted ranges already replaced by their summary. The whole view is built
    # from the log when asked (log.projections), so the state does not grow with it.
    transcript: list[TranscriptItem] = field(default_factory=list)
    # The compaction summaries in force: each a transcript item ("seq" is where its
    # range begins) and "hides", the last seq it stands in for (its range's end, or
    # further where it replaced an earlier summary that reached further).
    summaries: list[SummaryRecord] = field(default_factory=list)
    # The artifacts attached to items the view shows (merges, summaries): {"seq", "refs"}.
    view_artifacts: list[ViewArtifacts] = field(default_factory=list)
    compactions: int = 0
    last_compaction: LastCompaction | None = None
    repairs: list[RepairRecord] = field(default_factory=list)

    # --- derived views -------------------------------------------------------------

    def pending_intents(self) -> dict[str, CallRecord]:
        """Calls recorded as intended whose tool has not started."""
        return {k: c for k, c in self.calls.items() if c["stage"] in PENDING_STAGES}

    def in_flight(self) -> dict[str, CallRecord]:
        """Calls started without a ``tool.finished``: the world may have changed."""
        return {k: c for k, c in self.calls.items() if c["stage"] == "started"}

    def unobserved(self) -> dict[str, CallRecord]:
        """Calls finished (or denied) whose observation is not recorded yet."""
        return {k: c for k, c in self.calls.items() if c["stage"] in ("finished", "denied")}

    def pending_approvals(self) -> dict[str, ApprovalRecord]:
        return {k: a for k, a in self.approvals.items() if a["status"] == "pending"}

    def live_artifacts(self) -> dict[str, ArtifactJson]:
        """Artifacts that continuing depends on: outputs of calls not yet observed,
        the last run's output, the pending model context, and those attached to
        what the messages view shows (merges, compaction summaries)."""
        refs: dict[str, ArtifactJson] = {}

        def add(ref: ArtifactJson | None) -> None:
            if ref:
                refs[ref["ref"]] = ref

        for call in self.calls.values():
            finished = call.get("finished")
            if finished:
                add(finished["output"])
                add(finished["diff"])
        if self.last_run:
            add(self.last_run.get("stdout"))
            add(self.last_run.get("stderr"))
        if self.pending_model:
            add(self.pending_model.get("context"))
        for item in self.view_artifacts:
            for ref in item["refs"]:
                add(ref)
        return refs

    def at_stable_point(self) -> bool:
        """No tool between intent and observation, no model call awaiting its answer."""
        return not self.calls and self.pending_model is None

    # --- snapshots -------------------------------------------------------------------

    # A snapshot's state: the fields by name, as JSON (the records above are dicts).
    # Untyped here only: from_dict refuses a field the State does not have.
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    # a snapshot's state as JSON: the fields' names are checked here, cls(**) takes them
    def from_dict(cls, data: dict[str, Any]) -> State:
        if len(data) == len(_ORDER):
            # Every field by position: a call with some 60 keywords matches each
            # name by comparing strings (a parsed snapshot's keys are not the
            # interned parameter names), 20 us a state, at every session's opening.
            try:
                return cls(*map(data.__getitem__, _ORDER))
            except KeyError:
                pass  # as many keys, not the same ones: named below
        unknown = data.keys() - _FIELDS
        if unknown:
            raise ValueError(f"snapshot state has unknown fields {sorted(unknown)}")
        return cls(**data)


_ORDER = tuple(f.name for f in fields(State))
_FIELDS = frozenset(_ORDER)
