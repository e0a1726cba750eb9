"""The session SDK: how an agent program records what it does.

::

    from sessiond.sdk import connect

    with connect() as run:                 # also: async with connect_async() as run
        ctx = run.context()                # state, messages view, wake cause, approvals
        with run.tool("edit_file", {"path": "docs/api.md"}, writes=["docs/api.md"],
                      side_effect="workspace-write", idempotency="unsafe",
                      resume="require-user-confirmation") as call:
            ...                            # do the work only inside the block
            call.finish(status="ok", output=b"...", observation="rewrote docs/api.md")
        run.model(model="m", request={...}, response={...}, tokens_in=812, tokens_out=64)
        run.verify("pytest -q", ok=True, output=b"...")
        run.send("other-session", "docs are updated")
        run.sleep()                        # or run.complete(summary="...")

It reads ``SESSIOND_SOCKET``, ``SESSIOND_SESSION``, ``SESSIOND_RUN`` and
``SESSIOND_TOKEN`` from the environment (the daemon sets them for ``kind =
"sdk"`` programs). Stdlib and orjson only: it starts fast inside any program.

A tool block: the intent is recorded and the daemon's policy decides before the
block runs (``Denied`` is raised for a denial, ``ApprovalPending`` when a person
must approve: the program should then exit, and the session runs again once the
approval is answered — the same intent is then allowed without a new question).
``tool.started`` is recorded when the block is entered, ``tool.finished`` when it
is left (an exception is a finished call with status error). Once the daemon
asks the program to stop (interrupt, suspend, SIGTERM of the daemon), the
current block finishes and the next ``tool()`` raises ``StopRequested``: a
stable point.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from sessiond.wire import Connection, RemoteError


class SdkError(Exception):
    """Base of what the SDK raises on purpose."""


class Denied(SdkError):
    """The policy (or a person) denied the tool; the block did not run."""


class ApprovalPending(SdkError):
    """The tool needs a person's approval; exit now, the session runs again once answered."""


class StopRequested(SdkError):
    """The daemon asked the program to stop; this is a stable point to exit at."""


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SdkError(
            f"{name} is not set: sessiond.sdk runs inside a session program started by the "
            'daemon (a spec with [run] kind = "sdk")'
        )
    return value


class Call:
    """One tool call inside a ``with run.tool(...)`` block."""

    def __init__(self, run: Run, call_id: str, tool: str) -> None:
        self.run = run
        self.id = call_id
        self.tool = tool
        self.finished = False

    def finish(
        self,
        status: str = "ok",
        output: bytes | str = b"",
        observation: str = "",
        exit_code: int | None = None,
        error_class: str | None = None,
    ) -> None:
        if self.finished:
            return
        text = output.decode(errors="replace") if isinstance(output, bytes) else output
        self.run._call(
            "sdk.finished", call=self.id, status=status, output=text,
            observation=observation, exit_code=exit_code, error_class=error_class,
        )  # fmt: skip
        self.finished = True


