"""What the fold keeps in a :class:`~sessiond.log.state.State`, as types.

Every record here is a ``TypedDict``: at run time a plain dict, so the state
serialises to a snapshot with orjson as it is and compares equal after a round
trip (the snapshot format is these dicts' JSON; the golden files hold it). The
fold that builds them is :mod:`sessiond.log.replay` (and log/turns.py for the
turn and its steps).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pydantic import JsonValue

from sessiond.log.event_records import (
    BudgetExhaustedData,
    DivergenceJson,
    GateEvaluatedData,
    JsonObject,
    LogRepairedData,
    RecoveryResolvedData,
    RiskJson,
    RunFinishedData,
    RunWake,
    ToolFinishedData,
    ToolStartedData,
)
from sessiond.sdkwire import ArtifactJson, TranscriptItem

# A tool call's stages (log/state.py draws them)
CallStage = Literal["intent", "decided", "approval", "approved", "started", "finished", "denied"]

# A step's statuses (log/turns.py draws them); ``rerun``: a person chose to run it again
StepStatus = Literal[
    "intent",
    "decided",
    "approval",
    "approved",
    "started",
    "ok",
    "error",
    "interrupted",
    "denied",
    "dropped",
    "rerun",
]


class CallRecord(TypedDict):
    """A tool call between its intent and its observation (``State.calls``)."""

    call: str
    tool: str
    args: JsonObject
    risk: RiskJson | None  # None: its intent predates the log (a fork or import mid-call)
    writes: list[str]
    stage: CallStage
    seq: int | None
    decision: NotRequired[str]
    rule: NotRequired[str]
    # the data of its tool.started and tool.finished events, as they are
    started: NotRequired[ToolStartedData]
    started_seq: NotRequired[int]
    finished: NotRequired[ToolFinishedData]
    finished_seq: NotRequired[int]


class ApprovalRecord(TypedDict):
    """A question to a person about a call (``State.approvals``), and its answer."""

    call: str
    tool: str
    status: NotRequired[Literal["pending", "granted", "denied"]]
    args_sha256: NotRequired[str | None]
    requested_at: NotRequired[str]
    seq: NotRequired[int]
    by: NotRequired[str]
    expires_at: NotRequired[str | None]
    reason: NotRequired[str]
    answered_at: NotRequired[str]
    # who answered, from the peer's credentials (events from before them have none)
    uid: NotRequired[int | None]
    user: NotRequired[str]
    channel: NotRequired[str]


class WakeRecord(TypedDict):
    """A wake recorded and not yet taken by a turn (``State.pending_wakes``)."""

    seq: int
    ts: str
    trigger: str
    details: JsonObject


class CurrentRun(TypedDict):
    """The run under way (``State.current_run``), from its run.started."""

    run: str
    kind: str
    pid: int | None
    pgid: int | None
    proc_start: int | None
    wakes: list[RunWake]
    seq: int
    ts: str
    turn: int | None


class LastRun(RunFinishedData):
    """The last run.finished (``State.last_run``), with where and when."""

    seq: int
    ts: str


class StepRecord(TypedDict):
    """A step of the open turn, at its slot (``TurnRecord.steps``)."""

    kind: Literal["tool", "model"]
    slot: str
    ordinal: int
    key: str | None
    name: str
    digest: str | None
    call: str
    status: StepStatus
    # a nested step: its parent's slot and its whole place, [[position, segment], ...]
    parent: NotRequired[str]
    place: NotRequired[list[list[int | str]]]
    # a tool step's contract, what it writes and their hashes before the work
    risk: NotRequired[RiskJson | None]
    writes: NotRequired[list[str]]
    before: NotRequired[dict[str, str | None]]
    rule: NotRequired[str]
    # its result, when it finished ok (inline JSON, or an artifact)
    result_kind: NotRequired[str | None]
    result: NotRequired[JsonValue]
    result_ref: NotRequired[ArtifactJson | None]
    error: NotRequired[str]
    tokens: NotRequired[list[int]]  # a model step's [in, out]


class TurnRecord(TypedDict):
    """The open turn (``State.turn``): the work one wake started, until a run ends it."""

    n: int
    seq: int
    wakes: list[RunWake]
    runs: int
    steps: dict[str, StepRecord]  # by slot (log/places.py)
    calls: dict[str, str]  # a call id (or a model step's request id) -> its slot
    divergence: DivergenceJson | None


class SummaryRecord(TranscriptItem):
    """A compaction summary in force (``State.summaries``): ``hides`` is the last seq
    it stands in for."""

    hides: int


class ViewArtifacts(TypedDict):
    """The artifacts attached to an item the view shows (merges, summaries)."""

    seq: int
    refs: list[ArtifactJson]


class HandoverRecord(TypedDict):
    """The last hand-over to or from another daemon (``State.handover``)."""

    id: str
    role: Literal["source", "target"]
    peer: str  # the other daemon's socket
    phase: str
    restore: NotRequired[str]  # a target: the state it becomes at the finish


class PendingModel(TypedDict):
    """A model call awaiting its answer (``State.pending_model``)."""

    request_id: str
    model: str
    seq: int
    context: ArtifactJson


class LastObservation(TypedDict):
    seq: int
    call: str
    tool: str
    text: str


class LastVerification(TypedDict):
    seq: int
    check: str
    ok: bool | None  # None: under way


class LastCompaction(TypedDict):
    seq: int
    from_seq: int
    to_seq: int
    method: str


class LastGate(GateEvaluatedData):
    seq: int
    ts: str


class LastRecovery(RecoveryResolvedData):
    seq: int
    ts: str


class BudgetRecord(BudgetExhaustedData):
    seq: int
    ts: str


class RepairRecord(LogRepairedData):
    seq: int
    ts: str
