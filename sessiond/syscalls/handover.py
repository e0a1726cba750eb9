"""``migrate --to``: a session handed to another daemon in two phases, so that a
failure or a crash of either daemon at any point leaves exactly one live copy.

The phases (docs/architecture.md, "The hand-over"; the events in docs/events.md):

1. **prepare** — the source records ``migration.started`` (durably), streams its
   bundle, and the target creates the copy *arriving* (``migration.arriving``,
   written with the log in the one rename that creates it): held, not runnable,
   no triggers, nothing appended to it. The target answers once it is durable.
2. **commit** (at the source) — ``session.migrated`` and ``terminated(migrated)``,
   durably. From here the target's copy is the session; before it, the source's.
3. **finish** (at the target) — told ``handover.finish``, the target records
   ``migration.finished`` and the copy becomes what it was at the source.

A prepare that fails records ``migration.aborted`` at the source (its copy stays
live) and the target is told ``handover.abort``: it drops its copy
(``migration.discarded``; the folder goes to ``discarded/`` in the state dir).

Who settles what after a crash: the source keeps a marker per hand-over
(``handovers/<id>.json`` in its state dir) until the target has acknowledged how it
ended, and tells it again at start-up and then with a growing delay; a source that
restarts with a hand-over started but not committed aborts it. The target asks
the source (``handover.status``) about every copy still arriving, at start-up and
then with a growing delay. An arriving copy whose source is gone for good is
settled by an operator: ``resolve --accept`` or ``--discard``, refused when the
source can still answer otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import structlog

from sessiond.codec import decode_line
from sessiond.errors import Refused
from sessiond.log.bundle import export_paced, import_session
from sessiond.log.event_data import (
    EventData,
    LifecycleChanged,
    MigrationAborted,
    MigrationArriving,
    MigrationDiscarded,
    MigrationFinished,
    MigrationStarted,
    SessionMigrated,
)
from sessiond.log.store.base import Draft
from sessiond.log.store.durable import private_dir, write_durable
from sessiond.replies import Arrived, Discarded, HandoverAnswer, SessionDetail, Who, who_fields
from sessiond.runs.context import RunContext
from sessiond.syscalls.views import detail
from sessiond.table import lifecycle
from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec, spec_to_toml

log = structlog.get_logger(__name__)

FIRST_ASK = 5.0  # seconds before a target first asks the source itself
MOST_BETWEEN = 60.0  # the longest wait between two tries
TIMEOUT = 30.0  # one daemon-to-daemon call


class Handovers:
    """Both ends of every hand-over: the source's and the target's."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.outgoing: set[str] = set()  # hand-overs this daemon is sending now
        self.retrying: dict[str, asyncio.Task[None]] = {}  # by hand-over id
        self.first_ask = FIRST_ASK

    @property
    def markers(self) -> Path:
        return self.ctx.config.state_dir / "handovers"

    # --- the source ------------------------------------------------------------------

    async def send(self, s: Session, to: Path) -> str:
        """Phases 1 and 2 for ``s`` (its lock held, no run): prepare at ``to``, then
        commit here. Raises Refused (after recording ``migration.aborted``) when the
        target did not take it; returns the hand-over's id once committed."""
        from sessiond.wire import RemoteError, send_bundle_async

        h = secrets.token_hex(16)
        # Before anything is sent: until the target acknowledges how the hand-over
        # ended, this marker says it must be told (at start-up, after a crash).
        private_dir(self.markers)
        marker = {"session": s.name, "handover": h, "to": str(to)}
        write_durable(self.markers / f"{h}.json", orjson.dumps(marker))
        await self.ctx.table.append(s, MigrationStarted(handover=h, to=str(to)))
        self.outgoing.add(h)
        try:
            self.ctx.faults.point("migrate-after-started")
            outbox = private_dir(self.ctx.config.state_dir / "outbox")
            bundle = outbox / f"{s.name}.{h}.bundle"
            offer = {"id": h, "source": str(self.ctx.config.socket)}
            try:
                await export_paced(self.ctx.store, s.name, bundle, upto=s.journal.state.seq)
                # the bytes cross the socket: the target reads no path of ours
                await send_bundle_async(to, bundle, {"name": s.name, "handover": offer})
            except Exception as exc:  # not committed, whatever went wrong: abort
                if isinstance(exc, RemoteError):
                    why = f"the daemon at {to} did not take session {s.name!r}: {exc.message}"
                elif isinstance(exc, OSError):
                    why = f"cannot reach the daemon at {to}: {exc.strerror or exc}; is it running?"
                else:
                    why = f"the hand-over failed here: {type(exc).__name__}: {exc}"
                await self.ctx.table.append(s, MigrationAborted(handover=h, to=str(to), reason=why))
                self.ctx.spawn(self.tell(h))  # it may hold a copy all the same: drop it
                if isinstance(exc, RemoteError | OSError):
                    raise Refused(f"{why} (session {s.name!r} stays here, unchanged)") from exc
                raise
            finally:
                bundle.unlink(missing_ok=True)
            self.ctx.faults.point("migrate-after-prepare")
            # The commit: both lines in one write, durable before anything is told.
            await self._commit(s, h, to)
            self.ctx.faults.point("migrate-after-commit")
        finally:
            self.outgoing.discard(h)
        return h

    async def tell(self, h: str) -> bool:
        """Tell the target how hand-over ``h`` ended (finish or abort), from the
        marker; True once it acknowledged (the marker is then removed). Retried
        with a growing delay while it cannot be reached."""
        from sessiond.wire import RemoteError, call_async

        path = self.markers / f"{h}.json"
        try:
            marker = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return True  # told already (or never begun)
        name, to = marker["session"], Path(marker["to"])
        s = self.ctx.table.sessions.get(name)
        phase = _phase(s, h, "source")
        if phase == "started":
            if h in self.outgoing:
                return False  # being sent now: its own end tells
            assert s is not None
            async with s.lock:  # a crash cut it off before the commit: not committed
                if _phase(s, h, "source") == "started":
                    await self.ctx.table.append(
                        s,
                        MigrationAborted(
                            handover=h,
                            to=str(to),
                            reason="the daemon stopped during the hand-over; this copy stays",
                        ),
                    )
            phase = "aborted"
        method = "handover.finish" if phase == "committed" else "handover.abort"
        try:
            answer = await call_async(to, method, {"name": name, "handover": h}, TIMEOUT)
        except (OSError, RemoteError, TimeoutError) as exc:
            log.info("handover.unanswered", session=name, handover=h, to=str(to), error=str(exc))
            self._retry(h, self.tell)
            return False
        result = answer.get("result") if isinstance(answer, dict) else None
        if method == "handover.finish" and result != "finished":
            log.warning("handover.lost", session=name, handover=h, to=str(to), answer=result)
        if method == "handover.abort" and result == "finished":
            # an operator accepted the copy there while this daemon was away
            log.warning("handover.accepted_there", session=name, handover=h, to=str(to))
        log.info("handover.told", session=name, handover=h, to=str(to), answer=result)
        path.unlink(missing_ok=True)
        return True

    async def status(self, name: str, h: str) -> HandoverAnswer:
        """``handover.status``, asked by a target: how did hand-over ``h`` end here?
        committed | aborted | pending (being sent now) | unknown."""
        s = self.ctx.table.sessions.get(name)
        if s is None or s.journal_or_none is None:
            return {"result": "unknown"}
        hv = s.journal.state.handover
        if hv is None or hv["role"] != "source":
            return {"result": "unknown"}
        if hv["id"] != h:
            # A later hand-over began here, and a committed one is always the last:
            # this one ended without a commit (if it was ever ours).
            return {"result": "aborted"}
        phase = hv["phase"]
        return {"result": "pending" if phase == "started" else phase}

    # --- the target ------------------------------------------------------------------

    async def arrive(self, path: str, name: str | None, offer: dict[str, str]) -> Arrived:
        """Phase 1 at the target: the bundle becomes a copy held ``arriving``."""
        h, source = offer["id"], offer["source"]

        def arriving(lines: list[bytes]) -> list[EventData]:
            was = _last_state(lines)
            reason = f"arriving from {source}: held until the source commits the hand-over"
            change = LifecycleChanged.model_validate(
                {"from": was, "to": "arriving", "reason": reason}
            )
            return [MigrationArriving(handover=h, source=source, restore=was), change]

        journal = await import_session(
            self.ctx.store,
            Path(path),
            name=name,
            durability=self.ctx.config.durability,
            then=arriving,
        )
        s = self._adopt(journal)
        self.ctx.faults.point("arrive-after-prepare")
        self._retry(h, self._asker(s.name), first=self.first_ask)
        return {"session": s.name, "state": s.state, "handover": h}

    def _adopt(self, journal: Any) -> Session:
        spec_text = self.ctx.store.read_spec(journal.session)
        spec = parse_spec(spec_text, base=Path("/"), source="bundle") if spec_text else None
        if spec is not None and spec.name != journal.session:
            spec = spec.model_copy(update={"name": journal.session})
            self.ctx.store.write_spec(journal.session, spec_to_toml(spec))
        s = Session(journal.session, journal, spec, spec_text)
        self.ctx.table.adopt(s)
        return s

    async def finish(
        self, name: str, h: str, *, by: str = "source", who: Who | None = None
    ) -> HandoverAnswer:
        """Phase 3 (``handover.finish``, or an operator's accept): the arriving copy
        becomes what it was at the source. Idempotent."""
        s = self.ctx.table.sessions.get(name)
        phase = _phase(s, h, "target")
        if s is None or phase not in ("arriving", "finished"):
            return {"result": "unknown"}
        async with s.lock:
            if _phase(s, h, "target") == "arriving":
                self.ctx.faults.point("arrive-before-finish")
                finished = MigrationFinished(handover=h, by=by, **who_fields(who))
                await self.ctx.table.append_many(s, [Draft(finished), Draft(self._live(s, by))])
                self.ctx.faults.point("arrive-after-finish")
        if self.ctx.triggers is not None:
            self.ctx.triggers.rearm(s)
        return {"result": "finished", "session": detail(s)}

    def _live(self, s: Session, by: str) -> LifecycleChanged:
        """The finish's lifecycle change: what the copy was at the source (a ``ready``
        or ``running`` one arrives not running, as an import does)."""
        hv = s.journal.state.handover
        assert hv is not None
        restore = hv["restore"]
        if restore in ("ready", "running"):
            restore = "sleeping" if s.spec is not None and s.spec.has_triggers else "created"
        whose = "the source committed" if by == "source" else "accepted by an operator"
        reason = f"arrived from {hv['peer']} ({whose}); a wake goes through the gate"
        return lifecycle.change(s.name, s.state, restore, why="arrive", reason=reason)

    async def _commit(self, s: Session, h: str, to: Path) -> None:
        """Phase 2 at the source: ``session.migrated`` and ``terminated(migrated)``
        in one durable write (one write: a crash keeps both or neither)."""
        end = lifecycle.change(
            s.name,
            s.state,
            "terminated",
            why="migrate",
            reason=f"migrated to {to}",
            outcome="migrated",
        )
        await self.ctx.table.append_many(
            s, [Draft(SessionMigrated(to=str(to), handover=h)), Draft(end)]
        )
        self.ctx.scheduler.queue.pop(s.name, None)
        if self.ctx.triggers is not None:
            self.ctx.triggers.disarm(s.name)

    async def discard(
        self,
        name: str,
        h: str,
        *,
        by: str = "source",
        reason: str = "the source aborted the hand-over",
        who: Who | None = None,
    ) -> HandoverAnswer:
        """``handover.abort`` (or an operator's discard): the arriving copy is dropped;
        its folder moves to ``discarded/`` (nothing is deleted by itself). A finished
        copy is live and stays."""
        s = self.ctx.table.sessions.get(name)
        phase = _phase(s, h, "target")
        if phase == "finished":
            return {"result": "finished"}
        if s is None or phase not in ("arriving", "discarded"):
            return {"result": "unknown"}
        async with s.lock:
            if _phase(s, h, "target") == "arriving":
                await self.ctx.table.append(
                    s, MigrationDiscarded(handover=h, by=by, reason=reason, **who_fields(who))
                )
            await self._drop(s, h)
        return {"result": "discarded", "session": name}

    async def _drop(self, s: Session, h: str) -> None:
        """Out of the table, its folder into ``discarded/`` (after its last event)."""
        self.ctx.table.sessions.pop(s.name, None)
        if s.journal_or_none is not None:
            await s.journal.close()
        where = private_dir(self.ctx.config.state_dir / "discarded")
        folder = self.ctx.store.sessions_dir / s.name
        os.rename(folder, where / f"{s.name}.{h}")
        log.warning("handover.discarded", session=s.name, handover=h, kept=str(where))

    async def ask(self, name: str, h: str) -> bool:
        """Ask the source how hand-over ``h`` ended, and settle the copy by its
        answer; True once settled (or no longer arriving)."""
        from sessiond.wire import RemoteError, call_async

        s = self.ctx.table.sessions.get(name)
        if _phase(s, h, "target") != "arriving":
            return True
        assert s is not None
        assert s.journal.state.handover is not None
        source = Path(s.journal.state.handover["peer"])
        try:
            answer = await call_async(
                source, "handover.status", {"name": name, "handover": h}, TIMEOUT
            )
        except (OSError, RemoteError, TimeoutError) as exc:
            log.info("handover.source_silent", session=name, source=str(source), error=str(exc))
            return False
        result = answer.get("result") if isinstance(answer, dict) else None
        if result == "committed":
            await self.finish(name, h)
            return True
        if result == "aborted":
            await self.discard(name, h)
            return True
        if result == "unknown":
            log.warning(
                "handover.unknown_at_source",
                session=name,
                source=str(source),
                hint=f"sessionctl resolve {name} --accept or --discard",
            )
        return False

    # --- an operator's answer ----------------------------------------------------------

    def resolving(
        self, resolve: Callable[..., Awaitable[SessionDetail]]
    ) -> Callable[..., Awaitable[SessionDetail | Discarded]]:
        """``resolve`` for every session: an arriving one is settled here, the rest
        by ``resolve`` (syscalls.approvals)."""

        async def resolve_any(
            name: str, option: str, by: str = "", *, who: Who | None = None
        ) -> SessionDetail | Discarded:
            s = self.ctx.table.get(name)
            if s.journal_or_none is not None and s.state == "arriving":
                return await self.settle(s, option, by, who)
            return await resolve(name, option, by, who=who)

        return resolve_any

    async def settle(
        self, s: Session, option: str, by: str, who: Who | None
    ) -> SessionDetail | Discarded:
        """``resolve --accept | --discard`` of an arriving copy: the source is asked
        first; only a source that cannot answer (or does not know the session) leaves
        the choice to the operator."""
        from sessiond.wire import RemoteError, call_async

        hv = s.journal.state.handover
        assert hv is not None
        h, source = hv["id"], hv["peer"]
        judge(s.name, source, option, "unknown")  # --rerun is refused before asking
        try:
            answer = await call_async(
                Path(source), "handover.status", {"name": s.name, "handover": h}, 10
            )
            said = answer.get("result") if isinstance(answer, dict) else None
        except (OSError, RemoteError, TimeoutError):
            said = None  # the source is gone: the operator decides
        if judge(s.name, source, option, said) == "finish":
            if said == "committed":  # as the source said: its finish, not a person's
                await self.finish(s.name, h)
            else:
                await self.finish(s.name, h, by="operator", who=who)
            return detail(s)
        if said == "aborted":
            reason = "the source aborted the hand-over"
            await self.discard(s.name, h, reason=reason)
        else:
            person = (who["user"] if who is not None else "") or by or "an operator"
            reason = f"dropped by {person}: the source at {source} did not answer"
            await self.discard(s.name, h, by="operator", reason=reason, who=who)
        kept = self.ctx.config.state_dir / "discarded" / f"{s.name}.{h}"
        return {"name": s.name, "state": "discarded", "reason": f"{reason}; kept in {kept}"}

    # --- start-up ------------------------------------------------------------------

    async def recover(self) -> None:
        """At start-up, before triggers are armed: settle in the logs what a crash
        left half done (a commit without its lifecycle change, a discard without its
        move), so that no copy runs that should not."""
        for s in list(self.ctx.table):
            if s.journal_or_none is None or s.journal.state.handover is None:
                continue
            hv = s.journal.state.handover
            if hv["role"] == "source" and hv["phase"] == "started":
                # cut off before its commit: this copy stays the session; the target is
                # told to drop whatever it holds (resume, from the marker)
                marker = self.markers / f"{hv['id']}.json"
                if not marker.exists():
                    private_dir(self.markers)
                    info = {"session": s.name, "handover": hv["id"], "to": hv["peer"]}
                    write_durable(marker, orjson.dumps(info))
                await self.ctx.table.append(
                    s,
                    MigrationAborted(
                        handover=hv["id"],
                        to=hv["peer"],
                        reason="the daemon stopped during the hand-over; this copy stays",
                    ),
                )
            elif hv["role"] == "source" and hv["phase"] == "committed" and s.state != "terminated":
                await self._commit_end(s, hv["peer"])
            elif hv["role"] == "target" and hv["phase"] == "finished" and s.state == "arriving":
                await self.ctx.table.append(s, self._live(s, "source"))
            elif hv["role"] == "target" and hv["phase"] == "discarded":
                await self._drop(s, hv["id"])

    async def _commit_end(self, s: Session, to: str) -> None:
        """A commit whose second line a power cut took: the session ends as migrated."""
        await self.ctx.transition(
            s, "terminated", why="migrate", reason=f"migrated to {to}", outcome="migrated"
        )

    def resume(self) -> None:
        """Once the socket serves: tell targets what they have not heard, and ask
        the sources of the copies still arriving."""
        for marker in sorted(self.markers.glob("*.json")) if self.markers.is_dir() else ():
            h = marker.stem
            self.ctx.spawn(self._first_try(h, self.tell))
        for s in self.ctx.table:
            if s.journal_or_none is not None and s.state == "arriving" and s.journal.state.handover:
                self.ctx.spawn(self._first_try(s.journal.state.handover["id"], self._asker(s.name)))

    def _asker(self, name: str) -> Callable[[str], Awaitable[bool]]:
        async def ask(h: str) -> bool:
            return await self.ask(name, h)

        return ask

    async def _first_try(self, h: str, attempt: Callable[[str], Awaitable[bool]]) -> None:
        if not await attempt(h):
            self._retry(h, attempt)

    def _retry(self, h: str, attempt: Callable[[str], Awaitable[bool]], first: float = 1.0) -> None:
        """Try ``attempt(h)`` again after ``first`` seconds, then ever more rarely,
        until it returns True. One at a time per hand-over."""
        if h in self.retrying:
            return

        async def again() -> None:
            delay = first
            try:
                while True:
                    await asyncio.sleep(delay)
                    with contextlib.suppress(Refused):
                        if await attempt(h):
                            return
                    delay = min(delay * 2, MOST_BETWEEN)
            finally:
                self.retrying.pop(h, None)

        self.retrying[h] = asyncio.ensure_future(again())


