"""Payloads (``data``) of every event type.

These models are the on-disk format: a field's meaning never changes once
published. A new field is optional with a default; a changed meaning is a new
schema version with an upcaster in :mod:`sessiond.upcast`.

Each payload class names its event type in ``EVENT_TYPE`` so that code appends
``ToolIntent(...)`` and never spells a type string by hand.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, model_validator

SHA256_REF = re.compile(r"^sha256:[0-9a-f]{64}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

SideEffect = Literal["none", "read", "workspace-write", "external-write"]
Idempotency = Literal["safe", "conditional", "unsafe"]
ResumeRule = Literal[
    "replay-from-event", "rerun-after-check", "require-user-confirmation", "never-rerun"
]
ErrorClass = Literal[
    "provider",
    "context",
    "validation",
    "permission",
    "execution",
    "observation",
    "verification",
    "lifecycle",
]
LifecycleState = Literal[
    "created", "ready", "running", "sleeping", "suspended", "blocked", "arriving", "terminated"
]
Outcome = Literal["completed", "failed", "cancelled", "merged", "migrated"]
Decision = Literal["allow", "ask", "deny"]
RecoveryOption = Literal["rerun", "discard", "accept"]


def _check_ref(value: str) -> str:
    if not SHA256_REF.fullmatch(value):
        raise ValueError("an artifact reference is 'sha256:' followed by 64 lowercase hex digits")
    return value


def _check_hash(value: str | None) -> str | None:
    if value is not None and not SHA256_HEX.fullmatch(value):
        raise ValueError("a content hash is 64 lowercase hex digits (sha256)")
    return value


Ref = Annotated[str, AfterValidator(_check_ref)]
# The content hash of a file, or None when the file does not exist.
FileHash = Annotated[str | None, AfterValidator(_check_hash)]


class Record(BaseModel):
    """Base of everything stored in an event: frozen, strict about unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ArtifactRef(Record):
    """A reference to evidence in the session's content-addressed store."""

    ref: Ref
    name: str
    size: int = Field(ge=0)
    media_type: str = "application/octet-stream"

    @property
    def digest(self) -> str:
        return self.ref.removeprefix("sha256:")


class RiskContract(Record):
    """What a tool may do to the world, and what is safe after an interruption."""

    side_effect: SideEffect = "workspace-write"
    idempotency: Idempotency = "conditional"
    resume: ResumeRule = "rerun-after-check"


class GateCheck(Record):
    name: str
    ok: bool
    detail: str = ""


class EventData(Record):
    """Base of every payload."""

    EVENT_TYPE: ClassVar[str]


# --- session identity and lineage --------------------------------------------------------


class SessionCreated(EventData):
    EVENT_TYPE = "session.created"
    name: str
    goal: str = ""
    description: str = ""
    agent: str = ""
    priority: int = Field(default=0, ge=0, le=100)
    labels: dict[str, str] = Field(default_factory=dict)
    profile: str = "default"
    spec: dict[str, JsonValue] = Field(default_factory=dict)
    spec_sha256: FileHash = None


class SessionForked(EventData):
    """Written in both logs: the child's (right after the copied prefix) and the parent's."""

    EVENT_TYPE = "session.forked"
    parent: str
    child: str
    at_seq: int = Field(ge=0)
    with_triggers: bool = False


class SessionMerged(EventData):
    """Written in the parent's log: the child's result."""

    EVENT_TYPE = "session.merged"
    child: str
    summary: str
    artifacts: tuple[ArtifactRef, ...] = ()
    child_seq: int = Field(default=0, ge=0)


class SessionMigrated(EventData):
    """A switch of runner profile (``to_profile``) or a hand-over to another daemon (``to``)."""

    EVENT_TYPE = "session.migrated"
    from_profile: str | None = None
    to_profile: str | None = None
    to: str | None = None
    # the two-phase hand-over this commits (absent in logs from before it existed)
    handover: str | None = None


# --- the hand-over to another daemon (migrate --to), in two phases ---------------------
# Source: migration.started, then session.migrated (the commit) or migration.aborted.
# Target: migration.arriving (prepare: held, not runnable), then migration.finished
# (live) or migration.discarded (dropped). docs/events.md, "The hand-over".

HANDOVER_ID = re.compile(r"^[0-9a-f]{32}$")


def _check_handover(value: str) -> str:
    if not HANDOVER_ID.fullmatch(value):
        raise ValueError("a hand-over id is 32 lowercase hex digits")
    return value


Handover = Annotated[str, AfterValidator(_check_handover)]


class MigrationStarted(EventData):
    """Source: the hand-over ``handover`` to the daemon at ``to`` begins."""

    EVENT_TYPE = "migration.started"
    handover: Handover
    to: str


