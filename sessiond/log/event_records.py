"""Events as records: the JSON form of an event and of each payload, as types.

The fold (log/replay.py) and the views read events as plain dicts, for speed
(log/events.py): these ``TypedDict``s say what those dicts hold, so that the
type checker sees every read. They mirror the pydantic payloads of
:mod:`sessiond.log.event_data` in their JSON form (``dump_data``): a field the
readers take with ``.get`` is ``NotRequired``, because logs written before it
existed lack it. They describe; they never validate (that is ``events.decode``).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pydantic import JsonValue

from sessiond.codec import EventRecord, NodeStamp
from sessiond.sdkwire import ArtifactJson

# the line's own fields are the codec's, an artifact reference the SDK's: on the ground floor
__all__ = ["ArtifactJson", "EventRecord", "NodeStamp"]

# A JSON object whose shape is someone else's: a tool's args, a wake's details, a
# session's spec as written. Readers check what they take from it.
JsonObject = dict[str, JsonValue]


class RiskJson(TypedDict):
    """A :class:`~sessiond.log.event_data.RiskContract` as JSON."""

    side_effect: str
    idempotency: str
    resume: str


class GateCheckJson(TypedDict):
    name: str
    ok: bool
    detail: str


class StepRefJson(TypedDict):
    kind: str
    name: str
    digest: str | None
    slot: NotRequired[str | None]  # absent in events from before nesting


class DivergenceJson(TypedDict):
    """A :class:`~sessiond.log.event_data.StepDivergence` as JSON."""

    ordinal: int
    key: NotRequired[str | None]
    recorded: StepRefJson
    asked: StepRefJson


class RunWake(TypedDict):
    """A wake as a run is told of it (``run.started`` ``wakes``, ``SESSIOND_WAKE``):
    one recorded (with its seq and time) or the cause of a run none was recorded for."""

    trigger: str
    details: JsonObject
    seq: NotRequired[int]
    ts: NotRequired[str]
    cut: NotRequired[bool]  # SESSIOND_WAKE only: too big for it, read the wake file


# --- payloads, by event type ------------------------------------------------------------


class SessionCreatedData(TypedDict):
    name: str
    goal: str
    description: str
    agent: str
    priority: int
    labels: dict[str, str]
    profile: str
    spec: JsonObject
    spec_sha256: str | None


class SessionForkedData(TypedDict):
    parent: str
    child: str
    at_seq: int
    with_triggers: NotRequired[bool]


class SessionMergedData(TypedDict):
    child: str
    summary: str
    artifacts: list[ArtifactJson]
    child_seq: NotRequired[int]


class SessionMigratedData(TypedDict):
    from_profile: NotRequired[str | None]
    to_profile: str | None
    to: str | None
    handover: NotRequired[str | None]  # absent in logs from before the hand-over


class MigrationData(TypedDict):
    """Any of the hand-over's events (migration.started, aborted, arriving, finished,
    discarded): each has ``handover`` and some of the rest."""

    handover: str
    to: NotRequired[str]  # started, aborted
    source: NotRequired[str]  # arriving
    restore: NotRequired[str]  # arriving
    reason: NotRequired[str]  # aborted, discarded
    by: NotRequired[str]  # finished, discarded; and who, from the peer's credentials:
    uid: NotRequired[int | None]
    user: NotRequired[str]
    channel: NotRequired[str]


class SessionImportedData(TypedDict):
    original_name: str
    bundle_sha256: NotRequired[str | None]
    exported_at: NotRequired[str | None]
    events: NotRequired[int]


# ``from`` is a keyword: the functional form
LifecycleChangedData = TypedDict(
    "LifecycleChangedData",
    {
        "from": NotRequired[str | None],
        "to": str,
        "reason": str,
        "outcome": str | None,
        "until": str | None,
    },
)


class WakeRequestedData(TypedDict):
    trigger: str
    details: JsonObject


class GateEvaluatedData(TypedDict):
    ok: bool
    checks: list[GateCheckJson]
    options: list[str]
    outcome: str
    dry_run: bool
    divergence: NotRequired[DivergenceJson | None]  # absent in logs from before turns


class RecoveryResolvedData(TypedDict):
    option: str
    call: str | None
    hashes: dict[str, str | None]
    by: str
    ends_turn: NotRequired[bool]
    from_ordinal: NotRequired[int | None]
    uid: NotRequired[int | None]
    user: NotRequired[str]
    channel: NotRequired[str]


class RunStartedData(TypedDict):
    run: str
    kind: str
    pid: int | None
    pgid: int | None
    proc_start: int | None
    profile: NotRequired[str]
    wakes: list[RunWake]
    turn: NotRequired[int | None]  # absent in logs from before turns


class RunFinishedData(TypedDict):
    run: str
    status: str
    exit_code: int | None
    signal: int | None
    duration_ms: int
    stdout: ArtifactJson | None
    stderr: ArtifactJson | None
    error: str
    ends_turn: NotRequired[bool | None]  # None or absent: a log from before turns


class MessageReceivedData(TypedDict):
    sender: str
    text: str
    role: str
    message_id: NotRequired[str | None]


class ModelRequestedData(TypedDict):
    model: str
    request_id: str
    context: ArtifactJson
    tools_sha256: NotRequired[str | None]
    tool_count: NotRequired[int]
    # a durable step's place (absent in logs from before steps)
    turn: NotRequired[int | None]
    ordinal: NotRequired[int | None]
    key: NotRequired[str | None]
    request_sha256: NotRequired[str | None]
    parent: NotRequired[str | None]
    replayed: NotRequired[bool]


class ModelRespondedData(TypedDict):
    model: str
    request_id: str
    status: Literal["ok", "error", "cancelled"]
    tokens_in: int
    tokens_out: int
    cost_usd: NotRequired[float | None]
    duration_ms: NotRequired[int]
    text: str
    response: ArtifactJson | None
    error_class: NotRequired[str | None]
    wrapped: NotRequired[list[str]]  # the gateway's steps an SDK model step wrapped


class ToolIntentData(TypedDict):
    call: str
    tool: str
    args: JsonObject
    risk: RiskJson
    writes: list[str]
    # a durable step's place and args digest (absent in logs from before steps)
    turn: NotRequired[int | None]
    ordinal: NotRequired[int | None]
    key: NotRequired[str | None]
    args_sha256: NotRequired[str | None]
    parent: NotRequired[str | None]


class PolicyDecidedData(TypedDict):
    call: str
    tool: str
    decision: str
    rule: str


class ApprovalRequestedData(TypedDict):
    call: str
    tool: str
    args_sha256: str | None


class _Answerer(TypedDict):
    """Who answered, from the peer's credentials: absent in events from before them."""

    uid: NotRequired[int | None]
    user: NotRequired[str]
    channel: NotRequired[str]