class Run:
    """A run of a session program, talking to the daemon."""

    def __init__(self, conn: Connection, token: str, session: str, run_id: str) -> None:
        self._conn = conn
        self._token = token
        self.session = session
        self.run_id = run_id
        self.stop_requested = False
        self._previous_handler: Any = None

    def _call(self, method: str, **params: Any) -> Any:
        result = self._conn.call(method, {"token": self._token, "session": self.session, **params})
        if isinstance(result, dict) and result.get("stop"):
            self.stop_requested = True
        return result

    def _on_sigterm(self, *_: Any) -> None:
        self.stop_requested = True  # finish the current block, stop before the next

    def context(self) -> dict[str, Any]:
        """The session's state, messages view, wake cause, approvals and unread mail."""
        result: dict[str, Any] = self._call("sdk.context")
        return result

    @contextmanager
    def tool(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        writes: list[str] | tuple[str, ...] = (),
        side_effect: str = "workspace-write",
        idempotency: str = "conditional",
        resume: str = "rerun-after-check",
    ) -> Iterator[Call]:
        if self.stop_requested:
            raise StopRequested("the daemon asked this program to stop")
        risk = {"side_effect": side_effect, "idempotency": idempotency, "resume": resume}
        answer = self._call("sdk.tool", tool=name, args=args or {}, writes=list(writes), risk=risk)
        decision = answer["decision"]
        if decision == "deny":
            raise Denied(f"{name} was denied ({answer['rule']})")
        if decision == "ask":
            raise ApprovalPending(
                f"{name} needs approval (call {answer['call']}); exit now: the session runs "
                "again once it is answered"
            )
        if decision == "stop":
            raise StopRequested(f"{name} not started: {answer['rule']}")
        call = Call(self, answer["call"], name)
        self._call("sdk.started", call=call.id)
        try:
            yield call
        except BaseException as exc:
            if not call.finished:
                status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
                call.finish(status=status, output=repr(exc), observation=f"{name} failed: {exc}",
                            error_class="execution")  # fmt: skip
            raise
        if not call.finished:
            call.finish(status="ok", observation=f"{name} done")

    def model(
        self,
        *,
        model: str,
        request: Any,
        response: Any,
        tokens_in: int = 0,
        tokens_out: int = 0,
        text: str = "",
        tools: list[Any] | None = None,
        request_id: str | None = None,
        status: str = "ok",
        duration_ms: int | None = None,
        started: float | None = None,
    ) -> str:
        """Record a model call: the exact context sent (``request``) and the answer."""
        took = (
            duration_ms
            if duration_ms is not None
            else (int((time.monotonic() - started) * 1000) if started is not None else 0)
        )
        answer = self._call(
            "sdk.model", model=model, request=request, response=response, tokens_in=tokens_in,
            tokens_out=tokens_out, text=text, tools=tools or [], request_id=request_id,
            status=status, duration_ms=took,
        )  # fmt: skip
        return str(answer["request_id"])

    def verify(self, check: str, *, ok: bool, output: bytes | str = b"") -> None:
        text = output.decode(errors="replace") if isinstance(output, bytes) else output
        self._call("sdk.verify", check=check, ok=ok, output=text)

    def send(self, to: str, text: str) -> None:
        self._call("sdk.send", to=to, text=text)

    def sleep(self) -> None:
        """End this run and wait for the next wake."""
        self._call("sdk.end", intent="sleep", summary="")

    def complete(self, summary: str = "") -> None:
        """The session's work is done: it terminates as completed when the program exits."""
        self._call("sdk.end", intent="complete", summary=summary)


@contextmanager
def connect() -> Iterator[Run]:
    conn = Connection(Path(_env("SESSIOND_SOCKET")), timeout=300)
    run = Run(conn, _env("SESSIOND_TOKEN"), _env("SESSIOND_SESSION"), _env("SESSIOND_RUN"))
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, run._on_sigterm)
    try:
        yield run
    finally:
        signal.signal(signal.SIGTERM, previous)
        conn.close()


class AsyncRun:
    """The same calls for asyncio programs (each runs in a worker thread)."""

    def __init__(self, run: Run) -> None:
        self.sync = run

    async def context(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.context)

    @asynccontextmanager
    async def tool(
        self, name: str, args: dict[str, Any] | None = None, **risk: Any
    ) -> AsyncIterator[Call]:
        block = self.sync.tool(name, args, **risk)
        call = await asyncio.to_thread(block.__enter__)
        try:
            yield call
        except BaseException as exc:
            await asyncio.to_thread(block.__exit__, type(exc), exc, exc.__traceback__)
            raise
        await asyncio.to_thread(block.__exit__, None, None, None)

    async def model(self, **kwargs: Any) -> str:
        return await asyncio.to_thread(lambda: self.sync.model(**kwargs))

    async def verify(self, check: str, *, ok: bool, output: bytes | str = b"") -> None:
        await asyncio.to_thread(lambda: self.sync.verify(check, ok=ok, output=output))

    async def send(self, to: str, text: str) -> None:
        await asyncio.to_thread(self.sync.send, to, text)

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
    "ApprovalPending", "AsyncRun", "Call", "Denied", "RemoteError", "Run", "SdkError",
    "StopRequested", "connect", "connect_async",
]  # fmt: skip