class MigrationAborted(EventData):
    """Source: the hand-over did not commit; this copy stays the live one."""

    EVENT_TYPE = "migration.aborted"
    handover: Handover
    to: str
    reason: str = ""


class MigrationArriving(EventData):
    """Target: the copy is held ``arriving`` until the source commits; at the finish it
    becomes ``restore`` (what it was at the source)."""

    EVENT_TYPE = "migration.arriving"
    handover: Handover
    source: str  # the source daemon's socket, asked when the finish never came
    restore: LifecycleState


class MigrationFinished(EventData):
    """Target: the hand-over is done, the copy is live here. ``by`` is "source" (its
    commit came) or "operator" (``resolve --accept``: the source was gone)."""

    EVENT_TYPE = "migration.finished"
    handover: Handover
    by: Literal["source", "operator"] = "source"
    uid: int | None = None
    user: str = ""
    channel: Literal["", "cli", "web", "link"] = ""


class MigrationDiscarded(EventData):
    """Target: the arriving copy is dropped (the source aborted, or an operator's
    ``resolve --discard``); its folder moves to ``discarded/`` in the state dir."""

    EVENT_TYPE = "migration.discarded"
    handover: Handover
    by: Literal["source", "operator"] = "source"
    reason: str = ""
    uid: int | None = None
    user: str = ""
    channel: Literal["", "cli", "web", "link"] = ""


class SpecApplied(EventData):
    """An operator gave the live session a new spec (``sessionctl apply``): who did,
    from the peer's credentials, and what changed. The next gate and run use it."""

    EVENT_TYPE = "spec.applied"
    spec_sha256: FileHash = None  # of the stored spec.toml text
    artifact: ArtifactRef | None = None  # that text, kept as evidence
    changed: tuple[str, ...] = ()  # the spec's top-level keys that differ ("policy", "run")
    by: str = ""  # the operator's free-text note
    uid: int | None = None
    user: str = ""
    channel: Literal["", "cli", "web", "link"] = ""


class SessionImported(EventData):
    EVENT_TYPE = "session.imported"
    original_name: str
    bundle_sha256: FileHash = None
    exported_at: str | None = None
    events: int = Field(default=0, ge=0)


class LifecycleChanged(EventData):
    EVENT_TYPE = "lifecycle.changed"
    from_state: LifecycleState | None = Field(default=None, alias="from")
    to: LifecycleState
    reason: str = ""
    outcome: Outcome | None = None
    until: str | None = None  # end of a cool-down (RFC 3339), for `sleeping`

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


# --- wakes, gate, recovery ------------------------------------------------------------


class WakeRequested(EventData):
    EVENT_TYPE = "wake.requested"
    # cron | every | watch | git | dependency | message | manual | approval | resolve |
    # retry (and restart, which earlier versions wrote at start-up)
    trigger: str
    details: dict[str, JsonValue] = Field(default_factory=dict)


class StepRef(Record):
    """One step of a turn as the divergence check saw it: kind, name, args digest."""

    kind: Literal["tool", "model"]
    name: str
    digest: FileHash = None
    slot: str | None = None  # its place, key and parent's (absent in older events)


class StepDivergence(Record):
    """A later run of a turn asked, at ``ordinal``, for another step than the recorded one."""

    ordinal: int = Field(ge=1)
    key: str | None = None
    recorded: StepRef
    asked: StepRef


class GateEvaluated(EventData):
    EVENT_TYPE = "gate.evaluated"
    ok: bool
    checks: tuple[GateCheck, ...] = ()
    options: tuple[RecoveryOption, ...] = ()
    outcome: Literal["ok", "blocked", "suspended"] = "ok"
    dry_run: bool = False
    divergence: StepDivergence | None = None  # a step diverged (docs/design.md section 8)


class RecoveryResolved(EventData):
    EVENT_TYPE = "recovery.resolved"
    option: RecoveryOption
    call: str | None = None
    hashes: dict[str, FileHash] = Field(default_factory=dict)
    by: str = ""
    # True where this resolution ends the open turn (a discarded step or divergence):
    # no later run of that turn may reach the discarded step again
    ends_turn: bool = False
    from_ordinal: int | None = Field(default=None, ge=1)  # a divergence accepted here
    # Who answered, from the peer's credentials (never the request); "by" is the
    # answerer's own free-text note. Absent in events written before they existed.
    uid: int | None = None
    user: str = ""
    channel: Literal["", "cli", "web", "link"] = ""


# --- runs ------------------------------------------------------------------------------


class RunStarted(EventData):
    EVENT_TYPE = "run.started"
    run: str
    kind: Literal["command", "sdk", "claude-code", "codex"] = "command"
    pid: int | None = None
    pgid: int | None = None
    proc_start: int | None = None  # start time of the process (clock ticks), to tell pids apart
    profile: str = "default"
    wakes: tuple[dict[str, JsonValue], ...] = ()
    turn: int | None = Field(default=None, ge=1)  # the turn this run does (or continues)


