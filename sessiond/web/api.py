"""The console's JSON API, its event stream and its actions.

Every action is a syscall the Kernel also serves to sessionctl, with the same
checks and the same errors (``approve``, ``deny``, ``resolve``, the lifecycle
ones); the answers record the web user and the channel ``web``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict

import orjson
from aiohttp import web

from sessiond.describe import describe
from sessiond.errors import InvalidInput
from sessiond.log.store.base import Record
from sessiond.logquery import parse_since
from sessiond.replies import JsonObject, TablePage
from sessiond.web.auth import connected
from sessiond.web.cluster import REFRESH
from sessiond.web.humane import actions_for
from sessiond.web.metrics import CONTENT_TYPE
from sessiond.web.pages import before_of
from sessiond.web.site import Site
from sessiond.web.views import approvals, rows_page, table_page

MIN_INTERVAL = 0.25  # the table stream sends at most 4 pages a second, whatever the load
KEEPALIVE = 15.0
TIMELINE_LIMIT = 500
LIFECYCLE = ("activate", "suspend", "resume", "interrupt", "cancel")
MESSAGE_LIMIT = 256 << 10  # as `sessionctl send` (sessiond.ipc.params.SendParams)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _int(text: str, what: str) -> int:
    if len(text) > 20:  # int() of thousands of digits raises (and costs) before any check
        raise InvalidInput(f"{what} must be a whole number of at most 20 digits")
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"{what} must be a whole number (got {text!r})") from None


class Changed(TypedDict):
    """A session page's live update: its state, and the buttons that state offers."""

    state: str
    seq: int | None
    reason: str | None
    actions: list[str]


class LogRow(TypedDict):
    """An event as the session page's log lists it: its line of text beside its data."""

    seq: int
    ts: str
    type: str
    text: str
    data: JsonObject  # the event's payload


