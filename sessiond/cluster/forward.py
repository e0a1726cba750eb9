"""Any node's socket serves the whole cluster (docs/design.md section 10).

A request on this node's control socket for a session another node owns is
carried out by that owner: it is left in the cluster's carried requests
(sessiond.cluster.channels; the ``requests`` table on PostgreSQL) with the
caller's identity, the owner is woken by the broker (and looks every second
anyway), takes it, runs it through its own dispatch (the same params, the same
checks, the same errors) and writes the reply, which this node hands back as if
it had answered itself.

Why carry, rather than answer reads from the database here: the owner's table
holds what the log does not (a run's pid, the next wake, a held reason), and one
path for reads and writes is one set of errors. ``ps`` is the exception: every
live node is asked for its rows, and the sessions no live node answered for are
listed from the process table (waiting for a dead node, or for a claim). So is
``log S --follow``: a stream, not one answer, it is served here from the events
table (sessiond.ipc.tail, woken by sessiond.cluster.follows), so that it goes on
across a take-over.

It is the dispatch's and the console's router (sessiond.syscalls.seams.Router),
given to them when they are constructed; it answers through the dispatches it
is started with.

The peer checks happen here, where the caller connected: a process of a run is
refused before anything is written. A request is carried out at most once: it
is taken once, and a request nobody took in time is withdrawn before this node
says so; if its taker dies before answering, this node says that, naming the
node, and does not ask again (whether it happened is in the session's log).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from sessiond.cluster.channels import (
    CarriedRequests,
    Channels,
    Listening,
    Owner,
    RequestAnswered,
    RequestLeft,
    WakeUp,
)
from sessiond.cluster.follows import FollowHints
from sessiond.cluster.host import Host
from sessiond.cluster.lease import LeaseKeeper
from sessiond.cluster.placement import placeholder
from sessiond.errors import InvalidInput, NodeUnavailable, Refused, SessiondError, recognised
from sessiond.ipc.dispatch import Dispatch, listing_of
from sessiond.ipc.forwarding import ROUTED, error_of
from sessiond.ipc.params import PsParams, parse
from sessiond.replies import ConsoleApproval, JsonObject, Who

log = structlog.get_logger("sessiond.forward")

# How long a node asked about another node's rows for `ps` may take.
PS_BOUND = 5.0
# How long a taken request may take to be answered (a fork of a long log, a gate).
ANSWER_BOUND = 120.0


class Forward:
    """This node's side of carried requests: it asks, and it answers."""

    def __init__(self, keeper: LeaseKeeper, host: Host, channels: Channels) -> None:
        self.lease = keeper.store.lease
        self.host = host
        self.broker = channels.broker
        self._dispatch: Dispatch | None = None  # the control socket's, once started
        self._carried = channels.requests
        self._requests: CarriedRequests | None = None  # the same, once connected (started)
        # A request nobody took within this is withdrawn: long enough for a dead
        # owner's sessions to be taken over (lease_ttl and a few seconds).
        self.take_bound = max(10.0, 2 * self.lease.ttl + 5)
        self._tasks: set[asyncio.Task[None]] = set()
        self._serve: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Event] = {}  # request id -> its reply came
        self._left = asyncio.Event()  # a request was left: look for this node's
        self._unsubscribe: list[Callable[[], None]] = []
        self.hints = FollowHints(channels.broker, host.table)

    @property
    def dispatch(self) -> Dispatch:
        """The control socket's dispatch: what this node answers with."""
        assert self._dispatch is not None, "the forwarding answers once started"
        return self._dispatch

    @property
    def requests(self) -> CarriedRequests:
        """The carried requests (their connections open when the node serves)."""
        assert self._requests is not None, "the forwarding carries once started"
        return self._requests

    def start(self, dispatch: Dispatch) -> None:
        """Serve requests from other nodes through ``dispatch`` (the control
        socket's, whose checks a carried request passed where it came in). The
        dispatches carry this node's requests to theirs already: they were made
        with this as their router."""
        self._dispatch = dispatch
        self._carried.open()
        self._requests = self._carried
        self.hints.start()
        self._unsubscribe = [
            self.broker.subscribe(self._answered, (RequestAnswered,)),
            self.broker.subscribe(lambda _: self._left.set(), (RequestLeft, Listening)),
        ]
        self._serve = asyncio.ensure_future(self._serve_loop())

    async def close(self) -> None:
        await self.hints.close()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        for task in (self._serve, *self._tasks):
            if task is not None:
                task.cancel()
        if self._requests is not None:
            await asyncio.to_thread(self._requests.close)

    # --- asking -----------------------------------------------------------------

    async def route(self, method: str, params: JsonObject, who: Who) -> tuple[bool, Any]:
        if method == "ps":
            return True, await self.ps(who, "ps", params)
        key = ROUTED.get(method)
        name = params.get(key) if key is not None else None
        if not isinstance(name, str) or name in self.host.table.sessions:
            return False, None
        if method == "log" and params.get("follow"):
            # followed here, from the database (sessiond.ipc.tail): not carried, so a
            # take-over does not end it
            return False, None
        if method == "migrate" and isinstance(params.get("node"), str):
            owner = await self._owner(name)
            if owner is not None and (owner.node is None or not owner.alive):
                if params.get("force"):
                    return False, None  # nobody runs it: this node re-homes it
                to = params["node"]
                raise Refused(
                    f"session {name!r}: its node {owner.node or '(none)'} is down, so nobody "
                    f"can hand it over at a stable point. If its workspace is on node {to} "
                    f"now (restored there, or on storage that node mounts), `sessionctl "
                    f"migrate {name} --node {to} --force` moves it there (it continues "
                    "through replay and the gate, as after a crash)"
                )
        if method == "show":
            owner = await self._owner(name)
            if owner is not None and (owner.node is None or not owner.alive):
                # nobody runs it: this node says what it waits for at once
                # (cluster/placement.py), not after a request no node takes in time
                return False, None
        return await self.call(method, params, who, session=name)

    async def _owner(self, name: str) -> Owner | None:
        try:
            return await asyncio.to_thread(self.requests.owner, name)
        except InvalidInput:
            return None  # a bad name: refused here, as on one machine

    async def call(
        self,
        method: str,
        params: Mapping[str, object],  # what is sent: any JSON orjson encodes
        who: Who | None,
        *,
        session: str | None = None,
        node: str | None = None,
        take_bound: float | None = None,
    ) -> tuple[bool, Any]:
        """Leave the request for the session's owner (or ``node``) and wait for the
        reply: (True, the owner's result), or its error raised here; (False, None)
        when the cluster has no such session (this node answers, as on one machine)."""
        bound = self.take_bound if take_bound is None else take_bound
        try:
            request = await asyncio.to_thread(
                self.requests.post, method, params, who, session=session, node=node
            )
        except InvalidInput:
            return False, None  # a bad name: refused here, as on one machine
        if request is None:
            return False, None
        answered = self._waiting[request] = asyncio.Event()
        asked = time.monotonic()
        try:
            while True:  # registered before the first look: no reply is missed
                st = await asyncio.to_thread(self.requests.status, request)
                if st.reply is not None or st.abandoned:
                    self._later(self.requests.forget, request)  # the table stays small
                if st.reply is not None:
                    if st.reply.get("ok"):
                        return True, st.reply.get("result")
                    raise error_of(st.reply)
                waited = time.monotonic() - asked
                if st.taken_by is None and waited > bound:
                    if await asyncio.to_thread(self.requests.abandon, request):
                        self._later(self.requests.forget, request)
                        why = await self._not_taken(session, node, waited)
                        raise NodeUnavailable(why)
                    continue  # taken just now: wait for its reply
                if st.taken_by is not None and not st.taker_alive:
                    raise NodeUnavailable(
                        f"node {st.taken_by!r} took the {method} request"
                        + (f" for session {session!r}" if session else "")
                        + " but its lease lapsed before it answered; whether it was carried "
                        "out is in the session's log (`sessionctl log`); it is not retried"
                    )
                if waited > bound + ANSWER_BOUND:
                    raise NodeUnavailable(
                        f"node {st.taken_by!r} has not answered the {method} request in "
                        f"{waited:.0f}s; see `sessionctl nodes`"
                    )
                # the reply's wake-up (:meth:`_answered` sets it), or half a second:
                # the queue is the truth
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(answered.wait(), 0.5)
                answered.clear()
        finally:
            self._waiting.pop(request, None)

    def _answered(self, wake: WakeUp) -> None:
        """The broker's callback: the asker of this request, if it waits here, looks."""
        if isinstance(wake, RequestAnswered):
            event = self._waiting.get(wake.request)
            if event is not None:
                event.set()

    def _later(self, fn: Callable[[int], None], request: int) -> None:
        task = asyncio.ensure_future(asyncio.to_thread(fn, request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _not_taken(self, session: str | None, node: str | None, waited: float) -> str:
        owner = await self._owner(session) if session is not None else None
        what = f"session {session!r}" if session else f"node {node!r}"
        if owner is not None and owner.node is not None and not owner.alive:
            why = f"its node {owner.node!r} is down and no node has taken the session over"
        elif owner is not None and owner.node is None:
            why = "no node owns it (it waits for a node that may run it)"
        else:
            whom = node or (owner.node if owner is not None else None)
            why = f"node {whom!r} did not take the request"
        return (
            f"{what}: {why} in {waited:.0f}s; nothing was done. "
            "`sessionctl nodes` shows the nodes; try again when its node is up"
        )

    async def ps(self, who: Who, method: str = "ps", params: JsonObject | None = None) -> Any:
        """Every session of the cluster: this node's rows, each live node's own, and
        the process table's for the sessions no live node answered for. ``method``:
        ``ps``, or ``web.rows`` (the console's rows: labels, approvals). A ``ps``'s
        filters go to every node, which filters its own rows; the rows made here
        for the sessions no node answered for pass the same filters, and the whole
        is put in the order asked for here."""
        p = parse(PsParams, params or {}) if method == "ps" else None
        listing = listing_of(p) if p is not None else None
        # each node: its rows, how many terminated rows it hid, every name it has
        ask: Mapping[str, object] = (
            {**listing.params(), "footer": True} if listing is not None else {}
        )
        answers = [("", await self.dispatch.execute(method, ask, who))]
        silent: set[str] = set()
        for n, got in await self._each_node(method, who, ask):
            if isinstance(got, BaseException):
                silent.add(n)
            else:
                answers.append((n, got))
        rows: list[Mapping[str, Any]] = []  # this node's and as other nodes' answers decoded them
        seen: set[str] = set()
        hidden = 0
        for _, got in answers:
            if isinstance(got, dict):  # a ps with its footer
                rows.extend(got["rows"])
                hidden += int(got["hidden"])
                seen.update(str(name) for name in got["known"])
            else:
                rows.extend(got)
        # Every node lists the sessions no live node runs (cluster/placement.py), so
        # one name may come from several: the owner's own row first, then one of those.
        rows.sort(key=lambda r: r.get("state") == "waiting")
        # the rows above, by name: as their nodes' answers decoded them
        unique: dict[str, Mapping[str, Any]] = {}
        for r in rows:
            unique.setdefault(str(r["name"]), r)
        rows = list(unique.values())
        seen.update(unique)
        for name, owner, alive, _state in await asyncio.to_thread(self.requests.sessions):
            if name in seen:
                continue
            seen.add(name)
            if owner is None:
                state, reason = "unowned", "no node owns it yet: the next node to look claims it"
            elif owner in silent:
                state, reason = "unknown", f"node {owner} did not answer in {PS_BOUND:.0f}s"
            elif not alive:
                state, reason = "waiting", f"its node {owner} is down: it waits for a take-over"
            else:
                state, reason = "unknown", f"node {owner} has not opened it yet"
            made = placeholder(name, state, reason, owner)
            if listing is None or listing.matches(made):
                rows.append(made)
        if listing is None or p is None:
            rows.sort(key=lambda r: str(r["name"]))
            return rows
        rows = listing.order(rows)
        return {"rows": rows, "hidden": hidden, "known": sorted(seen)} if p.footer else rows

    async def approvals(self, who: Who) -> list[ConsoleApproval]:
        """Every pending approval of the cluster (the console's inbox), oldest first."""
        items: list[ConsoleApproval] = list(await self.dispatch.execute("web.approvals", {}, who))
        for _, got in await self._each_node("web.approvals", who):
            if isinstance(got, list):
                items.extend(got)
        items.sort(key=lambda i: (i.get("requested_at") or "", i["session"]))
        return items

    async def _each_node(
        self, method: str, who: Who, params: Mapping[str, object] | None = None
    ) -> list[tuple[str, Any]]:
        """Each other live node's answer to ``method`` (its own sessions), or why not."""
        others = await asyncio.to_thread(self.requests.live_nodes)
        answers = await asyncio.gather(
            *(self._rows_of(n, who, method, params or {}) for n in others),
            return_exceptions=True,
        )
        for n, got in zip(others, answers, strict=True):
            if isinstance(got, BaseException):
                log.warning("forward.node_unanswered", node=n, method=method, error=repr(got))
        return list(zip(others, answers, strict=True))

    async def _rows_of(self, node: str, who: Who, method: str, params: Mapping[str, object]) -> Any:
        _, rows = await self.call(method, params, who, node=node, take_bound=PS_BOUND)
        return rows

    # --- answering --------------------------------------------------------------

    async def _serve_loop(self) -> None:
        while True:
            try:
                self._left.clear()
                await self._take_now()
                # a wake-up, or a second without one: the queue is the truth
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._left.wait(), 1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the lease keeper decides
                log.warning("forward.serve_failed", error=repr(exc))
                await asyncio.sleep(1.0)

    async def _take_now(self) -> None:
        names = list(self.host.table.sessions)
        taken = await asyncio.to_thread(self.requests.take, self.lease.incarnation, names)
        for request, method, params, who in taken:
            task = asyncio.ensure_future(self._carry(request, method, params, who))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _carry(self, request: int, method: str, params: JsonObject, who: Who | None) -> None:
        reply: JsonObject
        try:
            result = await self.dispatch.execute(method, params, who)
            reply = {"ok": True, "result": result}
        except SessiondError as exc:
            reply = {
                "ok": False,
                "error": {"code": exc.code, "message": str(exc), "exit": exc.exit_code},
            }
        except Exception as exc:
            known = recognised(exc)  # the cluster's database away, not a bug
            if known is None:
                log.exception("forward.request_failed", request=request, method=method)
            error: JsonObject = (
                {"code": known.code, "message": str(known), "exit": known.exit_code}
                if known is not None
                else {
                    "code": "internal",
                    "message": f"internal error on node {self.lease.name}: "
                    f"{type(exc).__name__}: {exc}; this is a bug in sessiond",
                    "exit": 70,
                }
            )
            reply = {"ok": False, "error": error}
        log.info("forward.carried", request=request, method=method, ok=reply["ok"])
        await asyncio.to_thread(self.requests.answer, request, reply)
