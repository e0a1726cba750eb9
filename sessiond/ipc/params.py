"""The request schema of the wire: one frozen, strict params model per method.

Every field a client may send is declared here, with its bounds; anything else is
refused (``extra="forbid"``) before a syscall sees it. The models stand apart from
the dispatch so the schema reads as one page (docs/rpc.md, "Methods", documents it) and the
fuzzer in tests/faults/ can walk it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sessiond.errors import InvalidInput
from sessiond.log.bundle import DEFAULT_LIMIT as BUNDLE_LIMIT
from sessiond.log.event_data import ErrorClass
from sessiond.log.projections import PAGE_MAX
from sessiond.logquery import MAX_GREP
from sessiond.wire import Params as WireParams


class Params(BaseModel):
    """The base of every request's params: frozen, no unknown fields, no coercion."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class NoParams(Params):
    pass


class PsParams(Params):
    """``ps``: filters, order (sessiond.listing); ``footer`` answers ``{"rows",
    "hidden", "known"}`` (how many terminated rows hid, every name it knows) instead
    of the rows alone."""

    state: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=64)
    agent: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=64)
    label: list[Annotated[str, Field(max_length=400)]] = Field(default_factory=list, max_length=64)
    all: bool = False
    sort: str = Field(default="agent", max_length=32)
    footer: bool = False


class NameParams(Params):
    name: str


class ConsoleParams(Params):
    """``web.approvals``: one session's (carried to its owner), or the node's all."""

    name: str | None = None


class GcParams(Params):
    dry_run: bool = False


class CreateParams(Params):
    spec: str
    base: str
    source: str = "spec"


class LogParams(Params):
    name: str | None = None  # None: every session (only with follow)
    # An integer is a seq (as before); text is a time, "10m" or RFC 3339 (sessiond.logquery).
    since: Annotated[int, Field(ge=1)] | Annotated[str, Field(max_length=64)] = 1
    until: str | None = Field(default=None, max_length=64)  # a time (sessiond.logquery)
    types: list[str] = Field(default_factory=list)
    limit: int = Field(default=0, ge=0)  # the last N matching (sessionctl -n N)
    first: int = Field(default=0, ge=0)  # the first N matching: a page (sessionctl mcp)
    grep: str | None = Field(default=None, max_length=MAX_GREP)
    # Per session, only events after this seq: how a follower resumes (fell_behind).
    after: dict[str, Annotated[int, Field(ge=0)]] | None = Field(default=None, max_length=100_000)
    follow: bool = False


class ReplayParams(Params):
    name: str
    upto: int | None = Field(default=None, ge=1)
    view: str = "state"
    # A page of the messages view: after `cursor` (a page's next_cursor), `limit` items.
    cursor: int | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, ge=1, le=PAGE_MAX)


class ForkParams(Params):
    name: str
    new: str
    at: int | None = Field(default=None, ge=1)
    with_triggers: bool = False


class MergeParams(Params):
    child: str
    into: str | None = None
    summary: str | None = None


class SendParams(Params):
    to: str
    text: str = Field(max_length=256 * 1024)
    sender: str = "sessionctl"


class MigrateParams(Params):
    name: str
    profile: str | None = None
    to: str | None = None
    node: str | None = None  # a cluster: hand the session to this node
    # a cluster: its node is down and its workspace is on ``node`` now (re-home it)
    force: bool = False


class CompactParams(Params):
    name: str
    keep: int = Field(default=4, ge=0)


class ApproveParams(Params):
    name: str
    call: str | None = None
    by: str = ""
    reason: str = ""


class ResolveParams(Params):
    name: str
    option: Literal["rerun", "discard", "accept"]
    by: str = ""


class OutputParams(Params):
    """``output``: a run's stdout or stderr (sessiond.syscalls.output)."""

    name: str
    run: str | None = None
    stream: Literal["stdout", "stderr"] = "stdout"
    offset: int = Field(default=0, ge=0)
    wait: float = Field(default=0.0, ge=0.0, le=30.0)
    after: str | None = None


class ApplyParams(Params):
    name: str
    spec: str
    base: str
    source: str = "spec"
    by: str = ""


class TokenParams(Params):
    token: str
    session: str | None = None  # the SDK sends SESSIOND_SESSION: a token works for it only


class SdkContextParams(TokenParams):
    """``sdk.context``: the first call gives the context with the first page of its
    messages; each next page is asked for with the ``next_cursor`` of the one before."""

    cursor: int | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, ge=1, le=PAGE_MAX)


