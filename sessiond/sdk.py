"""The session SDK: durable steps for an agent program (docs/design.md section 8).

::

    from sessiond.sdk import connect

    with connect() as run:                      # also: async with connect_async() as run
        ctx = run.context()                     # the session as this turn began
        plan = run.model_call("claude-x", request, lambda: client.create(**request))
        run.step("charge_card", lambda: charge(order, idempotency_key=run.key()),
                 args={"order": order})         # external-write / unsafe / never-rerun
        run.step("edit_file", lambda: edit("docs/api.md"), args={"path": "docs/api.md"},
                 writes=["docs/api.md"], side_effect="workspace-write",
                 idempotency="conditional", resume="rerun-after-check")
        run.send("other-session", "docs are updated")
        run.complete(summary="done")            # or run.sleep()

A **turn** is the work one wake starts; it may take several runs of the program
(after an approval, a crash, a stop, a retry), each from the top. Every step
(``run.step``, ``run.model_call``, ``run.send``) has its place in the turn: its
ordinal, given in call order at the call, or its group of keyed steps; a step
taken inside another step's ``fn`` has its place inside that step's. When a later
run reaches a step recorded as finished ``ok``, the recorded result is returned
and **the work is not done again**. A step is the same only in kind, name, args
digest and key: any difference at a recorded place is ``Diverged``, before the
work. ``context()`` and the wake cause are the same in every run of a turn.

- ``Denied``: the policy or a person said no (in every run of the turn).
- ``ApprovalPending``: a person must approve this step. A program that does not
  catch it simply ends its run: the session waits ``blocked``; after
  ``sessionctl approve`` the next run replays the steps before and runs this one
  once.
- ``StopRequested``: the daemon asked the program to stop (interrupt, suspend,
  shutdown, a spent budget); this step did not start. ``Diverged``: the program
  asked for another step than the one recorded here; nothing ran and a person
  decides (``sessionctl resolve --accept | --discard``).

A step's ``fn`` takes no arguments; its result must be JSON-serialisable (or
bytes), returned in its JSON form (tuples become lists) on every run. Steps
started from threads pass ``key=`` (a name unique in the turn; join the threads
before the next unkeyed step). ``run.key()`` inside a step's ``fn`` is the step's
stable key for idempotency keys of your own.

It reads ``SESSIOND_SOCKET``, ``_SESSION``, ``_RUN``, ``_TURN``, ``_TOKEN``, ``_EPOCH`` (its
``run.fence()``, a token for writes outside the database). Stdlib and orjson: it starts fast.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from sessiond.sdkwire import ContextAnswer, Fence, StepAnswer, StepPipe, StepPlace
from sessiond.wire import Connection, RemoteError


class SdkError(Exception):
    """Base of what the SDK raises on purpose."""


class Denied(SdkError):
    """The policy (or a person) denied the step; its work did not run."""


class StopRun(SdkError):
    """Base of the answers that end this run at a stable point (the turn goes on)."""


class ApprovalPending(StopRun):
    """The step needs a person's approval: end the run; it runs again once answered."""


class StopRequested(StopRun):
    """The daemon asked the program to stop; this is a stable point to exit at."""


class Diverged(StopRun):
    """Another step is recorded at this place in the turn: nothing ran, a person decides."""


class StepFailed(SdkError):
    """A step's result could not be recorded (not JSON, or it holds a redacted secret)."""


_current_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "sessiond_step_key", default=None
)


class _Frame:
    """Where the steps taken now go: the run itself, or the ``fn`` of a step under way
    (its steps are nested in it, their ordinals counted from 1 within it)."""

    __slots__ = ("call", "ordinal", "took")

    def __init__(self, call: str | None) -> None:
        self.call = call
        self.ordinal = 0
        self.took = False


_frame: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar(
    "sessiond_step_frame", default=None
)


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SdkError(
            f"{name} is not set: sessiond.sdk runs inside a session program started by the "
            'daemon (a spec with [run] kind = "sdk")'
        )
    return value


