"""From a request frame to a syscall and back: the method table, decoding a
request, and turning what happens into exactly one answer.

The table maps each wire method to its params model (sessiond.ipc.params) and the
syscall it makes; nothing else is reachable from the socket. A SessiondError
becomes an error answer with its stable code and exit code; anything else is a bug,
logged and answered as ``internal`` so the connection (and the daemon) goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import pwd
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import structlog

from sessiond.errors import InvalidInput, SessiondError, recognised
from sessiond.ipc.bundles import BundleStream
from sessiond.ipc.follow import LogStream
from sessiond.ipc.frames import Frames, error, reply
from sessiond.ipc.opening import opened_for
from sessiond.ipc.params import (
    ApplyParams,
    ApproveParams,
    CompactParams,
    ConsoleParams,
    CreateParams,
    ExportParams,
    ForkParams,
    GcParams,
    HandoverParams,
    ImportParams,
    LogParams,
    MergeParams,
    MigrateParams,
    NameParams,
    NoParams,
    OutputParams,
    Params,
    PsParams,
    ReplayParams,
    ResolveParams,
    SdkContextParams,
    SdkEndParams,
    SdkSendParams,
    SdkStepDoneParams,
    SdkStepParams,
    SdkVerifyParams,
    SendParams,
    TokenParams,
    parse,
)
from sessiond.ipc.program import NotGranted, ProgramGuard
from sessiond.ipc.runpeer import Examiner
from sessiond.listing import Listing
from sessiond.replies import JsonObject, Who
from sessiond.syscalls import console
from sessiond.syscalls.kernel import Kernel
from sessiond.syscalls.seams import Follows, Router
from sessiond.wire import Frame
from sessiond.wire import Params as WireParams

log = structlog.get_logger(__name__)

# Methods outside the table: they stream (log --follow) or carry a body (a bundle).
# A refused import's body, if its client sent one anyway, is read as frames and
# answered as bad ones: the connection survives it, and so does the daemon.
STREAMED: dict[str, type[Params]] = {
    "log": LogParams,
    "export": ExportParams,
    "import": ImportParams,
}

Handler = Callable[[Any], Awaitable[Any]]
Methods = dict[str, tuple[type[Params], Handler]]


@dataclass(frozen=True)
class Caller:
    """Who is at the other end of a connection, as the kernel says (never the request).

    ``endpoint``: the control socket (people) or the program endpoint (runs).
    ``refusal``: on the control socket, why this peer may only ping (it is a
    process of a run, or could not be examined: sessiond.ipc.runpeer);
    ``examiner`` says it at each request (:meth:`refused`): examined in full
    once, then whether the process that connected is still there."""

    endpoint: Literal["control", "program"]
    uid: int
    refusal: str | None = None
    examiner: Examiner | None = field(default=None, compare=False, repr=False)
    pid: int = 0

    def refused(self) -> str | None:
        """Why this peer may only ping, now (None: it is an operator)."""
        if self.refusal is not None or self.examiner is None:
            return self.refusal
        why = self.examiner.refusal()
        if why is not None and not self.examiner.said:
            self.examiner.said = True  # once a connection: a refusal sticks to it
            log.info("peer.only_ping", pid=self.pid, uid=self.uid, why=why)
        return why

    def still(self, _approval: Any = None) -> None:
        """Raise if this peer may not act now: checked again under the session's
        lock, just before an answer is recorded (its process may be gone since)."""
        why = self.refused()
        if why is not None:
            raise NotGranted(why)

    def who(self) -> Who:
        """Who answered (approve, deny, resolve, apply): uid, user name, channel."""
        user = str(self.uid)
        with contextlib.suppress(KeyError):
            user = pwd.getpwuid(self.uid).pw_name
        return {"uid": self.uid, "user": user, "channel": "cli"}


OPERATOR_CALLER = Caller("control", 0)  # tests that call handle() directly


class BadRequest(SessiondError):
    """A frame that is not a request: not JSON, no method, unknown method (exit 2)."""

    code = "bad_request"
    exit_code = 2


def listing_of(p: PsParams) -> Listing:
    """The listing a ``ps`` asks for, or ``invalid_input`` naming what is wrong."""
    try:
        return Listing.of(p.state, p.agent, p.label, p.all, p.sort)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


# Every one-answer method and its params model (``log`` streams: LogStream answers
# it). Known without a kernel: the hostile tests fuzz each of them.
METHOD_PARAMS: dict[str, type[Params]] = {
    "ping": NoParams,
    "ps": PsParams,
    "nodes": NoParams,
    "models": NoParams,
    "show": NameParams,
    "replay": ReplayParams,
    "gate": NameParams,
    "create": CreateParams,
    "activate": NameParams,
    "suspend": NameParams,
    "resume": NameParams,
    "interrupt": NameParams,
    "cancel": NameParams,
    "fork": ForkParams,
    "merge": MergeParams,
    "send": SendParams,
    "migrate": MigrateParams,
    "drain": NameParams,
    "compact": CompactParams,
    # daemon to daemon: the end of a hand-over (sessiond.syscalls.handover)
    "handover.finish": HandoverParams,
    "handover.abort": HandoverParams,
    "handover.status": HandoverParams,
    "reload": NoParams,
    "notify": NoParams,
    # the web console's lists, a node's own: any node's console lists the cluster's
    "web.rows": NoParams,
    "web.approvals": ConsoleParams,
    "cat": NameParams,
    "trace.export": NameParams,
    "output": OutputParams,
    "sdk.context": SdkContextParams,
    "sdk.step": SdkStepParams,
    "sdk.step_done": SdkStepDoneParams,
    "sdk.verify": SdkVerifyParams,
    "sdk.send": SdkSendParams,
    "sdk.end": SdkEndParams,
}

# The operator's answers and their params models.
ANSWER_PARAMS: dict[str, type[Params]] = {
    "approve": ApproveParams,
    "deny": ApproveParams,
    "resolve": ResolveParams,
    "web.login": NoParams,
    "apply": ApplyParams,
    "gc": GcParams,
}


def fields(fn: Callable[..., Awaitable[Any]], *names: str) -> Handler:
    """A handler that calls ``fn`` with the params' fields ``names``, in order.
    ``fn`` is a bound method of a syscall family, looked up once, here."""

    def handler(p: Any) -> Awaitable[Any]:
        return fn(*(getattr(p, name) for name in names))

    return handler


def method_table(k: Kernel, reload: Callable[[], Awaitable[Any]]) -> Methods:
    """Every one-answer method: its params model and the syscall it makes, bound
    when the table is built (the kernel's families never change after their
    construction: a cluster node's differences are their seams)."""
    insp, ctl, lin, ho, obs, sdk = k.inspection, k.control, k.lineage, k.handover, k.observe, k.sdk
    ps_listed, migrate_node, output = k.ps_listed, k.migrate_node, k.output
    table, node = k.table, console.node_of(k.config)

    async def ps(p: PsParams) -> Any:
        return await ps_listed(listing_of(p), p.footer)

    async def migrate(p: MigrateParams) -> Any:
        if p.node is None:
            return await lin.migrate(p.name, p.profile, p.to)
        return await migrate_node(p.name, p.node, p.profile, p.to, force=p.force)

    async def web_rows(_: NoParams) -> Any:
        return await console.rows(table, node)

    async def web_approvals(p: ConsoleParams) -> Any:
        return await console.approvals(table if p.name is None else [table.get(p.name)], node)

    async def output_of(p: OutputParams) -> Any:
        return await output(p.name, p.run, p.stream, offset=p.offset, wait=p.wait, after=p.after)

    async def no_params(fn: Callable[[], Awaitable[Any]], _: NoParams) -> Any:
        return await fn()

    handlers: dict[str, Handler] = {
        "ping": functools.partial(no_params, insp.ping),
        "ps": ps,
        "nodes": functools.partial(no_params, k.nodes),
        "models": functools.partial(no_params, k.models),
        "show": fields(insp.show, "name"),
        "replay": fields(insp.replay, "name", "upto", "view", "cursor", "limit"),
        "gate": fields(insp.gate, "name"),
        "create": fields(ctl.create, "spec", "base", "source"),
        "activate": fields(ctl.activate, "name"),
        "suspend": fields(ctl.suspend, "name"),
        "resume": fields(ctl.resume, "name"),
        "interrupt": fields(ctl.interrupt, "name"),
        "cancel": fields(ctl.cancel, "name"),
        "fork": fields(lin.fork, "name", "new", "at", "with_triggers"),
        "merge": fields(lin.merge, "child", "into", "summary"),
        "send": fields(lin.send, "to", "text", "sender"),
        "migrate": migrate,
        "drain": fields(k.drain, "name"),
        "compact": fields(lin.compact, "name", "keep"),
        "handover.finish": fields(ho.finish, "name", "handover"),
        "handover.abort": fields(ho.discard, "name", "handover"),
        "handover.status": fields(ho.status, "name", "handover"),
        "reload": functools.partial(no_params, reload),
        "notify": functools.partial(no_params, obs.notify_status),
        "web.rows": web_rows,
        "web.approvals": web_approvals,
        "cat": fields(obs.cat, "name"),
        "trace.export": fields(obs.trace_export, "name"),
        "output": output_of,
        "sdk.context": fields(sdk.sdk_context, "token", "cursor", "limit"),
        "sdk.step": sdk.sdk_step,
        "sdk.step_done": sdk.sdk_step_done,
        "sdk.verify": fields(sdk.sdk_verify, "token", "check", "ok", "output"),
        "sdk.send": sdk.sdk_send,
        "sdk.end": fields(sdk.sdk_end, "token", "intent", "summary"),
    }
    return {method: (model, handlers[method]) for method, model in METHOD_PARAMS.items()}


Still = Callable[[Any], None] | None
AnswerHandler = Callable[[Any, Who | None, Still], Awaitable[Any]]


def answer_table(k: Kernel) -> dict[str, tuple[type[Params], AnswerHandler]]:
    """The operator's answers: each records who gave it, from the peer's credentials
    (``by`` in the request is a free-text note beside it, never the identity).
    ``c`` (approve, deny): the peer is checked again under the session's lock."""
    approvals, resolve, web_login, gc = k.approvals, k.resolve, k.web_login, k.retention.gc

    async def approve(p: ApproveParams, w: Who | None, c: Still) -> Any:
        return await approvals.approve(p.name, p.call, p.by, who=w, check=c)

    async def deny(p: ApproveParams, w: Who | None, c: Still) -> Any:
        return await approvals.deny(p.name, p.call, p.by, p.reason, who=w, check=c)

    async def resolve_(p: ResolveParams, w: Who | None, _c: Still) -> Any:
        return await resolve(p.name, p.option, p.by, who=w)

    async def login(_: NoParams, w: Who | None, _c: Still) -> Any:
        return await web_login(w)

    async def apply(p: ApplyParams, w: Who | None, _c: Still) -> Any:
        return await approvals.apply(p.name, p.spec, p.base, p.source, p.by, who=w)

    async def gc_(p: GcParams, w: Who | None, _c: Still) -> Any:
        return await gc(p.dry_run, who=w)

    handlers: dict[str, AnswerHandler] = {
        "approve": approve,
        "deny": deny,
        "resolve": resolve_,
        "web.login": login,
        "apply": apply,
        "gc": gc_,
    }
    return {method: (model, handlers[method]) for method, model in ANSWER_PARAMS.items()}


def failed(request_id: Any, exc: Exception) -> Frame:
    """The answer to a request that raised what is not a SessiondError: one a part
    recognises (the cluster's database away), else a bug, logged."""
    known = recognised(exc)
    if known is not None:
        log.warning("request.failed", error=str(known))
        return error(request_id, known.code, str(known), known.exit_code)
    log.exception("request.failed")
    return error(
        request_id,
        "internal",
        f"internal error: {type(exc).__name__}: {exc}; "
        "this is a bug in sessiond, the daemon log has the details",
        70,
    )


class Dispatch:
    """Answers one request frame on a connection: decode, check, call, reply."""

    def __init__(
        self,
        kernel: Kernel,
        reload: Callable[[], Awaitable[Any]],
        router: Router | None = None,
        follows: Follows | None = None,
    ) -> None:
        self.kernel = kernel
        self.methods = method_table(kernel, reload)
        self.answers = answer_table(kernel)
        # a cluster node's: `log S --follow` reads S's events wherever S runs
        self.logs = LogStream(kernel, follows)
        self.bundles = BundleStream(kernel)
        self.guard = ProgramGuard(kernel.table, kernel.tokens.session_for)
        # a cluster node's: requests for sessions other nodes own go there
        self.forward = router

    def _refused_first(
        self, caller: Caller, method: str, request: JsonObject, params: JsonObject
    ) -> None:
        """Refuse a caller who may not ask anything, before its request is looked at
        further: nothing is done for it (a session not opened yet after a start-up is
        not opened for it). A control peer that may only ping; on the program
        endpoint, a token that is no live run's (``_admit`` and the sdk calls check
        the rest, as before)."""
        if method == "ping":
            return
        if caller.endpoint == "control":
            why = caller.refused()
            if why is not None:
                raise NotGranted(why)
        elif method.startswith("sdk."):
            token, session = params.get("token"), params.get("session")
            if not isinstance(token, str):
                self.guard.caller(token)  # (refuses it: no token)
            else:
                self.kernel.check_token(token, session if isinstance(session, str) else None)
        else:
            self.guard.caller(request.get("token"))

    def _admit(
        self, caller: Caller, method: str, request: JsonObject, params: Any, again: bool = True
    ) -> Any:
        """The params to serve ``method`` with for ``caller``, or a refusal.
        ``again``: a control peer is asked again whether it may act (it was, by
        ``_refused_first``, but the request waited since for its sessions to
        open); not when nothing was awaited in between (each ask is a system
        call, a poll of the peer's pidfd, on every request's path)."""
        if method == "ping":
            return params
        if caller.endpoint == "control":
            why = caller.refused() if again else None
            if why is not None:
                raise NotGranted(why)
            return params
        if method.startswith("sdk."):  # its run token is checked with its params
            return params
        return self.guard.admit(method, request.get("token"), params)

    async def execute(self, method: str, params: WireParams, who: Who | None) -> Any:
        """Carry out a request another node of the cluster took in (its peer was
        checked there): the same params models, the same calls, the same errors,
        and ``who`` as the answer's identity. ``log`` here is one answer, never
        a stream."""
        if method in self.answers:
            answer_model, answer = self.answers[method]
            return await answer(parse(answer_model, params), who, None)
        if method == "log":
            p = parse(LogParams, params)
            if p.follow or p.name is None:
                raise BadRequest("a carried log request names one session and does not follow")
            lines = await self.kernel.inspection.log_encoded(
                p.name,
                p.since,
                p.types,
                p.limit,
                grep=p.grep,
                after=(p.after or {}).get(p.name, 0),
                first=p.first,
                until=p.until,
            )
            return [orjson.loads(line) for line in lines]
        if method not in self.methods or method.startswith("sdk."):
            raise BadRequest(f"method {method!r} is not carried between nodes")
        model, handler = self.methods[method]
        return await handler(parse(model, params))

    async def handle(
        self,
        line: bytes,
        frames: Frames,
        writer: asyncio.StreamWriter,
        caller: Caller = OPERATOR_CALLER,
    ) -> None:
        request_id: Any = None
        try:
            try:
                request = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise BadRequest(f"a request must be one JSON object per line: {exc}") from None
            if not isinstance(request, dict):
                raise BadRequest("a request must be a JSON object with id, method and params")
            request_id = request.get("id")
            if not isinstance(request_id, int | str) or isinstance(request_id, bool):
                request_id = None
            method = request.get("method")
            if not isinstance(method, str) or (
                method not in self.methods and method not in STREAMED and method not in self.answers
            ):
                known = ", ".join(sorted([*self.methods, *STREAMED, *self.answers]))
                raise BadRequest(f"unknown method {method!r}; the methods are {known}")
            params = request.get("params", {})
            if not isinstance(params, dict):
                raise BadRequest("params must be a JSON object")
            self._refused_first(caller, method, request, params)  # nothing opened for it
            # a start-up still opening sessions: the ones this request names first,
            # before a program's grant checks read them (a fork's source, a merge's child)
            waited = await opened_for(self.kernel.table, method, params)
            params = self._admit(caller, method, request, params, again=waited)
            # after the peer checks, here: a program's only as its spec grants
            if self.forward is not None and not method.startswith("sdk."):
                routed, result = await self.forward.route(method, params, caller.who())
                if routed:
                    await reply(writer, {"id": request_id, "ok": True, "result": result})
                    return
            if method in self.answers:
                answer_model, answer = self.answers[method]
                still = caller.still if caller.examiner is not None else None
                result = await answer(parse(answer_model, params), caller.who(), still)
                await reply(writer, {"id": request_id, "ok": True, "result": result})
                return
            if method == "log":
                await self.logs.serve(request_id, parse(LogParams, params), writer, frames)
                return
            if method == "export":
                await self.bundles.export(request_id, parse(ExportParams, params), writer)
                return
            if method == "import":
                parsed_import = parse(ImportParams, params)
                await self.bundles.import_(request_id, parsed_import, frames, writer)
                return
            model, handler = self.methods[method]
            parsed = parse(model, params)
            if isinstance(parsed, TokenParams):  # an sdk.* call: its run token first
                self.kernel.check_token(parsed.token, parsed.session)
            result = await handler(parsed)
            await reply(writer, {"id": request_id, "ok": True, "result": result})
        except SessiondError as exc:
            await reply(writer, error(request_id, exc.code, str(exc), exc.exit_code))
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:
            await reply(writer, failed(request_id, exc))
