"""What the program endpoint answers a run's program: the ``sdk.*`` replies.

The daemon builds them (runs/steps.py, runs/sends.py, runs/sdk_calls.py) and the
clients read them (sessiond.sdk, sessiond.integrations), so the shapes are written
down once, here on the ground floor. On the wire they are plain JSON objects, as
they always were; these ``TypedDict``s only name what they hold.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict

import orjson

from sessiond.wire import Connection, RemoteError, result_of

# sdk.step's answer (docs/sdk.md): replayed, run, ask, denied, stop or diverged
AnswerStatus = Literal["replayed", "run", "ask", "denied", "stop", "diverged"]


class StepPlace(TypedDict):
    """A step's place as the SDK gives it: its ordinal, inside its parent's step (a
    nested step: the parent's call id)."""

    ordinal: int
    parent: NotRequired[str]


class StepReply(TypedDict):
    """What to do with a step, as the daemon decides it (the answer but ``stop``)."""

    status: AnswerStatus
    key: NotRequired[str]  # the step's stable key (sdk.step)
    call: NotRequired[str]
    rule: NotRequired[str]
    reason: NotRequired[str]
    # a replayed step's result: the JSON its program returned (Any: whatever that was),
    # or its bytes in base64
    result: NotRequired[Any]
    result_b64: NotRequired[str]
    # ``run`` of a tool step whose end the daemon cannot refuse (no ``redact``
    # pattern, no secret but the run's token): the SDK may send it without waiting
    pipeline: NotRequired[bool]


class StepAnswer(StepReply):
    """``sdk.step`` and ``sdk.send``. (``sdk.send``'s ``run`` carries what the send
    syscall answered too: the receiving session, its seq, whether it woke.)"""

    stop: bool  # the daemon wants the program to stop at its next stable point


class Ack(TypedDict):
    """``sdk.step_done``, ``sdk.verify``, ``sdk.end``."""

    stop: bool


class TranscriptItem(TypedDict):
    """An item of the messages view (log/projections.py) before it is shown: the
    state keeps the newest, and a run's unread mail comes as these."""

    seq: int
    role: str
    kind: str
    text: str
    sender: NotRequired[str]
    tool: NotRequired[str]
    call: NotRequired[str]
    model: NotRequired[str]
    artifacts: NotRequired[list[ArtifactJson]]
    range: NotRequired[list[int]]  # a summary's [from_seq, to_seq]
    compacted_at: NotRequired[int]


class ArtifactJson(TypedDict):
    """An artifact reference (log/event_data.py's ``ArtifactRef``) as JSON."""

    ref: str
    name: str
    size: int
    media_type: str


class Message(TypedDict):
    """An item as the messages view shows it (log/projections.py ``message``)."""

    role: str
    kind: str
    content: str
    seq: int
    sender: NotRequired[str]
    tool: NotRequired[str]
    model: NotRequired[str]
    range: NotRequired[list[int]]


class TurnContext(TypedDict):
    """The session as the open turn began, but its messages (``sdk.context``)."""

    session: str
    goal: str
    state: str
    seq: int
    mailbox: list[TranscriptItem]  # the unread messages
    # the turn's wake cause and the session's approvals: the fold's records as they
    # are (log/records.py: RunWake, ApprovalRecord), read by key
    wakes: Sequence[Mapping[str, Any]]
    approvals: Sequence[Mapping[str, Any]]  # (as wakes: the fold's records, a floor above)
    profile: str
    turn: NotRequired[int]


class ContextAnswer(TypedDict):
    """``sdk.context``: the first page carries the context (``TurnContext``), each next
    page (asked with the page's ``next_cursor``) only ``run``, ``turn`` and its messages."""

    stop: bool
    run: str
    session: NotRequired[str]
    goal: NotRequired[str]
    state: NotRequired[str]
    seq: NotRequired[int]
    mailbox: NotRequired[list[TranscriptItem]]
    # the fold's records, as in TurnContext (log/records.py), read by key
    wakes: NotRequired[Sequence[Mapping[str, Any]]]
    approvals: NotRequired[Sequence[Mapping[str, Any]]]  # (as wakes)
    profile: NotRequired[str]
    turn: NotRequired[int | None]
    messages: list[Message]
    # the next page's cursor (None: this was the last); the SDK takes it off as it
    # reads the pages
    next_cursor: NotRequired[int | None]


class Fence(NamedTuple):
    """A run's fencing token: its session and the ownership epoch it runs under
    (``SESSIOND_EPOCH``). A cluster bumps the epoch whenever a node claims the
    session, so a run of a later owner carries a higher one: a system outside the
    database that keeps the highest epoch it has seen per session and refuses a
    lower one refuses a stale writer. On one machine the epoch is 0.
    ``str(fence)`` is ``session:epoch`` (a session name has no colon)."""

    session: str
    epoch: int

    def __str__(self) -> str:
        return f"{self.session}:{self.epoch}"


class StepPipe:
    """A run's connection, with the end of at most one step in flight (sessiond.sdk).

    A step's ``sdk.step_done`` is sent and not waited for (``end``) where the
    daemon said it cannot refuse it (the ``run`` answer's ``pipeline``: no
    ``redact`` pattern, no secret but the run's token, which is not in the
    result); the next ``sdk.step`` follows it on the connection, naming it in
    ``after`` (a start behind an end the daemon refused is refused too), and
    both are answered after one round trip and one fsync. Any other request
    waits for the end's answer first. Answers come in order; ``stop`` is true
    once one said the daemon wants the program to stop."""

    def __init__(self, conn: Connection, token: str, session: str) -> None:
        self.conn = conn
        self.params = {"token": token, "session": session}
        self.owed: str | None = None  # the call whose end is sent and not yet answered
        self.stop = False

    def _result(self) -> Any:
        result = result_of(self.conn.receive())
        if isinstance(result, dict) and result.get("stop"):
            self.stop = True
        return result

    def settle(self) -> None:
        """Read the answer to the step's end in flight (its refusal raised)."""
        if self.owed is not None:
            self.owed = None
            self._result()

    # a method's params and its answer: each sdk.* method's own JSON (ipc/params.py)
    def call(self, method: str, params: Mapping[str, Any]) -> Any:
        owed = self.owed
        if owed is None or method != "sdk.step":
            self.settle()
            self.conn.send(method, {**self.params, **params})
            return self._result()
        self.owed = None
        self.conn.send(method, {**self.params, **params, "after": owed})
        try:
            self._result()
        except RemoteError:
            with contextlib.suppress(RemoteError):
                self.conn.receive()  # the start behind it, refused as well
            raise
        return self._result()

    # sdk.step_done's params (ipc/params.py: SdkStepDoneParams), the result any JSON
    def end(self, pipeline: bool, params: Mapping[str, Any]) -> None:
        """A step's ``sdk.step_done``: sent without waiting where ``pipeline``."""
        b64 = params["result_b64"]
        # the bytes the daemon looks for the token in (the token needs no JSON escape)
        raw = orjson.dumps(params["result"]) if b64 is None else base64.b64decode(b64)
        if not pipeline or self.params["token"].encode() in raw:
            self.call("sdk.step_done", params)
            return
        self.settle()
        self.conn.send("sdk.step_done", {**self.params, **params})
        self.owed = str(params["call"])
