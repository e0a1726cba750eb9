"""What the syscalls answer: one ``TypedDict`` per reply, the JSON shape unchanged.

On the ground floor, so that the daemon (which builds the replies) and its
clients (``sessionctl``, the web console, which read them) name the same types
without climbing a floor. TypedDicts, not pydantic models: a reply is a plain
dict at run time, orjson encodes it as it is, nothing is validated per call (the
CLI's start-up and the hot path pay nothing), and ``sessionctl`` never imports
pydantic. docs/rpc.md describes the same shapes for people.

A key marked ``NotRequired`` is one some answers leave out (a session whose log
cannot be read has no ``outcome``; ``node`` only on a cluster node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, final

# Any JSON value, and a JSON object whose keys are not this floor's to know: a
# request's params (each method's own, checked by the daemon's models in
# ipc/params.py), a tool's arguments as the program gave them, OTLP JSON. Readers
# check what they take from it (pydantic's JsonValue is the same type; the clients
# do not import pydantic).
JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
JsonObject = dict[str, JsonValue]

# A record the log's fold keeps (a run, a wake, a gate verdict, an approval, a call,
# a hand-over), passed on in a reply as it is. Its shape is typed where it is folded
# (sessiond/log/state.py), a floor above this one; read-only here.
Folded = Mapping[str, Any]


class Who(TypedDict):
    """Who took an operator action (approve, deny, resolve, apply, gc, a hand-over's
    accept): the uid and user name proven by the peer, and the channel it came by
    (``cli``, ``web``, ``link``)."""

    uid: int | None
    user: str
    channel: Literal["cli", "web", "link"]


# **-spread into an event model's keywords: the models check them
def who_fields(who: Who | None) -> Mapping[str, Any]:
    """``who`` as the keyword arguments of an event that records it (uid, user,
    channel), or none: an act nobody is named for keeps the event's defaults."""
    return who if who is not None else {}


# --- inspection ----------------------------------------------------------------------


class Ping(TypedDict):
    version: str
    protocol: int
    pid: int
    uptime_s: float
    sessions: int
    state_dir: str


class PsRow(TypedDict):
    """A ``ps`` row (and the start of a console row)."""

    name: str
    state: str
    reason: str | None
    agent: str
    priority: int
    runs: int
    last_active: str | None
    next_wake: str | None
    pid: int | None
    parent: str | None
    outcome: str | None
    labels: dict[str, str]
    node: NotRequired[str | None]  # on a cluster node: which node runs it (None: none)
    boundary: NotRequired[str]  # "sandbox" or "off"
    model_ahead: NotRequired[int]  # a call of it waits for the model: how many ahead


class NodeRow(TypedDict):
    """A cluster node, as ``nodes`` lists it."""

    name: str
    incarnation: int
    state: str  # up, lapsed, stopped
    alive: bool
    lease_age_s: float
    lease_left_s: float
    started_at: str
    labels: dict[str, str]
    sessions: int
    self: bool  # the node that answered
    # its load as it last said it (cluster/balance.py): programs running, sessions
    # waiting ready for a slot, its slots; and the sessions it should hold
    running: int
    ready: int
    max_running: int
    share: float


class Unplaced(TypedDict):
    """A session no live node runs (cluster/placement.py makes its ``ps`` row)."""

    name: str
    node: str | None  # the node it waits for, if one
    reason: str


class NodeMove(TypedDict):
    """``migrate --node``: where the session went; with ``--force``, where it was."""

    session: str
    node: str
    rehomed: NotRequired[bool]
    was: NotRequired[str | None]


class Draining(TypedDict):
    """``drain``: the node, its sessions, and those that stay (pinned, or homed there)."""

    node: str
    state: Literal["draining"]
    sessions: int
    staying: int


class Synced(TypedDict):
    """The spec folder read again: sessions made, specs changed, and what was refused."""

    created: list[str]
    updated: list[str]
    unchanged: int
    errors: list[str]


class Reloaded(Synced):
    """``reload``: the specs synced, and what takes effect only at the next start."""

    notes: list[str]


class PsPage(TypedDict):
    """``ps`` with ``footer``: the rows, how many terminated ones hid, every name seen."""

    rows: list[PsRow]
    hidden: int
    known: list[str]


class TurnView(TypedDict):
    """The open turn as ``show`` gives it."""

    n: int
    runs: int
    steps: dict[str, int]  # status -> how many steps
    wakes: list[str | None]  # each wake's trigger
    divergence: Folded | None


class BudgetUsed(TypedDict):
    runs_today: int
    seconds: int
    tokens: int
    cost_usd: float
    tool_calls_this_run: int


class Boundary(TypedDict):
    """How ``show``'s session is confined (docs/design.md section 9)."""

    sandbox: str
    network: str | None
    uid: int | None


class SpecFacts(TypedDict):
    """What ``show`` says of a session from its spec alone."""

    name: str
    goal: str
    description: str
    agent: str
    priority: int
    labels: dict[str, str]
    program: list[str] | None
    kind: str | None
    triggers: list[str]
    next_wake: str | None
    pid: int | None


