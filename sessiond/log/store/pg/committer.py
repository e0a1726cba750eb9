"""Group commit across sessions: one fenced statement, one commit, for the appends
of many sessions of a node.

Each open log has at most one batch of its own in flight (pglog.py); the
committer gathers the batches of every log that are waiting and writes them in
one statement. That statement is still the fence, per session: it updates each
session's row only where the epoch is the one its log was opened under, the
row's end is where the log thinks it is, and the owner is this node's
incarnation with a lease unexpired by ``now()``; it inserts the events of the
sessions whose update matched, from that update's ``RETURNING``. A session
whose fence fails gets nothing inserted while the others commit: its log
fails (:class:`~sessiond.errors.Fenced`).

A commit costs about one WAL flush whatever it carries, so on a disk whose
flush takes milliseconds, many sessions' appends share it (DESIGN.md section
10's appends/s from three nodes). At most ``parallel`` statements are in
flight; what arrives meanwhile waits for the next.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from psycopg_pool import AsyncConnectionPool

from sessiond.log.store.pg.nodes import Lease

APPEND_MANY = """
WITH req AS (
    SELECT * FROM unnest(%(sessions)s::text[], %(epochs)s::bigint[], %(afters)s::bigint[],
                         %(lasts)s::bigint[], %(last_ids)s::text[])
        AS r(session, epoch, after, last, last_id)
), fence AS (
    UPDATE sessions AS s SET last_seq = req.last, last_id = req.last_id
    FROM req, nodes AS n
    WHERE s.name = req.session AND s.epoch = req.epoch AND s.last_seq = req.after
      AND s.owner = %(node)s AND n.name = s.owner AND n.incarnation = %(inc)s
      AND n.lease_until > now()
    RETURNING s.name
)
INSERT INTO events (session, seq, id, line)
SELECT e.session, e.seq, e.id, e.line
FROM unnest(%(ev_sessions)s::text[], %(seqs)s::bigint[], %(ids)s::text[], %(lines)s::bytea[])
    AS e(session, seq, id, line)
JOIN fence ON fence.name = e.session
RETURNING session
"""


@dataclass
class Batch:
    """One log's events to commit: what its fence expects and what it adds."""

    session: str
    epoch: int
    after: int
    seqs: list[int]
    ids: list[str]
    lines: list[bytes]
    done: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Committer:
    """The node's group commit; ``await submit(batch)`` is True once the batch is
    committed, False when its session's fence refused it."""

    def __init__(self, pool: AsyncConnectionPool, lease: Lease, parallel: int = 2) -> None:
        self._pool = pool
        self._lease = lease
        self._queue: list[Batch] = []
        self._slots = asyncio.Semaphore(parallel)
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, batch: Batch) -> bool:
        self._queue.append(batch)
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())
        return await batch.done

    async def _run(self) -> None:
        try:
            while self._queue:
                await self._slots.acquire()
                await asyncio.sleep(0)  # let the logs that are ready join this commit
                batches, self._queue = self._queue, []
                if not batches:
                    self._slots.release()
                    continue
                asyncio.get_running_loop().create_task(self._commit(batches))
        finally:
            self._runner = None

    async def _commit(self, batches: list[Batch]) -> None:
        try:
            params = {
                "sessions": [b.session for b in batches],
                "epochs": [b.epoch for b in batches],
                "afters": [b.after for b in batches],
                "lasts": [b.seqs[-1] for b in batches],
                "last_ids": [b.ids[-1] for b in batches],
                "ev_sessions": [b.session for b in batches for _ in b.seqs],
                "seqs": [s for b in batches for s in b.seqs],
                "ids": [i for b in batches for i in b.ids],
                "lines": [line for b in batches for line in b.lines],
                "node": self._lease.name,
                "inc": self._lease.incarnation,
            }
            async with self._pool.connection() as conn:
                cur = await conn.execute(APPEND_MANY, params)
                landed: dict[str, int] = {}
                for (session,) in await cur.fetchall():
                    landed[session] = landed.get(session, 0) + 1
            for b in batches:
                if not b.done.done():
                    b.done.set_result(landed.get(b.session, 0) == len(b.seqs))
        except BaseException as exc:
            for b in batches:
                if not b.done.done():
                    b.done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._slots.release()