def judge(name: str, source: str, option: str, said: str | None) -> str:
    """What an operator's ``resolve --accept | --discard`` of an arriving copy does,
    given the source's answer (``said``: committed, aborted, pending, unknown, or
    None when it cannot be reached): "finish" or "discard", or Refused when the
    source's answer says the choice would leave no live copy, or two."""
    if option not in ("accept", "discard"):
        raise Refused(
            f"session {name!r} is arriving from {source} (a hand-over not finished): there "
            "is no step to run again; --accept makes this copy live, --discard drops it"
        )
    if said == "pending":
        raise Refused(
            f"the daemon at {source} is handing session {name!r} over right now; it "
            "finishes or drops this copy itself: wait for it"
        )
    if said == "committed" and option == "discard":
        raise Refused(
            f"the daemon at {source} committed the hand-over of {name!r}: this copy is the "
            "only live one; --accept it (then cancel it if it should end)"
        )
    if said == "aborted" and option == "accept":
        raise Refused(
            f"the daemon at {source} aborted the hand-over of {name!r}: its copy there is "
            "the live one; drop this copy with --discard"
        )
    # committed and accept, aborted and discard: as the source said; gone (None) or
    # not knowing the session ("unknown"): the operator's word settles it
    return "finish" if option == "accept" else "discard"


def _phase(s: Session | None, h: str, role: str) -> str | None:
    """The phase of hand-over ``h`` in session ``s``, where ``s`` is its ``role``."""
    if s is None or s.journal_or_none is None:
        return None
    hv = s.journal.state.handover
    if hv is None or hv["id"] != h or hv["role"] != role:
        return None
    phase: str = hv["phase"]
    return phase


def _last_state(lines: list[bytes]) -> str:
    """The state the bundle's log ends in (its last ``lifecycle.changed``)."""
    for line in reversed(lines):
        record = decode_line(line[:-1])
        if record is not None and record["type"] == "lifecycle.changed":
            state: str = record["data"]["to"]
            return state
    return "created"