class Api:
    def __init__(self, server: Site) -> None:
        self.server = server
        self.kernel = server.kernel
        self.cluster = server.cluster

    def routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/sessions", self.sessions)
        router.add_get("/api/sessions/stream", self.stream)
        router.add_get("/api/approvals", self.inbox)
        router.add_get("/api/s/{name}/stream", self.session_stream)
        router.add_get("/api/s/{name}/events", self.events)
        router.add_get("/api/s/{name}/messages", self.messages)
        router.add_post("/api/s/{name}/approve", self.approve)
        router.add_post("/api/s/{name}/deny", self.deny)
        router.add_post("/api/s/{name}/resolve", self.resolve)
        router.add_post("/api/s/{name}/send", self.send)
        for action in LIFECYCLE:
            router.add_post(f"/api/s/{{name}}/{action}", self.lifecycle)
        router.add_get("/metrics", self.metrics)

    async def _page(self, request: web.Request) -> TablePage:
        q = request.query
        if self.cluster.clustered:  # every node's sessions, each with its node
            return rows_page(
                await self.cluster.rows(self.server.who(request)),
                state=q.get("state", ""), agent=q.get("agent", ""), label=q.get("label", ""),
                page=_int(q.get("page", "1"), "page"),
            )  # fmt: skip
        return await table_page(
            self.kernel.table,
            state=q.get("state", ""),
            agent=q.get("agent", ""),
            label=q.get("label", ""),
            page=_int(q.get("page", "1"), "page"),
        )

    async def sessions(self, request: web.Request) -> web.Response:
        return _json(await self._page(request))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the asked-for page now, and again after each change."""
        first = await self._page(request)  # a bad filter is refused before the stream starts
        # other nodes' changes are not this table's: their rows are asked for again
        every = REFRESH if self.cluster.clustered else None
        return await self._sse(request, "page", lambda: self._page(request), first, every=every)

    async def session_stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events for one session's page: ``event: changed`` with its
        state and last seq whenever it records something."""
        name = request.match_info["name"]
        if self.cluster.remote(name):  # another node's: its `show`, on its commits' hints
            who = self.server.who(request)
            await self.cluster.show(name, who)  # no_such_session before the stream

            async def shown() -> Changed:
                d = await self.cluster.show(name, who)
                runnable = d.get("program") is not None  # its buttons, as its page draws them
                return {"state": d["state"], "seq": d.get("seq"), "reason": d.get("reason"),
                        "actions": actions_for(d["state"], runnable)}  # fmt: skip

            hints = self.cluster.hints
            watch = (lambda wake: hints.watch(name, wake)) if hints is not None else None
            return await self._sse(request, "changed", shown, None, lambda _who: False,
                                   every=REFRESH * 5, watch=watch)  # fmt: skip
        session = self.kernel.table.get(name)  # no_such_session before the stream

        async def changed() -> Changed:
            runnable = session.spec is not None and session.spec.run is not None
            journal = session.journal_or_none
            reason = session.held or (journal.state.reason if journal is not None else "")
            seq = journal.state.seq if journal is not None else None
            return {
                "state": session.state,
                "seq": seq,
                "reason": reason,
                "actions": actions_for(session.state, runnable),
            }  # the page's buttons follow

        return await self._sse(request, "changed", changed, None, lambda who: who == name)

    async def _sse(
        self,
        request: web.Request,
        event: str,
        render: Callable[[], Awaitable[Any]],
        first: Any,
        wanted: Callable[[str], bool] = lambda _name: True,
        *,
        every: float | None = None,
        watch: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
    ) -> web.StreamResponse:
        """``event`` with what ``render`` gives: ``first`` now (unless None), then
        again after each change of a session ``wanted`` names (and each ``watch``
        wake, and every ``every`` seconds: what other nodes change). Coalesced, and
        the rate bounded: at most 4 a second, and no more than a tenth of the time
        spent rendering. Ends when the client goes or the daemon stops."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        changed = asyncio.Event()
        unlisten = self.kernel.table.listen(
            lambda who, _record: changed.set() if wanted(who) else None
        )
        unwatch = watch(changed.set) if watch is not None else (lambda: None)
        closing = asyncio.ensure_future(self.server.closing.wait())
        head = f"event: {event}\ndata: ".encode()
        took = 0.0
        try:
            data = first
            while True:
                if data is not None:
                    await response.write(head + orjson.dumps(data) + b"\n\n")
                woke = asyncio.ensure_future(changed.wait())
                done, _ = await asyncio.wait({woke, closing}, timeout=every or KEEPALIVE,
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if closing in done:
                    woke.cancel()
                    break
                if woke not in done and every is not None:
                    woke.cancel()
                    changed.set()  # time to ask the other nodes again
                elif woke not in done:
                    woke.cancel()
                    await response.write(b": keepalive\n\n")  # finds a closed connection
                    data = None
                    continue
                await asyncio.sleep(max(MIN_INTERVAL, 10 * took))  # coalesce the burst
                changed.clear()
                started = time.perf_counter()
                data = await render()
                took = time.perf_counter() - started
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            unlisten()
            unwatch()
            closing.cancel()
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def inbox(self, request: web.Request) -> web.Response:
        if self.cluster.clustered:
            return _json(await self.cluster.approvals(self.server.who(request)))
        return _json(await approvals(self.kernel.table))

    async def events(self, request: web.Request) -> web.Response:
        """The timeline: the last ``limit`` events (at most 500) of the given types,
        matching the regex, between ``since`` and ``until`` (a seq or a time)."""
        name = request.match_info["name"]
        q = request.query
        types = [t for t in q.get("type", "").split(",") if t]
        limit = min(_int(q.get("limit", str(TIMELINE_LIMIT)), "limit"), TIMELINE_LIMIT)
        if limit < 1:
            raise InvalidInput(f"limit must be at least 1 (got {limit})")
        until = _bound(q.get("until", ""), self.kernel.store.clock())
        since: int | str = q.get("since") or 1
        if isinstance(since, str) and since.isdigit():
            since = _int(since, "since")
        records = await self.cluster.log(
            name, self.server.who(request), since, types or None, 0 if until else limit,
            grep=q.get("grep") or None,
        )  # fmt: skip
        if until is not None:
            records = [r for r in records if not _after(r, until)][-limit:]
        return _json([_row(r) for r in records])

    async def messages(self, request: web.Request) -> web.Response:
        """A page of the messages view, newest first: ``before`` a seq for older ones."""
        page, older = await self.server.pages.messages(
            request.match_info["name"], before_of(request)
        )
        return _json({"messages": page, "older": older})

    async def _body(self, request: web.Request) -> JsonObject:
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            raise InvalidInput("the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise InvalidInput("the request body must be a JSON object")
        return body

    async def approve(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        name, note = request.match_info["name"], _str(body, "note")
        call = _str(body, "call") or None
        who = self.server.who(request)
        result = await self.cluster.syscall(
            "approve", {"name": name, "call": call, "by": note}, who,
            lambda: self.kernel.approve(
                name, call, note, who=who, check=lambda _a: connected(request)
            ),
        )  # fmt: skip
        return _json({"ok": True, "result": result})

    async def deny(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        name, note = request.match_info["name"], _str(body, "note")
        call = _str(body, "call") or None
        who = self.server.who(request)
        result = await self.cluster.syscall(
            "deny", {"name": name, "call": call, "by": "", "reason": note}, who,
            lambda: self.kernel.deny(
                name, call, "", note, who=who, check=lambda _a: connected(request)
            ),
        )  # fmt: skip
        return _json({"ok": True, "result": result})

    async def resolve(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        option = _str(body, "option")
        if option not in ("rerun", "discard", "accept"):
            raise InvalidInput(f"no recovery option {option!r}; the options are rerun, "
                               "discard and accept")  # fmt: skip
        name, note, who = request.match_info["name"], _str(body, "note"), self.server.who(request)
        result = await self.cluster.syscall(
            "resolve", {"name": name, "option": option, "by": note}, who,
            lambda: self.kernel.resolve(name, option, note, who=who),
        )  # fmt: skip
        return _json({"ok": True, "result": result})

    async def send(self, request: web.Request) -> web.Response:
        """A message to the session's mailbox from the web user (the inbox's answer with
        words: `sessionctl send`'s syscall, its sender the login's user)."""
        body = await self._body(request)
        text = _str(body, "text")
        if not text.strip():
            raise InvalidInput("the message is empty: write what the session should read")
        if len(text.encode()) > MESSAGE_LIMIT:
            raise InvalidInput(f"the message is over {MESSAGE_LIMIT >> 10} KiB: send less")
        name, who = request.match_info["name"], self.server.who(request)
        sender = str(who["user"])
        result = await self.cluster.syscall(
            "send", {"to": name, "text": text, "sender": sender}, who,
            lambda: self.kernel.send(name, text, sender),
        )  # fmt: skip
        return _json({"ok": True, "result": result})

    async def lifecycle(self, request: web.Request) -> web.Response:
        action, name = request.path.rsplit("/", 1)[1], request.match_info["name"]
        result = await self.cluster.syscall(
            action, {"name": name}, self.server.who(request),
            lambda: getattr(self.kernel, action)(name),
        )  # fmt: skip
        return _json({"ok": True, "result": result})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=await self.server.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE})  # fmt: skip


def _str(body: JsonObject, key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise InvalidInput(f"{key} must be a string")
    return value


def _bound(text: str, now_ns: int) -> tuple[int, str | None] | None:
    """``until``: a seq, or a time as ``since`` takes one (10m, RFC 3339); None: none."""
    text = text.strip()
    if not text:
        return None
    try:
        return (int(text), None) if text.isdigit() else parse_since(text, now_ns)
    except ValueError as exc:
        raise InvalidInput(str(exc).replace("since", "until", 1)) from None


def _after(record: Record, until: tuple[int, str | None]) -> bool:
    seq, ts = until
    return bool(record["ts"] > ts) if ts is not None else bool(record["seq"] > seq)


def _row(r: Record) -> LogRow:
    return {"seq": r["seq"], "ts": r["ts"], "type": r["type"], "text": describe(r),
            "data": r["data"]}  # fmt: skip