class SessionDetail(SpecFacts):
    """Everything ``sessionctl show`` prints about one session: the answer of show,
    create, activate, suspend, resume, interrupt, cancel, approve, deny, resolve,
    apply, fork, import, compact and migrate. A session whose log cannot be read has
    only the keys up to ``seq`` (its state "blocked", its reason why)."""

    state: str
    reason: str | None
    seq: int | None
    held: NotRequired[bool]  # blocked in memory, not yet recorded (a full disk)
    model_ahead: NotRequired[int]  # a call of it waits for the model: how many ahead
    outcome: NotRequired[str | None]
    until: NotRequired[str | None]
    created_at: NotRequired[str | None]
    last_active: NotRequired[str | None]
    runs: NotRequired[int]
    turns: NotRequired[int]
    turn: NotRequired[TurnView | None]
    model_replies: NotRequired[int]
    profile: NotRequired[str]
    current_run: NotRequired[Folded | None]
    last_run: NotRequired[Folded | None]
    pending_wakes: NotRequired[int]
    last_wake: NotRequired[Folded | None]
    last_gate: NotRequired[Folded | None]
    pending_approvals: NotRequired[list[Folded]]
    answered_approvals: NotRequired[list[Folded]]
    last_recovery: NotRequired[Folded | None]
    grants: NotRequired[list[str]]
    tools_in_flight: NotRequired[list[Folded]]
    last_observation: NotRequired[Folded | None]
    budget_used: NotRequired[BudgetUsed]
    budget_exhausted: NotRequired[Folded | None]
    parent: NotRequired[str | None]
    fork_seq: NotRequired[int | None]
    children: NotRequired[list[str]]
    merged: NotRequired[list[str]]
    imported_from: NotRequired[str | None]
    migrated_to: NotRequired[str | None]
    handover: NotRequired[Folded | None]
    mailbox: NotRequired[int]
    compactions: NotRequired[int]
    repairs: NotRequired[int]
    boundary: NotRequired[Boundary]  # show only
    handover_finished: NotRequired[bool]  # migrate --to: the target heard the commit
    handed_to: NotRequired[str]  # create on a cluster node: the node it went to
    node: NotRequired[str | None]  # the console's, on a cluster: the node that runs it


class WaitingSession(PsRow):
    """``show`` on a cluster node of a session no live node runs: its ``ps`` row and
    what it waits for."""

    program: None
    triggers: list[str]
    seq: None


class GateCheck(TypedDict):
    name: str
    ok: bool
    detail: str


class CauseView(TypedDict):
    """One reason a session may not go on, with the answers that change it."""

    kind: str
    detail: str
    options: list[str]
    answers: list[str]
    todo: str


class GateReport(TypedDict):
    """``gate``: the resume gate evaluated now, as a dry run."""

    session: str
    ok: bool
    outcome: str
    checks: list[GateCheck]
    options: list[str]
    answers: list[str]
    causes: list[CauseView]
    actions: NotRequired[dict[str, str]]  # call -> what the daemon does for it first
    dry_run: bool


class MessagesPage(TypedDict):
    """``replay --view messages``: one page of the view."""

    # each item as the view shows it: role, kind, content, seq, and its kind's own keys
    messages: list[JsonObject]
    next_cursor: int | None
    upto: int


# --- lineage, bundles, messages ------------------------------------------------------


class Merged(TypedDict):
    parent: SessionDetail
    child: SessionDetail


class Sent(TypedDict):
    """``send``: the message's seq in the session's log and whether it woke it; on a
    cluster, one left for the node that owns the session has neither yet."""

    session: str
    seq: int | None
    woke: bool | None
    node: NotRequired[str | None]  # the node it was left for


class Exported(TypedDict):
    path: str
    events: int
    session: str


class ExportedBundle(TypedDict):
    """``export`` over the socket: the bundle follows the answer on the connection."""

    path: str | None  # None as sent; sessionctl fills in the file it wrote
    events: int
    session: str
    bytes: int
    sha256: str


# --- the hand-over between daemons (migrate --to) ------------------------------------


class HandoverAnswer(TypedDict):
    """``handover.status``, ``.finish``, ``.abort``: how a hand-over stands or ended
    (committed, aborted, pending, unknown; finished, discarded)."""

    result: str
    session: NotRequired[SessionDetail | str]  # finish: its detail; abort: its name


class Arrived(TypedDict):
    """The first phase at the target: the copy held ``arriving``."""

    session: str
    state: str
    handover: str


class Discarded(TypedDict):
    """``resolve --discard`` of an arriving copy: dropped, and where it is kept."""

    name: str
    state: Literal["discarded"]
    reason: str


# --- runs' output, retention, observation, the console's login ------------------------


class RunFacts(TypedDict):
    """How the run whose output is read stands."""

    running: bool
    status: str  # running, or how it finished
    exit_code: NotRequired[int | None]
    cut: NotRequired[str]  # why its output was cut short ("": it was not)


