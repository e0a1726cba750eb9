"""Requests carried between nodes (docs/design.md section 10, "any node's socket serves
the whole cluster").

A node asked about a session another node owns writes the request here, as a
row, and NOTIFYs ``sessiond_requests`` (a hint: the owner also looks every
second). The owner takes it, which marks it taken in the same statement that
reads it (``FOR UPDATE SKIP LOCKED``, so two nodes never both take one), carries
it out through its own dispatch, and writes the reply, NOTIFYing
``sessiond_replies``. The table is the truth; a lost notification costs a poll.

A request is carried out at most once: taking it is the only way to run it,
and a request nobody took can be abandoned by its asker (then nobody takes it).
A node that dies between taking and answering leaves the request taken, without
a reply: its asker says so, and never asks again on its own.

:class:`Requests` is the cluster floor's
:class:`~sessiond.cluster.channels.CarriedRequests` on this table; its two
notifications are the broker's ``RequestLeft`` and ``RequestAnswered``
(pg/channels.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson
from psycopg.types.json import Jsonb

from sessiond.cluster.channels import CarriedRequests, Owner, Status
from sessiond.log.store.pg.reach import Pool
from sessiond.names import check_name
from sessiond.replies import JsonObject, Who

REQUESTS = "sessiond_requests"
REPLIES = "sessiond_replies"

# A request for a session is written only if the session exists (one round trip).
POST = """
INSERT INTO requests (session, node, method, params, who, asker)
SELECT %(s)s, %(n)s, %(m)s, %(p)s, %(w)s, %(a)s
WHERE %(s)s::text IS NULL OR EXISTS (SELECT 1 FROM sessions WHERE name = %(s)s)
RETURNING id
"""

# The requests this node should carry out now: those for the sessions it has
# open, and those addressed to it by name. Taken in the same statement.
TAKE = """
UPDATE requests AS r SET taken_by = %(me)s, taken_inc = %(inc)s, taken_at = now()
WHERE r.id IN (
    SELECT q.id FROM requests AS q
    WHERE q.taken_at IS NULL AND NOT q.abandoned
      AND (q.node = %(me)s OR (q.node IS NULL AND q.session = ANY(%(names)s)))
    ORDER BY q.id LIMIT 32 FOR UPDATE SKIP LOCKED)
RETURNING r.id, r.method, r.params, r.who
"""

STATUS = """
SELECT r.taken_by, r.reply, r.abandoned,
       (r.taken_by IS NULL OR EXISTS (
            SELECT 1 FROM nodes AS n WHERE n.name = r.taken_by
            AND n.incarnation = r.taken_inc AND n.lease_until > now()))
FROM requests AS r WHERE r.id = %(i)s
"""

OWNER = """
SELECT s.owner, coalesce(n.lease_until > now(), false), n.state
FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner
WHERE s.name = %(s)s
"""


def _jsonb(value: Any) -> Jsonb:
    # orjson, as the wire: results hold datetimes and the like
    return Jsonb(value, dumps=lambda v: orjson.dumps(v).decode())


class Requests(CarriedRequests):
    """The ``requests`` table, through a small pool of its own (the loop's threads),
    opened when the node serves."""

    def __init__(self, dsn: str, *, node: str, prepared: bool = True) -> None:
        self.node = node
        self._pool = Pool(
            dsn,
            min_size=1,
            max_size=4,
            kwargs={"autocommit": True, "prepare_threshold": 5 if prepared else None},
            open=False,
            name="sessiond-requests",
        )

    def open(self) -> None:
        self._pool.open(wait=True, timeout=30)

    def close(self) -> None:
        self._pool.close()

    def owner(self, session: str) -> Owner | None:
        """The session's owner, or None when the cluster has no such session."""
        with self._pool.connection() as conn:
            row = conn.execute(OWNER, {"s": check_name(session)}).fetchone()
        if row is None:
            return None
        return Owner(row[0], bool(row[1]), row[2])

    def post(
        self,
        method: str,
        params: Mapping[str, object],  # any JSON orjson encodes (_jsonb)
        who: Who | None,
        *,
        session: str | None = None,
        node: str | None = None,
    ) -> int | None:
        """Leave a request for ``session``'s owner (or for ``node``); its id, or
        None when the cluster has no such session."""
        with self._pool.connection() as conn, conn.transaction():
            row = conn.execute(
                POST,
                {
                    "s": check_name(session) if session is not None else None,
                    "n": node,
                    "m": method,
                    "p": _jsonb(params),
                    "w": _jsonb(who) if who is not None else None,
                    "a": self.node,
                },
            ).fetchone()
            if row is None:
                return None
            # delivered at commit; one payload for everyone: the hint says "look"
            conn.execute("SELECT pg_notify(%s, '')", (REQUESTS,))
        return int(row[0])

    def take(
        self, incarnation: int, names: list[str]
    ) -> list[tuple[int, str, JsonObject, Who | None]]:
        """Take what this node should carry out: (id, method, params, who) each."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                TAKE, {"me": self.node, "inc": incarnation, "names": names}
            ).fetchall()
        return [(int(i), m, p, w) for i, m, p, w in rows]

    def answer(self, request: int, reply: JsonObject) -> None:
        """Write the reply of a request this node took, and tell its asker."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE requests SET reply = %(r)s, done_at = now() "
                "WHERE id = %(i)s AND taken_by = %(me)s",
                {"r": _jsonb(reply), "i": request, "me": self.node},
            )
            conn.execute("SELECT pg_notify(%s, %s)", (REPLIES, str(request)))

    def status(self, request: int) -> Status:
        with self._pool.connection() as conn:
            row = conn.execute(STATUS, {"i": request}).fetchone()
        assert row is not None
        reply = row[1]
        if isinstance(reply, str):
            reply = json.loads(reply)
        return Status(row[0], reply, bool(row[2]), bool(row[3]))

    def abandon(self, request: int) -> bool:
        """Withdraw a request nobody took yet; False when it was taken meanwhile."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                "UPDATE requests SET abandoned = true "
                "WHERE id = %(i)s AND taken_at IS NULL RETURNING id",
                {"i": request},
            ).fetchall()
        return bool(rows)

    def forget(self, request: int) -> None:
        """Drop a request its asker is done with (answered, or withdrawn untaken)."""
        with self._pool.connection() as conn:
            conn.execute(
                "DELETE FROM requests WHERE id = %(i)s AND (reply IS NOT NULL OR abandoned)",
                {"i": request},
            )

    def sessions(self) -> list[tuple[str, str | None, bool, str | None]]:
        """Every session of the cluster: (name, owner, owner alive, owner's state)."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT s.name, s.owner, coalesce(n.lease_until > now(), false), n.state "
                "FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner ORDER BY s.name"
            ).fetchall()
        return [(str(a), b, bool(c), d) for a, b, c, d in rows]

    def live_nodes(self) -> list[str]:
        """The nodes whose lease runs, but this one."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT name FROM nodes WHERE lease_until > now() AND name <> %(me)s ORDER BY name",
                {"me": self.node},
            ).fetchall()
        return [str(r[0]) for r in rows]
