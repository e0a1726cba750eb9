"""Cron fires once for the whole cluster (docs/design.md section 10, "Wakes").

What a batch must commit once is its caller's word, not this module's: the
store is given a ``keys_of`` (sessiond.cluster.once reads the records: a cron
``wake.requested`` carries its schedule and fire time, a carried message its
row, a termination the row's end). When a batch has keys, it is not written by
the group commit but by one transaction of its own that

1. fences the session's row as every append does (epoch, end of the log, the
   owner's lease unexpired by ``now()``): the row stays locked to the commit, so
   no claim can pass in between;
2. inserts a dedup key per (session, schedule, fire time) into ``wakes``
   (``dedup`` is UNIQUE);
3. inserts the events.

All or nothing: the key exists exactly when the wake is in the log.

A message carried from another node (cluster/mailbox.py) is taken the same way:
its ``message.received`` names its row (``message_id`` ``cluster:<id>``), and
the batch that holds it marks the row taken in the same transaction. A node
killed after delivering it and before a separate mark would have left it to be
delivered again (a second wake, a second run); now the row is taken exactly
when the message is in the log, and a second delivery is refused whole.

A batch that terminates the session (``lifecycle.changed`` to ``terminated``)
commits here too, setting the row's ``ended`` in its fence: a send from another
node is then refused as on this one (mail.py); so does one that leaves
``terminated`` (a fork of a terminated session starts), clearing it. A copy
(fork, import) is made with ``ended`` as its copied events leave it
(pgstore.create). A node that
fires a time already fired (a new owner whose clock is behind the old one's,
catching up) has its write refused whole — :class:`AlreadyFired`, a
:class:`~sessiond.errors.Fenced` — and nothing of it lands. The timers
(sessiond.wake.timers) never schedule a fire the log already holds; this is the
database's guarantee behind theirs, whatever the clocks say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg_pool import AsyncConnectionPool

from sessiond.errors import Fenced
from sessiond.log.store.base import Record
from sessiond.log.store.pg.committer import LAPSED, LIVE, Batch, lapsed_while_waiting
from sessiond.log.store.pg.nodes import Lease

FENCE_ONE = (
    """
UPDATE sessions AS s SET last_seq = %(last)s, last_id = %(last_id)s,
    ended = coalesce(%(ended)s, s.ended)
FROM nodes AS n
WHERE s.name = %(s)s AND s.epoch = %(epoch)s AND s.last_seq = %(after)s
  AND s.owner = %(node)s AND n.name = s.owner AND n.incarnation = %(inc)s
  AND n.lease_until > now()
RETURNING s.name, """
    + LIVE.replace("w.n", "s.last_seq")
    + """
"""
)

# taken_at is set: a fired cron is no open wake for anyone to take
TAKE_KEYS = """
INSERT INTO wakes (session, kind, detail, dedup, taken_at)
SELECT %(s)s, 'cron',
       jsonb_build_object('fire', k.fire, 'schedule', k.schedule, 'epoch', %(epoch)s::bigint,
                          'node', %(node)s::text),
       k.dedup, now()
FROM unnest(%(keys)s::text[], %(fires)s::text[], %(schedules)s::text[])
    AS k(dedup, fire, schedule)
ON CONFLICT (dedup) DO NOTHING
RETURNING dedup
"""

TAKE_MESSAGES = """
UPDATE messages SET taken_at = now()
WHERE session = %(s)s AND id = ANY(%(msgs)s::bigint[]) AND taken_at IS NULL
RETURNING id
"""

INSERT_EVENTS = """
INSERT INTO events (session, seq, id, line)
SELECT %(s)s, e.seq, e.id, e.line
FROM unnest(%(seqs)s::bigint[], %(ids)s::text[], %(lines)s::bytea[]) AS e(seq, id, line)
"""


class AlreadyFired(Fenced):
    """A cron fire time this session has on record already: nothing was written."""


@dataclass(frozen=True)
class Keys:
    """What a batch commits besides its events, in the same transaction."""

    fires: list[tuple[str, str, str]]  # its cron fires' (dedup key, fire, schedule)
    messages: list[int]  # the rows of the carried messages it delivers
    ended: bool | None  # it terminates the session (True), starts it again (False)

    def __bool__(self) -> bool:
        return bool(self.fires or self.messages or self.ended is not None)


# What a batch of ``session``'s records commits besides its events: the store's
# caller says (sessiond.cluster.once); a store without one commits none.
KeysOf = Callable[[str, list[Record]], Keys]


def no_keys(_session: str, _records: list[Record]) -> Keys:
    return Keys([], [], None)


async def commit_once(pool: AsyncConnectionPool, lease: Lease, batch: Batch, keys: Keys) -> bool:
    """Commit ``batch`` with its ``keys`` (its cron fires' dedup keys, the take of
    its carried messages, the row's ``ended``), in one transaction.

    False when the session's fence refused it (as the group commit says);
    raises :class:`AlreadyFired` when a fire is on record already or a message
    was delivered already."""
    try:
        return await _commit_once(pool, lease, batch, keys)
    except psycopg.Error as exc:  # committer.LIVE: the lease lapsed while it waited
        if exc.sqlstate != LAPSED:
            raise
        raise lapsed_while_waiting(exc, lease) from None


async def _commit_once(pool: AsyncConnectionPool, lease: Lease, batch: Batch, keys: Keys) -> bool:
    fires, messages = keys.fires, keys.messages
    params: dict[str, object] = {
        "s": batch.session,
        "epoch": batch.epoch,
        "after": batch.after,
        "last": batch.seqs[-1],
        "last_id": batch.ids[-1],
        "node": lease.name,
        "inc": lease.incarnation,
        "keys": [k for k, _, _ in fires],
        "fires": [f for _, f, _ in fires],
        "schedules": [sch for _, _, sch in fires],
        "msgs": messages,
        "ended": keys.ended,
        "seqs": batch.seqs,
        "ids": batch.ids,
        "lines": batch.lines,
    }
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(FENCE_ONE, params)
        if await cur.fetchone() is None:
            return False  # nothing was changed: the transaction commits nothing
        if messages:
            cur = await conn.execute(TAKE_MESSAGES, params)
            took = {int(row[0]) for row in await cur.fetchall()}
            if len(took) < len(set(messages)):
                again = ", ".join(str(m) for m in messages if m not in took)
                raise AlreadyFired(
                    f"session {batch.session!r} has message {again} delivered already "
                    "(a carried message is delivered once); nothing was written"
                )
        if not fires:
            await conn.execute(INSERT_EVENTS, params)
            return True
        cur = await conn.execute(TAKE_KEYS, params)
        taken = {row[0] for row in await cur.fetchall()}
        if len(taken) < len(fires):
            # raised inside the transaction: it is rolled back, fence and keys too
            missing = ", ".join(f for k, f, _ in fires if k not in taken) or fires[0][1]
            raise AlreadyFired(
                f"session {batch.session!r} has its cron fire {missing} on record already "
                "(it fires once for the whole cluster); nothing was written"
            )
        await conn.execute(INSERT_EVENTS, params)
    return True