class RunFinished(EventData):
    EVENT_TYPE = "run.finished"
    run: str
    status: Literal["ok", "failed", "interrupted", "killed", "timeout", "lost"]
    exit_code: int | None = None
    signal: int | None = None
    duration_ms: int = Field(default=0, ge=0)
    stdout: ArtifactRef | None = None
    stderr: ArtifactRef | None = None
    error: str = ""
    # Whether this run ended its turn (sleep, complete, or a clean exit 0 with nothing
    # pending); None in logs written before turns: every run was its own turn.
    ends_turn: bool | None = None


class MessageReceived(EventData):
    EVENT_TYPE = "message.received"
    sender: str
    text: str
    role: Literal["user", "agent", "system"] = "user"
    message_id: str | None = None


class ModelRequested(EventData):
    EVENT_TYPE = "model.requested"
    model: str
    request_id: str
    context: ArtifactRef  # the exact context the model was sent
    tools_sha256: FileHash = None  # hash of the visible tool list
    tool_count: int = Field(default=0, ge=0)
    # a durable step (docs/design.md section 8): its place in the turn
    turn: int | None = Field(default=None, ge=1)
    ordinal: int | None = Field(default=None, ge=1)
    key: str | None = None
    request_sha256: FileHash = None
    parent: str | None = None  # a nested step: the parent's slot
    # asked again by a later run of the turn with another request digest: answered
    # from the log (the recorded response), recorded here to be seen
    replayed: bool = False


class ModelResponded(EventData):
    EVENT_TYPE = "model.responded"
    model: str
    request_id: str
    status: Literal["ok", "error", "cancelled"] = "ok"
    tokens_in: int = Field(default=0, ge=0)
    tokens_out: int = Field(default=0, ge=0)
    # what the caller was told the reply cost, in US dollars (an agent CLI's own
    # figure: Claude Code's result); None where nobody said
    cost_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    duration_ms: int = Field(default=0, ge=0)
    text: str = ""  # what the messages view shows
    response: ArtifactRef | None = None
    error_class: ErrorClass | None = None
    wrapped: tuple[str, ...] = Field(default=(), exclude_if=lambda v: not v)  # runs/wrapping.py


# --- a tool call: intent -> policy -> (approval) -> started -> finished -> observation ---


class ToolIntent(EventData):
    EVENT_TYPE = "tool.intent"
    call: str
    tool: str
    args: dict[str, JsonValue] = Field(default_factory=dict)
    risk: RiskContract = RiskContract()
    writes: tuple[str, ...] = ()
    # a durable step (docs/design.md section 8): its place in the turn and its args digest
    turn: int | None = Field(default=None, ge=1)
    ordinal: int | None = Field(default=None, ge=1)
    key: str | None = None
    args_sha256: FileHash = None
    parent: str | None = None  # a nested step (in another's fn): the parent's slot


class PolicyDecided(EventData):
    EVENT_TYPE = "policy.decided"
    call: str
    tool: str
    decision: Decision
    rule: str  # the rule that matched, e.g. "ask: edit_file" or "default: external-write"


class ApprovalRequested(EventData):
    EVENT_TYPE = "approval.requested"
    call: str
    tool: str
    args_sha256: FileHash = None


class ApprovalGranted(EventData):
    EVENT_TYPE = "approval.granted"
    call: str
    tool: str
    args_sha256: FileHash = None
    by: str = ""
    expires_at: str | None = None  # RFC 3339; None: does not expire
    # Who answered, from the peer's credentials (never the request); "by" is the
    # answerer's own free-text note. Absent in events written before they existed.
    uid: int | None = None
    user: str = ""
    channel: Literal["", "cli", "web", "link"] = ""


class ApprovalDenied(EventData):
    EVENT_TYPE = "approval.denied"
    call: str
    tool: str
    by: str = ""
    reason: str = ""
    # Who answered, from the peer's credentials (never the request); "by" is the
    # answerer's own free-text note. Absent in events written before they existed.
    uid: int | None = None
    user: str = ""
    channel: Literal["", "cli", "web", "link"] = ""


class ToolStarted(EventData):
    EVENT_TYPE = "tool.started"
    call: str
    tool: str
    hashes: dict[str, FileHash] = Field(default_factory=dict)  # `writes` before the work
    git_head: str | None = None
    attempt: int = Field(default=1, ge=1)


