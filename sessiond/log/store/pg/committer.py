"""Group commit across sessions: one fenced statement, one commit, one round trip
for the appends of many sessions of a node.

A log with appends waiting for durability tells the committer it has something
(:meth:`Committer.want`); when a connection is free, the committer takes the
waiting events of every such log (:meth:`Source.take`, at most one batch in
flight per log) and writes them all in one statement. That statement is still
the fence, per session: it updates each session's row only where the epoch is
the one its log was opened under, the row's end is where the log thinks it is,
and the owner is this node's incarnation with a lease unexpired by ``now()``;
it inserts, for each session whose update matched, the events between the
row's old end and its new one, from that update's ``RETURNING``. A session
whose fence fails gets nothing inserted while the others commit: the statement
returns each session that landed with its new end, and each log learns its
own outcome
(:meth:`Source.settle`).

What this costs per commit, and why it is shaped so (bench/README.md has the
figures):

- the connections are the committer's own, taken from the pool once and kept:
  no checkout per commit;
- the arrays are packed in PostgreSQL's binary format (arrays.py), not dumped
  element by element;
- the statement returns one row per session that landed, not one per event;
- a commit starts from a plain callback once the loop has run what was ready
  (so the appends made in the same turn join it), not through a chain of tasks.

A commit costs about one WAL flush whatever it carries, so on a disk whose
flush takes milliseconds, many sessions' appends share it. At most ``parallel``
statements are in flight (one per connection); what arrives meanwhile waits
for the first connection to come back, and goes then, all of it at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg import AsyncConnection
from psycopg.types.numeric import Int8
from psycopg_pool import AsyncConnectionPool

from sessiond.errors import Fenced
from sessiond.log.store.pg.arrays import ByteaArray, Int8Array, TextArray
from sessiond.log.store.pg.nodes import Lease

# The fence's ``now()`` is when its statement started. A statement that then
# waited on a session's row lock (another transaction holding it: a scan, a
# claim, an operator's query) would land after its node's lease lapsed, which
# the fence exists to refuse. So each statement ends by looking at the lease
# again, once every row of the fence is updated (``waited`` counts them, so it
# comes after any wait): ``sessiond_lease_live`` (schema step 6) reads it in a
# snapshot of its own, sees a renewal committed meanwhile, compares it with the
# clock of that moment, and raises (SQLSTATE SD001) when it lapsed, which ends
# the statement with nothing of it written.
# The lease as the statement began is still running by the clock now: live, with
# no call (renewals only move it on); only an append that waited near or past it
# pays for the function's look.
LIVE = """(clock_timestamp() < (SELECT n.lease_until FROM nodes AS n
      WHERE n.name = %(node)s AND n.incarnation = %(inc)s)
    OR sessiond_lease_live(%(node)s, %(inc)s, w.n))"""
LAPSED = "SD001"

APPEND_MANY = (
    """
WITH fence AS (
    UPDATE sessions AS s SET last_seq = r.last, last_id = r.last_id
    FROM unnest(%(sessions)b::text[], %(epochs)b::bigint[], %(afters)b::bigint[],
                %(lasts)b::bigint[], %(last_ids)b::text[])
        AS r(session, epoch, after, last, last_id)
    WHERE s.name = r.session AND s.epoch = r.epoch AND s.last_seq = r.after
      AND s.owner = %(node)s
      AND EXISTS (SELECT 1 FROM nodes AS n WHERE n.name = %(node)s
                  AND n.incarnation = %(inc)s AND n.lease_until > now())
    RETURNING s.name, r.after, r.last
), written AS (
    INSERT INTO events (session, seq, id, line)
    SELECT e.session, e.seq, e.id, e.line
    FROM unnest(%(ev_sessions)b::text[], %(seqs)b::bigint[], %(ids)b::text[],
                %(lines)b::bytea[]) AS e(session, seq, id, line)
    JOIN fence AS f ON f.name = e.session AND e.seq > f.after AND e.seq <= f.last
), waited AS (SELECT count(*) AS n FROM fence)
SELECT f.name, f.last FROM fence AS f, waited AS w WHERE """
    + LIVE
    + """
"""
)

# The same fence for the commonest commit, one event of one session (a lone
# writer; an idle cluster): scalars instead of arrays to unnest and join, which
# costs the server about a third less CPU a commit (bench/README.md).
APPEND_ONE = (
    """
WITH fence AS (
    UPDATE sessions AS s SET last_seq = %(seq)s, last_id = %(id)s
    WHERE s.name = %(session)s AND s.epoch = %(epoch)s AND s.last_seq = %(after)s
      AND s.owner = %(node)s
      AND EXISTS (SELECT 1 FROM nodes AS n WHERE n.name = %(node)s
                  AND n.incarnation = %(inc)s AND n.lease_until > now())
    RETURNING s.name, s.last_seq
), written AS (
    INSERT INTO events (session, seq, id, line)
    SELECT f.name, f.last_seq, %(id)s, %(line)b FROM fence AS f
), waited AS (SELECT count(*) AS n FROM fence)
SELECT f.name, f.last_seq FROM fence AS f, waited AS w WHERE """
    + LIVE
    + """