def _to_json(value: Any) -> tuple[Any, str | None]:
    """A result in its wire form: (JSON value, None) or (None, base64 of bytes)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return None, base64.b64encode(bytes(value)).decode()
    dump = getattr(value, "model_dump", None)  # a pydantic model (a provider's response)
    if callable(dump):
        value = dump(mode="json")
    try:
        return orjson.loads(orjson.dumps(value)), None
    except TypeError as exc:
        raise StepFailed(
            f"a step's result must be JSON-serialisable or bytes ({exc}); return plain data "
            "(dicts, lists, strings, numbers) so every run of the turn gets it back"
        ) from None


def _from_answer(answer: StepAnswer) -> Any:
    if answer.get("result_b64") is not None:
        return base64.b64decode(answer["result_b64"])
    return answer.get("result")


def _usage(response: Any) -> tuple[int, int]:
    """Tokens from the common provider shapes: OpenAI-style and Anthropic-style usage."""
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    tin = usage.get("input_tokens", usage.get("prompt_tokens", 0))
    tout = usage.get("output_tokens", usage.get("completion_tokens", 0))
    return (tin if isinstance(tin, int) else 0), (tout if isinstance(tout, int) else 0)


def _text(response: Any) -> str:
    """What the messages view shows of a response, from the common provider shapes."""
    if not isinstance(response, dict):
        return response if isinstance(response, str) else ""
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        content = (choices[0].get("message") or {}).get("content")
        if isinstance(content, str):
            return content
    content = response.get("content")
    if isinstance(content, list):
        return "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    text = response.get("text", content)
    return text if isinstance(text, str) else ""


def _observation(name: str, result: Any, observe: Callable[[Any], str] | None) -> str:
    """What the messages view (the model's next context) says of a finished step."""
    if observe is not None:
        return observe(result)[:60_000]
    if result is None:
        return f"{name} done"
    if isinstance(result, bytes):
        return f"{name} done: {len(result)} bytes"
    shown = result if isinstance(result, str) else orjson.dumps(result).decode()
    return f"{name} done: {shown[:200]}" + ("…" if len(shown) > 200 else "")


class Run:
    """A run of a session program, talking to the daemon."""

    def __init__(self, conn: Connection, token: str, session: str, run_id: str) -> None:
        self._pipe = StepPipe(conn, token, session)  # (sdkwire: a step's end in flight)
        self._token = token
        self.session = session
        self.run_id = run_id
        self.turn = int(os.environ.get("SESSIOND_TURN") or 0)
        self.fence = lambda: Fence(session, int(_env("SESSIOND_EPOCH")))  # docs/sdk.md
        # One request at a time on the connection, whatever thread calls; ordinals
        # are given under their own lock, at the call, in call order.
        self._wire = threading.Lock()
        self._count = threading.Lock()
        self._root = _Frame(None)

    @property
    def stop_requested(self) -> bool:  # an answer said so, or SIGTERM came
        return self._pipe.stop

    def _call(self, method: str, **params: Any) -> Any:
        with self._wire:
            return self._pipe.call(method, params)

    def _on_sigterm(self, *_: Any) -> None:
        self._pipe.stop = True  # finish the current step, stop before the next

    def _place(self, key: str | None) -> StepPlace:
        """This step's place: its ordinal, and the step it is taken in (a step taken
        inside another step's ``fn``). A keyed step (from a thread) takes no ordinal
        of its own, so the order of threads cannot shift the ordinals of the steps
        after it."""
        frame = _frame.get() or self._root
        with self._count:
            frame.took = True
            if key is None:
                frame.ordinal += 1
            ordinal = frame.ordinal if key is None else frame.ordinal + 1
        return {"ordinal": ordinal, "parent": frame.call} if frame.call else {"ordinal": ordinal}

    def _end(self, call: str, exc: BaseException, frame: _Frame) -> None:
        """A step's ``fn`` raised. Where a step inside it stopped the run or failed (that
        one is judged on its own), it ends ``stopped``: a later run enters it again and
        replays the steps that finished inside it. Otherwise the step failed."""
        if frame.took and (isinstance(exc, StopRun) or hasattr(exc, "_sessiond_failed")):
            with contextlib.suppress(RemoteError):
                self._call("sdk.step_done", call=call, status="stopped")
                return
        self._call(
            "sdk.step_done", call=call, status="error", error=repr(exc)[:60_000],
            error_class="validation" if isinstance(exc, StepFailed) else "execution",
        )  # fmt: skip
        with contextlib.suppress(AttributeError, TypeError):  # a parent's step sees it
            exc._sessiond_failed = call  # type: ignore[attr-defined]

    @staticmethod
    def key() -> str:
        """Inside a step's ``fn``: its stable key, the same in every run of the turn."""
        key = _current_key.get()
        if key is None:
            raise SdkError("run.key() is only known inside a step's fn")
        return key

    def context(self) -> ContextAnswer:
        """The session as this turn began: state, messages view, wake cause, approvals,
        unread mail. The same in every run of the turn. The daemon sends the messages
        a page at a time (it builds them from the log); they are all here."""
        result: ContextAnswer = self._call("sdk.context")
        cursor = result.pop("next_cursor", None)
        while cursor is not None:
            page = self._call("sdk.context", cursor=cursor)
            result["messages"] += page["messages"]
            cursor = page["next_cursor"]
        return result

    # --- steps ---------------------------------------------------------------------

    def _begin(self, **params: Any) -> StepAnswer:
        answer: StepAnswer = self._call("sdk.step", **params)
        status = answer["status"]
        name = params["name"]
        if status == "denied":
            raise Denied(f"{name} was denied ({answer.get('rule', '')})")
        if status == "ask":
            raise ApprovalPending(
                f"{name} needs a person's approval (call {answer.get('call')}); this run ends "
                "here and the turn goes on once it is answered"
            )
        if status == "stop":
            raise StopRequested(f"{name} not started: {answer.get('reason') or answer.get('rule')}")
        if status == "diverged":
            raise Diverged(answer.get("rule", f"{name} diverged from the recorded turn"))
        return answer

    def step(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        # a tool's arguments as the program gives them: any JSON
        args: Mapping[str, Any] | None = None,
        side_effect: str = "external-write",
        idempotency: str = "unsafe",
        resume: str = "never-rerun",
        writes: list[str] | tuple[str, ...] = (),
        key: str | None = None,
        key_is_id: bool = False,
        observe: Callable[[Any], str] | None = None,
    ) -> Any:
        """Run ``fn()`` at most once for this place in the turn; return its result (the
        recorded one when a later run of the turn gets here). ``observe(result)`` is
        what the messages view says of it (default: the name and the result, short)."""
        place = self._place(key)
        risk = {"side_effect": side_effect, "idempotency": idempotency, "resume": resume}
        answer = self._begin(
            kind="tool", name=name, key=key, args=args or {}, writes=list(writes), risk=risk,
            key_is_id=key_is_id, **place,
        )  # fmt: skip
        if answer["status"] == "replayed":
            return _from_answer(answer)
        return self._work(answer, fn, name, observe)

    def _work(
        self,
        answer: StepAnswer,
        fn: Callable[[], Any],
        name: str,
        observe: Callable[[Any], str] | None,
    ) -> Any:
        call = answer["call"]
        started = time.monotonic()
        token = _current_key.set(answer.get("key"))
        frame = _Frame(call)
        inside = _frame.set(frame)
        try:
            result = fn()
            value, b64 = _to_json(result)
        except BaseException as exc:
            self._end(call, exc, frame)
            raise
        finally:
            _frame.reset(inside)
            _current_key.reset(token)
        took = int((time.monotonic() - started) * 1000)
        result = base64.b64decode(b64) if b64 is not None else value
        seen = _observation(name, result, observe)
        params = {"call": call, "status": "ok", "result": value, "result_b64": b64,
                  "duration_ms": took, "observation": seen}  # fmt: skip
        with self._wire:  # not waited for where the daemon said it cannot refuse it
            self._pipe.end(bool(answer.get("pipeline")), params)
        return result

    def model_call(
        self,
        model: str,
        request: Any,
        fn: Callable[[], Any],
        *,
        strict: bool = False,
        key: str | None = None,
        usage: Callable[[Any], tuple[int, int]] | None = None,
        text: Callable[[Any], str] | None = None,
        cost: Callable[[Any], float | None] | None = None,
    ) -> Any:
        """Send a model request at most once for this place in the turn: ``fn()`` makes
        it and returns the response; a later run of the turn gets the recorded response
        and no request is sent. The request is kept as the call's context artifact;
        tokens come from the response's ``usage`` (OpenAI or Anthropic shape) unless
        ``usage`` says. A request that differs from the recorded one (a timestamp) is
        recorded and answered from the log; with ``strict=True`` it is a divergence.
        ``cost`` gives what the response was reported to cost in US dollars (None:
        not known), recorded on ``model.responded``."""
        place = self._place(key)
        answer = self._begin(
            kind="model", name=model, key=key, request=request, strict=strict, **place
        )
        if answer["status"] == "replayed":
            return _from_answer(answer)
        call = answer["call"]
        started = time.monotonic()
        frame = _Frame(call)
        inside = _frame.set(frame)
        try:
            value, _ = _to_json(fn())
        except BaseException as exc:
            self._end(call, exc, frame)
            raise
        finally:
            _frame.reset(inside)
        tin, tout = (usage or _usage)(value)
        self._call(
            "sdk.step_done", call=call, status="ok", result=value, tokens_in=tin,
            tokens_out=tout, text=(text or _text)(value), cost_usd=cost(value) if cost else None,
            duration_ms=int((time.monotonic() - started) * 1000),
        )  # fmt: skip
        return value

    def send(self, to: str, text: str, *, key: str | None = None) -> None:
        """A message to another session: a step, so it is sent once per turn."""
        answer: StepAnswer = self._call("sdk.send", to=to, text=text, key=key, **self._place(key))
        if answer["status"] == "denied":
            raise Denied(f"send to {to} was denied ({answer.get('rule', '')})")
        if answer["status"] == "stop":
            raise StopRequested(f"send to {to} not done: {answer.get('reason', '')}")
        if answer["status"] == "diverged":
            raise Diverged(answer.get("rule", "send diverged from the recorded turn"))

    def verify(self, check: str, *, ok: bool, output: bytes | str = b"") -> None:
        text = output.decode(errors="replace") if isinstance(output, bytes) else output
        self._call("sdk.verify", check=check, ok=ok, output=text)

    def sleep(self) -> None:
        """End this turn: the session waits for its next wake once the program exits."""
        self._call("sdk.end", intent="sleep", summary="")

    def complete(self, summary: str = "") -> None:
        """The session's work is done: it terminates as completed when the program exits."""
        self._call("sdk.end", intent="complete", summary=summary)


@contextmanager
def connect() -> Iterator[Run]:
    """The run this program is. A ``StopRun`` (``ApprovalPending``, ``StopRequested``,
    ``Diverged``) that leaves the block ends the program with exit 0: the daemon knows
    why, and the turn goes on in a later run."""
    conn = Connection(Path(_env("SESSIOND_SOCKET")), timeout=300)
    run = Run(conn, _env("SESSIOND_TOKEN"), _env("SESSIOND_SESSION"), _env("SESSIOND_RUN"))
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, run._on_sigterm)
    try:
        yield run
        run._pipe.settle()  # the last step's end written before the program ends
    except StopRun as stop:
        print(f"sessiond: {stop}", file=sys.stderr)
        raise SystemExit(0) from None
    finally:
        with contextlib.suppress(RemoteError):
            run._pipe.settle()  # (after an error too: no end left in flight)
        signal.signal(signal.SIGTERM, previous)
        conn.close()


