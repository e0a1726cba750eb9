"""Messages between nodes (docs/design.md section 10, "Wakes"): a ``send``
to a session another node owns.

The ``messages`` table is the truth; a NOTIFY on ``sessiond_messages`` is the
hint, and for a message that fits (NOTIFY's payload must be under 8,000 bytes)
the hint carries the message itself, so its owner starts delivering it without
reading the table first. A message too long for the payload is announced by its
id alone, and the owner reads it. The owner polls the table anyway (the
backstop: a notification sent while its listener was away is lost).

One crossing, measured (bench/README.md, "The cluster backend"): the old one
committed the row with its own flush (3-10 ms on the loaded VM), then the
owner woke, read the row (a round trip through a thread) and only then began
the same wake a local ``send`` makes. Now the row and its NOTIFY are one
statement whose commit does not wait for the flush, the owner has the message
from the notification, and the sender waits for the flush (:func:`flush`)
while the owner is already delivering.

:class:`PgMail` is the cluster floor's mail queue
(sessiond.cluster.channels.MailQueue) on these statements; the notification is
the broker's :class:`~sessiond.cluster.channels.Message` or ``Hint``
(pg/channels.py reads it with :func:`parse`).
"""

from __future__ import annotations

import json

from psycopg_pool import AsyncConnectionPool

from sessiond.cluster.channels import Hint, MailQueue, Message
from sessiond.errors import Refused
from sessiond.log.store.pg.pgstore import PgStore

# Message and Hint are named here too: what a notification here says
__all__ = [
    "CHANNEL",
    "PAYLOAD_MAX",
    "Hint",
    "Message",
    "PgMail",
    "flush",
    "parse",
    "payload",
    "pending",
    "post",
    "taken",
]

CHANNEL = "sessiond_messages"

# NOTIFY refuses a payload of 8,000 bytes or more; the rest is the id alone.
PAYLOAD_MAX = 7800

# The row and its notification, in one statement (one round trip, autocommit).
#
# ``synchronous_commit`` is off for this statement's transaction only
# (set_config(..., true) is SET LOCAL): its commit returns, and its NOTIFY goes
# out, without waiting for the WAL flush. Nothing acknowledged is weakened by it:
#
# - the sender acknowledges the send to its user only after :func:`flush`, a
#   synchronous commit of its own made after this one, and a flush writes the
#   WAL in order, so this row is on disk before the user hears "sent";
# - the owner may see the row before it is on disk, but acts on it only through
#   a wake, whose first commit (``run.started``, with ``message.received``) is
#   synchronous and comes after this row in the WAL: no program starts for a
#   message the database could still lose.
#
# A database crash in between loses a message nobody was told of and nothing
# acted upon (the sender's user gets an error; the owner's records of it are
# later in the WAL and lost with it).
POST = """
WITH quick AS (SELECT set_config('synchronous_commit', 'off', true)),
m AS (
    INSERT INTO messages (session, sender, body)
    SELECT s.name, %(f)s, %(t)s FROM sessions AS s, quick
    WHERE s.name = %(n)s AND NOT s.ended
    RETURNING id, session, sender, body)
SELECT m.id, s.owner, pg_notify(%(ch)s,
    CASE WHEN octet_length(p.whole) <= %(max)s THEN p.whole ELSE p.hint END)
FROM m JOIN sessions AS s ON s.name = m.session,
LATERAL (SELECT
    json_build_object('id', m.id, 'session', m.session, 'sender', m.sender,
                      'text', m.body)::text AS whole,
    json_build_object('id', m.id, 'session', m.session)::text AS hint) AS p
"""

# A commit that waits for the flush (synchronous_commit is on for everything
# else), made after the message's: flushing its commit record flushes every
# earlier one, the message's with it. It must write something, or PostgreSQL
# skips the flush (a transaction that wrote no WAL commits asynchronously): the
# message's row again, as it is. No row (its session was deleted since, and the
# message with it): there is nothing left to keep.
FLUSH = "UPDATE messages SET created_at = created_at WHERE id = %(i)s"

