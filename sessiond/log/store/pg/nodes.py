"""A node's lease and its claims on sessions (docs/design.md section 10, "Ownership and fencing").

A node holds a lease in ``nodes``: ``lease_until``, always computed by the
database (``now() + ttl``), never by a node's own clock. Every start of a node is
a new **incarnation**: whatever an earlier process of the same name still tries
to write is fenced out, because the fence names the incarnation too.

A lease that lapsed is not renewed: :meth:`Lease.renew` says so and the node must
start over (a new incarnation, new claims, each session through replay and the
gate), because meanwhile another node may have run its sessions.

Claiming a session bumps its **epoch**; every append names the epoch it was
opened under (pglog.py), so a write of an older owner can never land.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from psycopg_pool import AsyncConnectionPool

from sessiond.errors import Fenced, LogLocked, NoSuchSession
from sessiond.log.store.pg.placement import fits, from_row

REGISTER = """
INSERT INTO nodes AS n (name, incarnation, lease_until, labels)
VALUES (%(name)s, 1, now() + make_interval(secs => %(ttl)s), %(labels)s::jsonb)
ON CONFLICT (name) DO UPDATE
    SET incarnation = n.incarnation + 1, started_at = now(), renewed_at = now(),
        lease_until = now() + make_interval(secs => %(ttl)s), state = 'up',
        labels = excluded.labels, running = 0, ready = 0, max_running = 0
RETURNING incarnation
"""

# Only a lease still running is extended: one that lapsed stays lapsed.
RENEW = """
UPDATE nodes SET lease_until = now() + make_interval(secs => %(ttl)s), renewed_at = now()
WHERE name = %(name)s AND incarnation = %(inc)s AND lease_until > now()
RETURNING lease_until, state
"""

# A session is ours to take when we own it, or when nobody does or its owner's
# lease lapsed and it may run here (placement.py: pinned, workspace, labels); our
# own lease must be running. The epoch goes up by one either way.
CLAIM = f"""
UPDATE sessions AS s SET owner = %(name)s, epoch = s.epoch + 1
FROM nodes AS me
WHERE s.name = %(session)s
  AND me.name = %(name)s AND me.incarnation = %(inc)s AND me.lease_until > now()
  AND (s.owner = %(name)s
       OR ((s.owner IS NULL
            OR NOT EXISTS (SELECT 1 FROM nodes AS o
                           WHERE o.name = s.owner AND o.lease_until > now()))
           AND {fits("me.name", "me.labels")}))
RETURNING s.epoch, s.last_seq, s.last_id
"""

WHO_OWNS = """
SELECT s.owner, n.lease_until > now(), n.lease_until,
       s.pinned, s.needs, s.workspace, s.workspace_node,
       (SELECT labels FROM nodes WHERE name = %(name)s)
FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner
WHERE s.name = %(session)s
"""


@dataclass
class Lease:
    """This node's lease: its name, its incarnation, when it was last renewed."""

    name: str
    ttl: float
    labels: str = "{}"
    incarnation: int = 0
    # time.monotonic() when the last renewal that succeeded was sent: the lease
    # runs at least until this + ttl on the database's clock.
    renewed: float = field(default=0.0)
    state: str = "up"

    @property
    def registered(self) -> bool:
        return self.incarnation > 0

    def params(self) -> dict[str, object]:
        return {"name": self.name, "inc": self.incarnation, "ttl": self.ttl}

    async def register(self, pool: AsyncConnectionPool) -> int:
        """Start a new incarnation with a fresh lease; returns the incarnation."""
        sent = time.monotonic()
        async with pool.connection() as conn:
            cur = await conn.execute(
                REGISTER, {"name": self.name, "ttl": self.ttl, "labels": self.labels}
            )
            row = await cur.fetchone()
        assert row is not None
        self.incarnation = int(row[0])
        self.renewed = sent
        return self.incarnation

    async def renew(self, pool: AsyncConnectionPool) -> bool:
        """Extend the lease; False when it had lapsed (the node must start over)."""
        sent = time.monotonic()
        async with pool.connection() as conn:
            cur = await conn.execute(RENEW, self.params())
            row = await cur.fetchone()
        if row is None:
            return False
        self.renewed = sent
        self.state = str(row[1])  # "draining" once `sessionctl drain` named this node
        return True

    def deadline(self, margin: float = 0.0) -> float:
        """The monotonic time by which this node's lease may have lapsed, less
        ``margin``: the latest a program of this node may keep running."""
        return self.renewed + self.ttl - margin

    async def claim(self, pool: AsyncConnectionPool, session: str) -> tuple[int, int, str | None]:
        """Take ``session`` under a new epoch: (epoch, last seq, last id).

        Raises :class:`LogLocked` when another node's lease on it still runs,
        :class:`Fenced` when our own has lapsed, :class:`NoSuchSession`."""
        async with pool.connection() as conn:
            cur = await conn.execute(CLAIM, {**self.params(), "session": session})
            row = await cur.fetchone()
            if row is not None:
                return int(row[0]), int(row[1]), row[2]
            cur = await conn.execute(WHO_OWNS, {"session": session, "name": self.name})
            owner = await cur.fetchone()
        if owner is None:
            raise NoSuchSession(f"no session {session!r} in the cluster's database")
        if owner[0] not in (None, self.name) and owner[1]:
            raise LogLocked(
                f"session {session!r} is owned by node {owner[0]!r} (lease until {owner[2]}); "
                "it runs there. Use `sessionctl migrate --node` or wait for that node's lease"
            )
        placed = from_row(*owner[3:7])
        refusal = placed.refusal(self.name, dict(owner[7] or {}))
        if refusal is not None:  # not ours to run: it waits for the node it fits
            raise LogLocked(f"session {session!r} does not run on node {self.name!r}: {refusal}")
        raise Fenced(
            f"node {self.name!r} cannot claim session {session!r}: its own lease lapsed "
            f"(incarnation {self.incarnation}); the node must restart its claims"
        )