# A step's place in its turn: the SDK's ordinal (call order), or a key the program
# names (steps started from threads); bounded so a slot stays a short string.
StepKey = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/-]+$")]


class SdkStepParams(TokenParams):
    """The start of a durable step: answered replayed, run, ask, denied, stop or diverged."""

    kind: Literal["tool", "model"] = "tool"
    name: str = Field(min_length=1, max_length=200)
    ordinal: int = Field(ge=1, le=10_000_000)
    key: StepKey | None = None
    args: dict[str, Any] = Field(default_factory=dict)  # a tool's arguments
    request: Any = None  # a model step's request (stored as its context artifact)
    writes: list[str] = Field(default_factory=list, max_length=1000)
    risk: dict[str, str] = Field(default_factory=dict)
    strict: bool = False  # a model step: a changed request digest is a divergence
    # a nested step: the call id of the step whose fn takes it (under way in this run)
    parent: str | None = Field(default=None, min_length=1, max_length=300)
    # the key is an id (a tool call's id in a recorded model response, a run's id):
    # steps that differ only by such keys are distinct
    key_is_id: bool = False
    # the call whose sdk.step_done was sent just before, not waited for: this step
    # starts only if that one finished ok
    after: str | None = Field(default=None, min_length=1, max_length=300)

    @field_validator("writes")
    @classmethod
    def _in_workspace(cls, values: list[str]) -> list[str]:
        # The daemon reads (as root, often) what a step writes, before and after
        # it, to hash and diff it: a path out of the workspace is not the run's.
        for value in values:
            parts = value.split("/")
            if not value or value.startswith("/") or "\0" in value or ".." in parts:
                raise ValueError(
                    f"writes: {value!r} is not a path inside the workspace: name it "
                    "relative to the workspace, without '..'"
                )
        return values


class SdkStepDoneParams(TokenParams):
    """The end of a step's work: its result (JSON, or bytes as base64) or its error."""

    call: str = Field(min_length=1, max_length=300)
    # stopped: a step inside this one stopped the run (an approval, a stop, a
    # divergence): nothing of its own failed, it is entered again in a later run
    status: Literal["ok", "error", "stopped"] = "ok"
    result: Any = None
    result_b64: str | None = None  # a bytes result
    error: str = Field(default="", max_length=64 * 1024)
    error_class: ErrorClass | None = None
    observation: str = Field(default="", max_length=64 * 1024)
    output: str = ""
    tokens_in: int = Field(default=0, ge=0)
    tokens_out: int = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)  # a model step's
    text: str = ""  # a model step: what the messages view shows of the response
    duration_ms: int = Field(default=0, ge=0)


class SdkVerifyParams(TokenParams):
    check: str
    ok: bool
    output: str = ""


class SdkSendParams(TokenParams):
    to: str
    text: str = Field(max_length=256 * 1024)
    ordinal: int = Field(ge=1, le=10_000_000)  # a send is a step: never sent twice
    key: StepKey | None = None
    parent: str | None = Field(default=None, min_length=1, max_length=300)


class SdkEndParams(TokenParams):
    intent: Literal["sleep", "complete"]
    summary: str = ""


class ExportParams(Params):
    name: str
    path: str | None = None  # refused: the bundle comes back as the answer's body


class HandoverOffer(Params):
    """What a source daemon says of a hand-over it sends (``migrate --to``)."""

    id: str = Field(pattern="^[0-9a-f]{32}$")
    source: str = Field(min_length=1, max_length=4096)  # its socket, asked if need be


class HandoverParams(Params):
    """``handover.finish``, ``.abort`` and ``.status``: daemon to daemon."""

    name: str
    handover: str = Field(pattern="^[0-9a-f]{32}$")


class ImportParams(Params):
    name: str | None = None
    handover: HandoverOffer | None = None  # a migrate --to: the copy arrives held
    bytes: int | None = Field(default=None, ge=0, le=BUNDLE_LIMIT)  # the body's size
    sha256: str | None = Field(default=None, pattern="^[0-9a-f]{64}$")
    path: str | None = None  # refused: the client sends the bundle's bytes
    source: str | None = Field(default=None, max_length=4096)  # its file, for messages


P = TypeVar("P", bound=Params)


def parse(model: type[P], params: WireParams) -> P:
    """Validate a request's params, or refuse them naming each bad field (invalid_input)."""
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'params'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInput(f"bad parameters: {problems}") from None