class ToolFinished(EventData):
    EVENT_TYPE = "tool.finished"
    call: str
    tool: str
    status: Literal["ok", "error", "interrupted"]
    exit_code: int | None = None
    error_class: ErrorClass | None = None
    hashes: dict[str, FileHash] = Field(default_factory=dict)  # `writes` after the work
    output: ArtifactRef | None = None
    diff: ArtifactRef | None = None
    truncated: bool = False
    limit: int | None = None  # bytes kept when truncated
    duration_ms: int = Field(default=0, ge=0)
    # a step's result, returned as it is by every later run of the turn: small JSON
    # inline, bytes or larger JSON as an artifact (``result_kind`` says which)
    result_kind: Literal["json", "bytes"] | None = None
    result: JsonValue = None
    result_ref: ArtifactRef | None = None


class ObservationProjected(EventData):
    EVENT_TYPE = "observation.projected"
    call: str
    tool: str
    text: str
    source: Literal["finished", "rebuilt", "denied", "discarded"] = "finished"


# --- context, verification, budget, bindings, repairs ---------------------------------


class ContextCompacted(EventData):
    EVENT_TYPE = "context.compacted"
    from_seq: int = Field(ge=1)
    to_seq: int = Field(ge=1)
    summary: str
    method: Literal["builtin", "command"] = "builtin"
    artifact: ArtifactRef | None = None

    @model_validator(mode="after")
    def _range(self) -> ContextCompacted:
        if self.from_seq > self.to_seq:
            raise ValueError(f"from_seq {self.from_seq} is after to_seq {self.to_seq}")
        return self


class VerificationStarted(EventData):
    EVENT_TYPE = "verification.started"
    check: str
    call: str | None = None


class VerificationFinished(EventData):
    EVENT_TYPE = "verification.finished"
    check: str
    ok: bool
    call: str | None = None
    output: ArtifactRef | None = None
    duration_ms: int = Field(default=0, ge=0)


class BudgetExhausted(EventData):
    EVENT_TYPE = "budget.exhausted"
    budget: str = Field(pattern=r"^[a-z][a-z_]{0,40}$")  # a [budget] key; agent_ + an agent's
    limit: int | float = Field(ge=0)  # a cost budget's are dollars
    used: int | float = Field(ge=0)


class BindingObserved(EventData):
    EVENT_TYPE = "binding.observed"
    hashes: dict[str, FileHash]


class LogRepaired(EventData):
    EVENT_TYPE = "log.repaired"
    dropped_bytes: int = Field(ge=0)
    at_offset: int = Field(ge=0)
    last_good_seq: int = Field(ge=0)
    reason: str = ""


# terminated: its session ended long enough ago; unreferenced: no event named it;
# beyond-keep: older than the newest keep_artifacts; chunk: a part of a removed context
GcRule = Literal["terminated", "unreferenced", "beyond-keep", "chunk"]


class CollectedArtifact(Record):
    """One artifact a gc removed. ``artifact`` (not ``ref``): it no longer resolves, so
    nothing that gathers a log's references (fork, export, fsck) takes it for one."""

    artifact: Ref
    size: int = Field(ge=0)
    rule: GcRule


class GcCollected(EventData):
    """What a gc removed from this session's store ([retention], ``sessionctl gc``).
    Written before the files go, so a crash part way leaves them recorded and
    present, never gone without a record."""

    EVENT_TYPE = "gc.collected"
    artifacts: tuple[CollectedArtifact, ...] = ()
    snapshots: tuple[int, ...] = ()  # seqs of the snapshot files removed
    bytes: int = Field(default=0, ge=0)
    trigger: Literal["sessionctl", "interval"] = "sessionctl"
    # who asked, from the peer's credentials (sessionctl gc); none for the interval
    uid: int | None = None
    user: str = ""


PAYLOADS: tuple[type[EventData], ...] = (
    SessionCreated,
    SessionForked,
    SessionMerged,
    SessionMigrated,
    SessionImported,
    LifecycleChanged,
    WakeRequested,
    GateEvaluated,
    RecoveryResolved,
    RunStarted,
    RunFinished,
    MessageReceived,
    ModelRequested,
    ModelResponded,
    ToolIntent,
    PolicyDecided,
    ApprovalRequested,
    ApprovalGranted,
    ApprovalDenied,
    ToolStarted,
    ToolFinished,
    ObservationProjected,
    ContextCompacted,
    VerificationStarted,
    VerificationFinished,
    BudgetExhausted,
    BindingObserved,
    LogRepaired,
    SpecApplied,
    GcCollected,
    MigrationStarted,
    MigrationAborted,
    MigrationArriving,
    MigrationFinished,
    MigrationDiscarded,
)

PAYLOAD_BY_TYPE: dict[str, type[EventData]] = {p.EVENT_TYPE: p for p in PAYLOADS}


def dump_data(data: EventData) -> dict[str, JsonValue]:
    """The JSON form of a payload as it is written (aliases, no ``None``-stripping)."""
    return data.model_dump(mode="json", by_alias=True)
