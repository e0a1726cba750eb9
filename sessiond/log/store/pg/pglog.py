"""One session's log in PostgreSQL, every append fenced in one statement.

Writes are assigned their seqs at once, in the event loop (as the files backend
does), and made durable by a group commit: one statement carries every event
written since the last one (and those of the node's other logs that wait at the
same time: committer.py). That statement is the fence (docs/design.md section 10):

- it updates the session's row only where the epoch is still the one this log
  was opened under, the row's end is where this log thinks it is, and the
  owner is this node's incarnation with a lease unexpired by the database's
  ``now()``;
- it inserts the events from that update's ``RETURNING``, so where the update
  matched no row, nothing is inserted.

A separate ``SELECT`` of the epoch followed by an ``INSERT`` would be no fence
under READ COMMITTED: a claim can commit between them. A refused append fails
the log (:class:`~sessiond.errors.Fenced`): the node must open it again, under
a new claim, through replay and the gate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import psycopg

from sessiond.codec import Clock, decode_line
from sessiond.errors import CommitLost, Fenced, HandedOver, LogCorrupt, LogFailed
from sessiond.log.pace import OffLoop
from sessiond.log.store.base import (
    START,
    Draft,
    Durability,
    EventLog,
    LogPosition,
    Pending,
    PositionMismatch,
    Record,
    Repair,
)
from sessiond.log.store.lines import RecordBuilder
from sessiond.log.store.pg.committer import Batch, Committer
from sessiond.log.store.pg.nodes import Lease
from sessiond.log.store.pg.once import Keys, KeysOf, no_keys
from sessiond.log.store.pg.reach import is_gone

READ_BATCH = 1000  # events a query of a reader fetches at most


def read_events(
    query: Callable[[str, Mapping[str, object]], list[tuple[Any, ...]]],
    session: str,
    since: int,
    upto: int | None,
) -> Iterator[tuple[Record, bytes]]:
    """(record, line without newline) of each event ``since``..``upto``, verified.

    Pages by seq (no transaction held open between pages, so a reader never
    blocks a writer). A line that fails its checksum or breaks the seq order is
    corruption: the database had it from a node that checked it."""
    expected = max(since, 1)
    while upto is None or expected <= upto:
        rows = query(
            "SELECT seq, line FROM events WHERE session = %(s)s AND seq >= %(from)s "
            "AND (%(upto)s::bigint IS NULL OR seq <= %(upto)s) ORDER BY seq LIMIT %(n)s",
            {"s": session, "from": expected, "upto": upto, "n": READ_BATCH},
        )
        if not rows:
            return
        for seq, raw in rows:
            line = bytes(raw)
            record = decode_line(line)
            if record is None or seq != expected or record.get("seq") != seq:
                why = "fails its checksum" if record is None else f"is not seq {expected}"
                raise LogCorrupt(f"session {session} in PostgreSQL", seq, 0, why)
            yield record, line
            expected += 1
        if len(rows) < READ_BATCH:
            return


class PgEventLog(EventLog):
    """The open log of one session this node has claimed under ``epoch``."""

    def __init__(
        self,
        session: str,
        durability: Durability,
        clock: Clock,
        *,
        committer: Committer,
        lease: Lease,
        epoch: int,
        query: Callable[[str, Mapping[str, object]], list[tuple[Any, ...]]],
        on_close: Callable[[], Awaitable[None]],
        once: Callable[[Batch, Keys], Awaitable[bool]] | None = None,
        keys_of: KeysOf = no_keys,
    ) -> None:
        self.session = session
        # Durability is PostgreSQL's (synchronous_commit): an append is acknowledged
        # once its commit is. "os" is accepted for a config shared with file nodes.
        self.durability = durability
        self.epoch = epoch
        self._committer = committer
        self._lease = lease
        self._query = query
        self._on_close = on_close
        # a batch with a cron wake, a carried message or the session's end commits
        # in a transaction of its own, with its keys (once.py)
        self._once = once
        self._keys_of = keys_of  # which records are such (the store's caller says)
        self._once_tasks: set[asyncio.Task[None]] = set()
        self._builder = RecordBuilder(session, clock)
        self._builder.stamp = {"node": lease.name, "epoch": epoch}
        self._pos = START
        self._durable = START
        self._queue: list[Record] = []
        self._lines: list[bytes] = []
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wanted = False  # the committer will take() this log
        self._inflight: Batch | None = None  # at most one batch in flight
        self._idle = asyncio.Event()  # neither: close() may end
        self._idle.set()
        self._recovered = False
        self._closed = False
        self._failed: str | None = None
        self._failed_as: type[LogFailed] = LogFailed  # CommitLost: the database went away

    @property
    def position(self) -> LogPosition:
        return self._pos

    @property
    def repair(self) -> Repair | None:
        return None  # a commit is whole or absent: nothing is ever torn

    def recover(self, after: LogPosition = START) -> Iterator[Record]:
        # queries: read off the loop by those that can (sessiond.log.pace.OffLoop)
        return OffLoop(self._recover(after))

    def _recover(self, after: LogPosition) -> Iterator[Record]:
        if self._recovered:
            raise RuntimeError("recover() runs once per open log")
        if after.seq:
            rows = self._query(
                "SELECT id FROM events WHERE session = %(s)s AND seq = %(seq)s",
                {"s": self.session, "seq": after.seq},
            )
            if not rows or rows[0][0] != after.last_id:
                raise PositionMismatch(f"seq {after.seq} is not in the log with that id")
        pos = after
        for record, _line in read_events(self._query, self.session, after.seq + 1, None):
            pos = LogPosition(record["seq"], record["seq"], record["id"])
            yield record
        self._pos = self._durable = pos
        self._recovered = True

    def adopt(self, position: LogPosition) -> None:
        """Start appending after ``position`` without reading (a log just created)."""
        self._pos = self._durable = position
        self._recovered = True

    def write_many(self, drafts: Sequence[Draft]) -> Pending:
        if not self._recovered:
            raise RuntimeError("recover() the log before appending to it")
        if self._closed and self.closed_why is not None:
            raise HandedOver(
                f"session {self.session!r} {self.closed_why} while this request waited for "
                "it; nothing was done. Ask again: any node's socket reaches it"
            )
        if self._closed:
            raise LogFailed(f"the log of session {self.session!r} is closed; nothing was written")
        if self._failed is not None:
            raise self._failed_as(
                f"the log of session {self.session!r} takes no appends: {self._failed}"
            )
        records, buf = self._builder.build(self._pos.seq, drafts)
        if not records:
            return Pending([], self._pos)
        self._queue.extend(records)
        self._lines.extend(buf.split(b"\n")[:-1])
        last = records[-1]
        self._pos = LogPosition(last["seq"], last["seq"], last["id"])
        return Pending(records, self._pos)

    async def sync(self, pending: Pending) -> None:
        if self._durable.seq >= pending.position.seq:
            return
        if self._failed is not None:
            raise self._failed_as(f"the log of session {self.session!r}: {self._failed}")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((pending.position.seq, done))
        self._want()
        await done

    def _want(self) -> None:
        """Group commit: the node's committer takes everything written so far
        (with other logs' appends) in its next statement."""
        if not self._wanted and self._inflight is None:
            self._wanted = True
            self._idle.clear()
            self._committer.want(self)

    def take(self) -> Batch | None:
        self._wanted = False
        if self._failed is not None or self._inflight is not None or not self._queue:
            self._settled()
            return None
        records, lines = self._queue, self._lines
        self._queue, self._lines = [], []
        batch = self._inflight = Batch(
            self.session,
            self.epoch,
            self._durable.seq,
            [r["seq"] for r in records],
            [r["id"] for r in records],
            lines,
        )
        keys = self._keys_of(self.session, records) if self._once is not None else None
        if keys:
            # not the group commit's: one transaction of its own with the fire's
            # dedup keys (once.py); it settles this batch as the committer would
            task = asyncio.get_running_loop().create_task(self._commit_once(batch, keys))
            self._once_tasks.add(task)
            task.add_done_callback(self._once_tasks.discard)
            return None
        return batch

    async def _commit_once(self, batch: Batch, keys: Keys) -> None:
        assert self._once is not None
        outcome: bool | BaseException
        try:
            outcome = await self._once(batch, keys)
        except Exception as exc:  # AlreadyFired (a Fenced), or the database's error
            outcome = exc
        self.settle(batch, outcome)

    def settle(self, batch: Batch, outcome: bool | BaseException) -> None:
        self._inflight = None
        if outcome is True:
            self._durable = LogPosition(batch.seqs[-1], batch.seqs[-1], batch.ids[-1])
            waiting = []
            for target, waiter in self._waiters:
                if target <= self._durable.seq:
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    waiting.append((target, waiter))
            self._waiters = waiting
            if waiting:
                self._want()  # written while this batch was in flight
        elif outcome is False:
            self._fail(
                Fenced(
                    f"node {self._lease.name!r} may no longer write to session "
                    f"{self.session!r} (epoch {self.epoch}): its lease lapsed or another "
                    "node claimed the session; nothing was written"
                )
            )
        else:
            self._fail(outcome)
        self._settled()

    def _settled(self) -> None:
        if not self._wanted and self._inflight is None:
            self._idle.set()

    def _fail(self, exc: BaseException) -> None:
        """Fail the log and every waiter: after a refused or lost commit the log's
        end is not known here any more; only a new claim and a replay find it."""
        if isinstance(exc, Fenced):
            self._failed = str(exc)
            error: LogFailed = exc
        elif is_gone(exc):
            why = " ".join(str(exc).split()) or type(exc).__name__
            self._failed = (
                f"the cluster's database went away during a commit ({why}); whether it was "
                "written is known when the log is opened again (the node's next start does)"
            )
            error = CommitLost(f"the log of session {self.session!r}: {self._failed}")
            self._failed_as = CommitLost  # and every later append: the database went away
        else:
            why = "a database error" if isinstance(exc, psycopg.Error) else "an error"
            self._failed = f"{why} during a commit ({exc!r}); reopen the log to know its end"
            error = LogFailed(f"the log of session {self.session!r}: {self._failed}")
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self._waiters.clear()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._idle.wait()
        await self._on_close()