class Output(TypedDict):
    """``output``: a slice of a run's stdout or stderr, and how the run stands."""

    session: str
    run: str | None
    stream: str
    running: bool
    data: str
    offset: int
    next_offset: int
    more: NotRequired[bool]
    status: NotRequired[str]  # running, or how it finished
    exit_code: NotRequired[int | None]
    cut: NotRequired[str]  # why its output was cut short ("": it was not)


class CollectedArtifactView(TypedDict):
    ref: str
    size: int
    rule: str


class GcSession(TypedDict):
    name: str
    artifacts: list[CollectedArtifactView]
    snapshots: list[int]
    bytes: int


class GcReport(TypedDict):
    dry_run: bool
    rules: list[str]
    sessions: list[GcSession]
    artifacts: int
    snapshots: int
    bytes: int
    errors: list[str]
    events_read: int


class TargetStatus(TypedDict):
    """A notification target's state, for ``sessionctl notify``."""

    target: str
    url: str
    events: list[str]
    state: str  # ok, failing, stopped
    pending: int
    delivered: int
    failures: int
    failed_total: int
    last_error: str | None
    last_error_at: str | None
    last_delivered_at: str | None
    next_try_at: str | None


class NotifyStatus(TypedDict):
    targets: list[TargetStatus]


class SpecText(TypedDict):
    """``cat``: a session's stored spec."""

    name: str
    spec: str


class TraceExport(TypedDict):
    spans: int
    otlp: JsonObject  # OTLP JSON (opentelemetry's protobuf as a dict)


class WebLogin(TypedDict):
    user: str
    url: str
    console: str


class ConsoleRow(PsRow):
    """A console table row: a ``ps`` row and what the console also shows."""

    runnable: bool
    pending_approvals: int
    actions: NotRequired[list[str]]  # the lifecycle buttons its state offers


class TablePage(TypedDict):
    """A page of the console's process table (filtered and cut on the server)."""

    rows: list[ConsoleRow]
    total: int
    page: int
    pages: int
    size: int
    sessions: int
    clustered: NotRequired[bool]  # the whole cluster's rows
    approvals: int  # the inbox's count


class ConsoleApproval(TypedDict):
    """An item of the console's inbox: one pending approval."""

    session: str
    agent: str
    call: str
    tool: str
    args: JsonObject  # the tool's arguments, as the program gave them
    args_json: str
    risk: Folded
    writes: list[str]
    rule: str
    requested_at: str | None
    expires_at: str | None
    seq: int | None
    node: NotRequired[str]


# --- the model gateway (``models``; /metrics reads the same view) ------------------


class LimitUse(TypedDict):
    """A limit of the gateway (a provider's, or ``provider/model``'s) and what it holds now."""

    key: str
    concurrency: int | None
    rpm: int | None
    tpm: int | None
    learned_concurrency: int | None  # after a 429: the calls at once it allows now
    in_flight: int
    requests_last_minute: int
    tokens_last_minute: int | None  # counted only where there is a tpm to keep
    paused_for: float
    calls: int
    throttles: int


class ProviderUse(LimitUse):
    """A ``[[model.provider]]`` beside what its limit holds, and its models' limits."""

    name: str
    kind: str
    base_url: str
    models: list[str]
    price_in: float | None
    price_out: float | None
    model_limits: list[LimitUse]


class QueuedCall(TypedDict):
    """A model call waiting for its slot."""

    session: str
    agent: str | None
    priority: int
    provider: str
    model: str
    waited: float
    ahead: int  # calls before it for the same provider


class WaitCounts(TypedDict):
    """How long a provider's calls waited: counts per bucket of WAIT_BUCKETS, and the sum."""

    buckets: list[int]
    sum: float


class SchedulerSnapshot(TypedDict):
    """The gateway's scheduler: its limits, what they hold now, the queue in order."""

    limits: list[LimitUse]
    queue: list[QueuedCall]
    served: int
    throttled: int
    waits: dict[str, WaitCounts]  # per provider (WAIT_BUCKETS)


class ModelsView(TypedDict):
    """The gateway's providers and queue (no ``waits`` where the daemon runs none)."""

    providers: list[ProviderUse]
    queue: list[QueuedCall]
    served: int
    throttled: int
    waits: NotRequired[dict[str, WaitCounts]]  # per provider, for /metrics
    wait_buckets: NotRequired[list[float]]


@final  # so that a row's keys tell the two apart (ctl/models.py)
class SessionSpent(TypedDict):
    """What a session's model calls spent today, beside its budget (0: none)."""

    session: str
    agent: str | None
    tokens: int
    cost_usd: float
    tokens_per_day: int
    cost_usd_per_day: float


@final
class AgentSpent(TypedDict):
    """What an agent's sessions spent today, beside the agent's budget (0: none)."""

    agent: str
    sessions: int
    tokens: int
    cost_usd: float
    tokens_per_day: int
    cost_usd_per_day: float


class ModelsReply(ModelsView):
    """``models``: the gateway's view, and today's (a UTC day) spend."""

    day: str
    gateway: bool  # False: this daemon runs no gateway
    sessions: list[SessionSpent]
    agents: list[AgentSpent]