class AsyncRun:
    """The same steps for asyncio programs. Ordinals are given when a step is called,
    before any await; ``fn`` may be a coroutine function. The RPCs run in a thread."""

    def __init__(self, run: Run) -> None:
        self.sync = run
        self.key, self.fence = Run.key, run.fence

    async def context(self) -> ContextAnswer:
        return await asyncio.to_thread(self.sync.context)

    def step(self, name: str, fn: Callable[[], Any], **kw: Any) -> Any:
        place = self.sync._place(kw.get("key"))  # at the call, before any await
        return self._step(place, name, fn, **kw)

    async def _step(
        self,
        place: StepPlace,
        name: str,
        fn: Callable[[], Any],
        *,
        # a tool's arguments as the program gives them: any JSON
        args: Mapping[str, Any] | None = None,
        side_effect: str = "external-write",
        idempotency: str = "unsafe",
        resume: str = "never-rerun",
        writes: list[str] | tuple[str, ...] = (),
        key: str | None = None,
        key_is_id: bool = False,
        observe: Callable[[Any], str] | None = None,
    ) -> Any:
        risk = {"side_effect": side_effect, "idempotency": idempotency, "resume": resume}
        answer = await asyncio.to_thread(
            lambda: self.sync._begin(
                kind="tool", name=name, key=key, args=args or {}, writes=list(writes), risk=risk,
                key_is_id=key_is_id, **place,
            )
        )  # fmt: skip
        if answer["status"] == "replayed":
            return _from_answer(answer)
        return await self._work(answer, fn, name, observe)

    async def _work(
        self,
        answer: StepAnswer,
        fn: Callable[[], Any],
        name: str,
        observe: Callable[[Any], str] | None,
    ) -> Any:
        call = answer["call"]
        token = _current_key.set(answer.get("key"))
        frame = _Frame(call)
        inside = _frame.set(frame)
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
            value, b64 = _to_json(result)
        except BaseException as exc:
            await asyncio.to_thread(self.sync._end, call, exc, frame)
            raise
        finally:
            _frame.reset(inside)
            _current_key.reset(token)
        result = base64.b64decode(b64) if b64 is not None else value
        text = _observation(name, result, observe)
        await asyncio.to_thread(
            lambda: self.sync._call(
                "sdk.step_done", call=call, status="ok", result=value, result_b64=b64,
                observation=text,
            )
        )  # fmt: skip
        return result

    def model_call(
        self, model: str, request: Any, fn: Callable[[], Any], *, strict: bool = False,
        key: str | None = None, usage: Callable[[Any], tuple[int, int]] | None = None,
        text: Callable[[Any], str] | None = None, cost: Callable[[Any], float | None] | None = None,
    ) -> Any:  # fmt: skip
        place = self.sync._place(key)
        return self._model_call(
            place, model, request, fn, strict=strict, key=key, usage=usage, text=text, cost=cost
        )

    async def _model_call(
        self, place: StepPlace, model: str, request: Any, fn: Callable[[], Any], *,
        strict: bool, key: str | None, usage: Callable[[Any], tuple[int, int]] | None = None,
        text: Callable[[Any], str] | None = None, cost: Callable[[Any], float | None] | None = None,
    ) -> Any:  # fmt: skip
        answer = await asyncio.to_thread(
            lambda: self.sync._begin(
                kind="model", name=model, key=key, request=request, strict=strict, **place
            )
        )
        if answer["status"] == "replayed":
            return _from_answer(answer)
        call = answer["call"]
        frame = _Frame(call)
        inside = _frame.set(frame)
        try:
            response = fn()
            if inspect.isawaitable(response):
                response = await response
            value, _ = _to_json(response)
        except BaseException as exc:
            await asyncio.to_thread(self.sync._end, call, exc, frame)
            raise
        finally:
            _frame.reset(inside)
        tin, tout = (usage or _usage)(value)
        await asyncio.to_thread(
            lambda: self.sync._call(
                "sdk.step_done", call=call, status="ok", result=value, tokens_in=tin,
                tokens_out=tout, text=(text or _text)(value),
                cost_usd=cost(value) if cost else None,
            )
        )  # fmt: skip
        return value

    async def send(self, to: str, text: str, *, key: str | None = None) -> None:
        place = self.sync._place(key)

        def go() -> None:
            answer: StepAnswer = self.sync._call("sdk.send", to=to, text=text, key=key, **place)
            if answer["status"] == "denied":
                raise Denied(f"send to {to} was denied ({answer.get('rule', '')})")
            if answer["status"] == "stop":
                raise StopRequested(f"send to {to} not done: {answer.get('reason', '')}")
            if answer["status"] == "diverged":
                raise Diverged(answer.get("rule", "send diverged from the recorded turn"))

        await asyncio.to_thread(go)

    async def verify(self, check: str, *, ok: bool, output: bytes | str = b"") -> None:
        await asyncio.to_thread(lambda: self.sync.verify(check, ok=ok, output=output))

    async def sleep(self) -> None:
        await asyncio.to_thread(self.sync.sleep)

    async def complete(self, summary: str = "") -> None:
        await asyncio.to_thread(self.sync.complete, summary)


class _AsyncConnect:
    def __init__(self) -> None:
        self._cm: Any = None

    async def __aenter__(self) -> AsyncRun:
        self._cm = connect()
        return AsyncRun(self._cm.__enter__())

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._cm.__exit__(kind, exc, tb)


def connect_async() -> _AsyncConnect:
    return _AsyncConnect()


__all__ = [
    "ApprovalPending", "AsyncRun", "Denied", "Diverged", "Fence", "RemoteError", "Run", "SdkError",
    "StepFailed", "StopRequested", "StopRun", "connect", "connect_async",
]  # fmt: skip
