"""Messages between nodes in the database (cluster/pg/mail.py), on a real
PostgreSQL: the row is the truth, and its notification carries the message when
it fits, equal to the row."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from sessiond.cluster.pg import mail
from sessiond.cluster.pg.mail import Hint, Message


def _with_pool(dsn: str, body: Callable[[AsyncConnectionPool, Any], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO nodes (name, incarnation, lease_until) VALUES ('n2', 1, now())"
            )
            conn.execute(
                "INSERT INTO sessions (name, owner, epoch, last_seq) VALUES ('w', 'n2', 1, 0)"
            )
        pool = AsyncConnectionPool(
            dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
        )
        await pool.open(wait=True)
        try:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
                await listener.execute(f"LISTEN {mail.CHANNEL}")
                return await body(pool, listener)
        finally:
            await pool.close()

    return asyncio.run(run())


async def _next(listener: Any) -> Message | Hint:
    notes = [n async for n in listener.notifies(timeout=30, stop_after=1)]
    assert notes, "no notification came"
    return mail.parse(notes[0].payload)


def _row(dsn: str, message: int) -> tuple[Any, ...]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT id, session, sender, body, taken_at FROM messages WHERE id = %s", (message,)
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_the_notification_carries_the_message_equal_to_its_row(pg_dsn: str) -> None:
    text = 'quotes " and \\ and a tab\t, a newline\n, ü, and an emoji \U0001f600'

    async def body(pool: AsyncConnectionPool, listener: Any) -> tuple[Any, Any]:
        posted = await mail.post(pool, "w", "n1's sender", text)
        got = await _next(listener)
        assert posted is not None
        await mail.flush(pool, posted[0])
        return posted, got

    posted, got = _with_pool(pg_dsn, body)
    assert posted[1] == "n2"  # the owner when it was left
    assert isinstance(got, Message)
    row = _row(pg_dsn, posted[0])
    assert (got.id, got.session, got.sender, got.text, None) == row
    assert got.text == text


def test_a_message_too_long_for_a_payload_is_announced_by_its_id(pg_dsn: str) -> None:
    # under PAYLOAD_MAX as text, over it once escaped as JSON (each \x01 is 6 bytes)
    sizes = ["x" * (mail.PAYLOAD_MAX + 1), "\x01" * (mail.PAYLOAD_MAX // 3)]

    async def body(pool: AsyncConnectionPool, listener: Any) -> list[Any]:
        out = []
        for text in sizes:
            posted = await mail.post(pool, "w", "s", text)
            assert posted is not None
            out.append((posted[0], await _next(listener)))
        return out

    for (message, got), text in zip(_with_pool(pg_dsn, body), sizes, strict=True):
        assert got == Hint(message, "w")
        assert _row(pg_dsn, message)[3] == text  # the table has it whole


def test_no_message_is_left_for_a_session_the_cluster_does_not_have(pg_dsn: str) -> None:
    async def body(pool: AsyncConnectionPool, listener: Any) -> Any:
        missing = await mail.post(pool, "nobody", "s", "hi")
        notes = [n async for n in listener.notifies(timeout=0.2)]
        return missing, notes

    missing, notes = _with_pool(pg_dsn, body)
    assert missing is None
    assert notes == []
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (0,)


def test_pending_lists_untaken_messages_oldest_first_and_taken_marks_once(pg_dsn: str) -> None:
    async def body(pool: AsyncConnectionPool, listener: Any) -> Any:
        ids = []
        for text in ("one", "two", "three"):
            posted = await mail.post(pool, "w", "s", text)
            assert posted is not None
            ids.append(posted[0])
        await mail.taken(pool, ids[1])
        return ids, await mail.pending(pool, ["w", "other"])

    ids, pending = _with_pool(pg_dsn, body)
    assert [(m.id, m.text) for m in pending] == [(ids[0], "one"), (ids[2], "three")]
    assert _row(pg_dsn, ids[1])[4] is not None


def test_a_payload_this_version_does_not_know_is_a_hint_to_read_the_table() -> None:
    assert mail.parse("") == Hint(None, None)
    assert mail.parse("n2") == Hint(None, None)  # the payload of nodes before this one
    assert mail.parse("[1]") == Hint(None, None)
    assert mail.parse('{"id": "1", "session": "w"}') == Hint(None, None)
    assert mail.parse('{"id": 1, "session": "w", "sender": 2, "text": "t"}') == Hint(1, "w")
    assert mail.parse('{"id": 1, "session": "w", "sender": "s", "text": "t"}') == Message(
        1, "w", "s", "t"
    )
