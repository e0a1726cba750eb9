"""The inspection syscalls: ping, ps, show, log, replay, gate.

They read the process table and the logs and record nothing, so they need no
run machinery: only the table, the store and the configuration.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, cast

import orjson

from sessiond import __version__
from sessiond.codec import TRAILER_LEN
from sessiond.errors import InvalidInput, NoSuchSession
from sessiond.log.pace import Pacer, fetched
from sessiond.log.store.base import Record
from sessiond.logquery import LogQuery
from sessiond.replies import GateReport, Ping, PsRow, SessionDetail, WaitingSession
from sessiond.runs.context import RunContext
from sessiond.sandboxconfig import dynamic_uids_on
from sessiond.syscalls.models import Models
from sessiond.syscalls.seams import Placement
from sessiond.syscalls.views import detail, gate_report, replay_view


class Inspection:
    """What a person or a program may look at: the table, a session, its log."""

    def __init__(
        self, ctx: RunContext, placement: Placement | None = None, models: Models | None = None
    ) -> None:
        self.ctx = ctx
        self.placement = placement  # a cluster node's: the sessions no live node runs
        self.models = models or Models(ctx)

    async def ping(self) -> Ping:
        return {
            "version": __version__,
            "protocol": 1,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.ctx.table.started, 3),
            "sessions": len(self.ctx.table) + len(self.ctx.table.pending),
            "state_dir": str(self.ctx.config.state_dir),
        }

    async def ps(self) -> list[PsRow]:
        from sessiond.table.sessions import summary

        fn = self.ctx.table.next_wake_fn
        table = self.ctx.table
        rows = [summary(s, fn) for s in table]
        if table.pending:  # a start-up still opening sessions: theirs from the table index
            rows += [cast(PsRow, dict(row)) for row in table.pending.values()]
        rows.sort(key=lambda r: str(r["name"]))
        cluster = self.ctx.config.cluster
        if cluster.dsn is not None:  # a cluster node's rows say which node runs them
            for row in rows:
                row["node"] = cluster.node
        boundary = "sandbox" if self.ctx.config.run.sandbox == "on" else "off"
        waiting = self.models.positions()
        for row in rows:  # where runs are confined, or that they are not
            row["boundary"] = boundary
            if waiting:  # a call waits for the model: how many are ahead of it
                self.models.mark(row, waiting)
        if self.placement is None:
            return rows
        have = {r["name"] for r in rows}
        rows += [w for w in await self.placement.waiting() if w["name"] not in have]
        return sorted(rows, key=lambda r: str(r["name"]))

    async def show(self, name: str) -> SessionDetail | WaitingSession:
        try:
            s = self.ctx.table.get(name)
        except NoSuchSession:
            # on a cluster node: one no live node runs says what it waits for
            waiting = await self.placement.show_waiting(name) if self.placement else None
            if waiting is None:
                raise
            return waiting
        shown = detail(s)
        run = s.spec.run if s.spec is not None else None
        config = self.ctx.config.run
        shown["boundary"] = {
            "sandbox": config.sandbox,
            "network": (run.network if run is not None else None) or config.network,
            "uid": self.ctx.boundary.uids.peek(name) if dynamic_uids_on(self.ctx.config) else None,
        }
        self.models.mark(shown, self.models.positions())
        return shown

    def query(
        self,
        since: int | str,
        types: list[str] | None,
        grep: str | None,
        until: str | None = None,
    ) -> LogQuery:
        """The filter a ``log`` request asks for, or ``invalid_input`` naming what is wrong."""
        try:
            return LogQuery.of(since, list(types or ()), grep, self.ctx.store.clock(), until)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

    async def log_(
        self,
        name: str,
        since: int | str = 1,
        types: list[str] | None = None,
        limit: int = 0,
        *,
        grep: str | None = None,
        after: int = 0,
    ) -> list[Record]:
        """A session's events from ``since`` (a seq or a time) and after seq ``after``,
        of ``types``, matching ``grep``; only the last ``limit`` if it is not 0."""
        return [
            orjson.loads(line)
            for line in await self.log_encoded(name, since, types, limit, grep=grep, after=after)
        ]

    async def log_encoded(
        self,
        name: str,
        since: int | str = 1,
        types: list[str] | None = None,
        limit: int = 0,
        *,
        grep: str | None = None,
        after: int = 0,
        first: int = 0,
        until: str | None = None,
    ) -> list[bytes]:
        """:meth:`log_`, each event as its JSON text (what the answer sends); with
        ``first``, only the first N that match (a page: reading stops there).

        Read a slice at a time, and what is kept is text, not parsed events: a
        100,000-event answer held as dicts made the garbage collector walk them all
        (stalls of 0.2 s); bytes it does not walk.
        """
        s = self.ctx.table.get(name)
        q = self.query(since, types, grep, until)
        start = max(q.first_seq, after + 1)
        # What the log holds now: appends that come while it is read are not this
        # answer's (a follower gets them), and the loop serves others between slices.
        end = s.journal.state.seq if s.journal_or_none is not None else None
        kept: deque[bytes] | list[bytes] = deque(maxlen=limit) if limit else []
        pacer = Pacer()
        lines = self.ctx.store.read_lines(name, upto=end)
        try:
            async for record, line in fetched(lines):
                if record["seq"] >= start and q.match(record):
                    kept.append(line[: -TRAILER_LEN - 1])  # its JSON, without " crc32\n"
                    if first and len(kept) >= first:
                        break  # a page is full: the rest of the log is not read
                if pacer.due():
                    await pacer.pause()
        finally:
            getattr(lines, "close", lambda: None)()  # a reader left mid-log lets go of its file
        return list(kept)

    async def replay(
        self,
        name: str,
        upto: int | None = None,
        view: str = "state",
        cursor: int | None = None,
        limit: int | None = None,
    ) -> Any:
        s = self.ctx.table.get(name)
        live = None
        if s.journal_or_none is not None and upto in (None, s.journal.state.seq):
            upto = s.journal.state.seq  # the log as it is now, not as it grows meanwhile
            if view == "messages":
                live = s.journal.state  # its fold is the state: no need to fold again
        return await replay_view(
            name,
            lambda: self.ctx.store.read(name, upto=upto),
            view,
            live=live,
            cursor=cursor,
            limit=limit,
        )

    async def gate(self, name: str) -> GateReport:
        s = self.ctx.table.get(name)
        return gate_report(
            s,
            self.ctx.now(),
            artifacts=self.ctx.store.artifacts(name),
            profiles=self.ctx.config.profiles,
        )