"""
)


def lapsed_while_waiting(exc: BaseException, lease: Lease) -> BaseException:
    """``exc`` as the log should hear it: LIVE's refusal is a fence's."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate == LAPSED:
        return Fenced(
            f"node {lease.name!r}'s lease lapsed while this append waited in the "
            "database; nothing was written"
        )
    return exc


@dataclass
class Batch:
    """One log's events to commit: what its fence expects and what it adds
    (``seqs`` run on from ``after`` without a gap)."""

    session: str
    epoch: int
    after: int
    seqs: list[int]
    ids: list[str]
    lines: list[bytes]


class Source(Protocol):
    """An open log, as the committer sees it."""

    def take(self) -> Batch | None:
        """The events waiting to be committed (None: nothing, or a batch of this
        log is in flight already; it asks again when that one settles)."""

    def settle(self, batch: Batch, outcome: bool | BaseException) -> None:
        """``batch`` committed (True), was refused by its fence (False), or its
        fate is unknown (the error)."""


def statement(batches: list[Batch], lease: Lease) -> tuple[str, dict[str, object]]:
    """The fenced statement that commits ``batches`` (one per session), and its
    parameters."""
    if len(batches) == 1 and len(batches[0].seqs) == 1:
        (b,) = batches
        return APPEND_ONE, {
            "session": b.session,
            "epoch": Int8(b.epoch),
            "after": Int8(b.after),
            "seq": Int8(b.seqs[0]),
            "id": b.ids[0],
            "line": b.lines[0],
            "node": lease.name,
            "inc": Int8(lease.incarnation),
        }
    return APPEND_MANY, params(batches, lease)


def params(batches: list[Batch], lease: Lease) -> dict[str, object]:
    """:data:`APPEND_MANY`'s parameters for ``batches`` (one per session)."""
    return {
        "sessions": TextArray.of([b.session for b in batches]),
        "epochs": Int8Array.of([b.epoch for b in batches]),
        "afters": Int8Array.of([b.after for b in batches]),
        "lasts": Int8Array.of([b.seqs[-1] for b in batches]),
        "last_ids": TextArray.of([b.ids[-1] for b in batches]),
        "ev_sessions": TextArray.of([b.session for b in batches for _ in b.seqs]),
        "seqs": Int8Array.of([s for b in batches for s in b.seqs]),
        "ids": TextArray.of([i for b in batches for i in b.ids]),
        "lines": ByteaArray.of([line for b in batches for line in b.lines]),
        "node": lease.name,
        "inc": lease.incarnation,
    }


class Committer:
    """The node's group commit over ``parallel`` connections of its own."""

    def __init__(self, pool: AsyncConnectionPool, lease: Lease, parallel: int = 2) -> None:
        self._pool = pool
        self._lease = lease
        self._conns: list[AsyncConnection[Any] | None] = [None] * parallel
        self._free = list(range(parallel))
        self._wanting: list[Source] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.commits = 0  # statements that committed (the tests count them)

    def want(self, source: Source) -> None:
        """``source`` has appends waiting; it is taken in the next commit that starts."""
        self._wanting.append(source)
        if not self._scheduled:
            self._scheduled = True
            # After the callbacks that are ready now: the logs appended to in this
            # turn of the loop join the same commit.
            asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._scheduled = False
        if not self._free or not self._wanting:
            return  # a commit in flight starts the next when it is done
        wanting, self._wanting = self._wanting, []
        taken = [(source, batch) for source in wanting if (batch := source.take()) is not None]
        if not taken:
            return
        slot = self._free.pop()
        task = asyncio.get_running_loop().create_task(self._commit(slot, taken))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _commit(self, slot: int, taken: list[tuple[Source, Batch]]) -> None:
        batches = [batch for _, batch in taken]
        try:
            try:
                conn = self._conns[slot]
                if conn is None:
                    conn = self._conns[slot] = await self._pool.getconn()
                cur = await conn.execute(*statement(batches, self._lease))
                landed = {(name, last) for name, last in await cur.fetchall()}
            except BaseException as exc:
                exc = lapsed_while_waiting(exc, self._lease)
                for source, batch in taken:
                    source.settle(batch, exc)
                await self._give_back(slot)  # the pool discards it if it is broken
                raise
            self.commits += 1
            for source, batch in taken:
                source.settle(batch, (batch.session, batch.seqs[-1]) in landed)
        except Exception:
            pass  # each log has its error; the committer goes on for the others
        finally:
            self._free.append(slot)
            if self._wanting and not self._scheduled:
                self._start()

    async def _give_back(self, slot: int) -> None:
        conn, self._conns[slot] = self._conns[slot], None
        if conn is not None:
            await self._pool.putconn(conn)

    async def aclose(self) -> None:
        """Wait for the commits in flight, then return the connections to the pool."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))
        for slot in range(len(self._conns)):
            await self._give_back(slot)