class ApprovalGrantedData(_Answerer):
    call: str
    tool: str
    args_sha256: str | None
    by: str
    expires_at: str | None


class ApprovalDeniedData(_Answerer):
    call: str
    tool: str
    by: str
    reason: str


class ToolStartedData(TypedDict):
    call: str
    tool: str
    hashes: dict[str, str | None]
    git_head: str | None
    attempt: NotRequired[int]


class ToolFinishedData(TypedDict):
    call: str
    tool: str
    status: Literal["ok", "error", "interrupted"]
    exit_code: NotRequired[int | None]
    error_class: NotRequired[str | None]
    hashes: dict[str, str | None]
    output: ArtifactJson | None
    diff: ArtifactJson | None
    truncated: NotRequired[bool]
    limit: NotRequired[int | None]
    duration_ms: NotRequired[int]
    # a step's result (absent in logs from before steps)
    result_kind: NotRequired[str | None]
    result: NotRequired[JsonValue]
    result_ref: NotRequired[ArtifactJson | None]


class ObservationProjectedData(TypedDict):
    call: str
    tool: str
    text: str
    source: NotRequired[str]


class ContextCompactedData(TypedDict):
    from_seq: int
    to_seq: int
    summary: str
    method: str
    artifact: ArtifactJson | None


class VerificationStartedData(TypedDict):
    check: str
    call: NotRequired[str | None]


class VerificationFinishedData(TypedDict):
    check: str
    ok: bool
    call: NotRequired[str | None]
    output: ArtifactJson | None
    duration_ms: NotRequired[int]


class BudgetExhaustedData(TypedDict):
    budget: str
    limit: int
    used: int


class BindingObservedData(TypedDict):
    hashes: dict[str, str | None]


class LogRepairedData(TypedDict):
    dropped_bytes: int
    at_offset: int
    last_good_seq: int
    reason: str