PENDING = """
SELECT id, session, sender, body FROM messages
WHERE taken_at IS NULL AND session = ANY(%(n)s) ORDER BY id LIMIT %(l)s
"""

# Marked after it was delivered: a crash in between delivers it again (at least
# once); a synchronous commit, so a database crash does not widen that window.
TAKEN = "UPDATE messages SET taken_at = now() WHERE id = %(i)s AND taken_at IS NULL"


async def post(
    pool: AsyncConnectionPool, to: str, sender: str, text: str
) -> tuple[int, str | None] | None:
    """Leave a message for ``to`` and tell its owner: (the message's id, the owner
    when it was left), or None when the cluster has no such session. Not durable
    yet: :func:`flush` before saying so. A terminated session (its row says so:
    once.py) is refused here, as its own node refuses it."""
    params: dict[str, object] = {"n": to, "f": sender, "t": text, "ch": CHANNEL, "max": PAYLOAD_MAX}
    async with pool.connection() as conn:
        cur = await conn.execute(POST, params)
        row = await cur.fetchone()
        if row is None:
            cur = await conn.execute("SELECT ended FROM sessions WHERE name = %(n)s", params)
            ended = await cur.fetchone()
            if ended is not None and ended[0]:
                raise Refused(f"cannot send to session {to!r}: it is terminated")
            return None
    return int(row[0]), row[1]


async def flush(pool: AsyncConnectionPool, message: int) -> None:
    """Return once the message :func:`post` left is on disk."""
    async with pool.connection() as conn:
        await conn.execute(FLUSH, {"i": message})


async def pending(pool: AsyncConnectionPool, names: list[str], limit: int = 100) -> list[Message]:
    """Messages not yet delivered to any of ``names``, oldest first."""
    async with pool.connection() as conn:
        cur = await conn.execute(PENDING, {"n": names, "l": limit})
        rows = await cur.fetchall()
    return [Message(int(i), s, f, t) for i, s, f, t in rows]


async def taken(pool: AsyncConnectionPool, message: int) -> None:
    async with pool.connection() as conn:
        await conn.execute(TAKEN, {"i": message})


def parse(payload: str) -> Message | Hint:
    """What a notification says: the whole message, or a hint to read the table
    (also for a payload this version does not know: the table is the truth)."""
    try:
        got = json.loads(payload)
    except ValueError:
        return Hint(None, None)
    if not isinstance(got, dict):
        return Hint(None, None)
    id_, session = got.get("id"), got.get("session")
    if not isinstance(id_, int) or not isinstance(session, str):
        return Hint(None, None)
    sender, text = got.get("sender"), got.get("text")
    if isinstance(sender, str) and isinstance(text, str):
        return Message(id_, session, sender, text)
    return Hint(id_, session)


def payload(wake: Message | Hint) -> str:
    """The notification :data:`POST` makes, made here (a node that publishes a
    message it did not leave itself: the broker's): the message whole when it
    fits, else its id and session. :func:`parse` reads either."""
    hint = json.dumps({"id": wake.id, "session": wake.session}, ensure_ascii=False)
    if isinstance(wake, Hint):
        return hint
    whole = json.dumps(
        {"id": wake.id, "session": wake.session, "sender": wake.sender, "text": wake.text},
        ensure_ascii=False,
    )
    return whole if len(whole.encode()) <= PAYLOAD_MAX else hint


class PgMail(MailQueue):
    """The ``messages`` table, on the store's pool (sessiond.cluster.channels.MailQueue)."""

    def __init__(self, store: PgStore) -> None:
        self.store = store

    async def post(self, to: str, sender: str, text: str) -> tuple[int, str | None] | None:
        return await post(await self.store.connect(), to, sender, text)

    async def flush(self, message: int) -> None:
        await flush(await self.store.connect(), message)

    async def pending(self, names: list[str], limit: int = 100) -> list[Message]:
        return await pending(await self.store.connect(), names, limit)

    async def taken(self, message: int) -> None:
        await taken(await self.store.connect(), message)
