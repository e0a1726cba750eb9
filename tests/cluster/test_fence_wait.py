"""The append fence when the append waits in the database (docs/design.md section 10:
"a node whose lease lapsed ... can write nothing, even before anyone else
claims"). A statement's ``now()`` is when it started: an append that waited on
a row lock past its node's lease must still be refused when it finally runs.
Real PostgreSQL; the lease lapses by the database's clock, as a real one does
(no renewal), while the append waits."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from sessiond.errors import LogFailed
from sessiond.log.event_data import LifecycleChanged, MessageReceived
from sessiond.log.store.pg.pgstore import PgStore
from tests.helpers import arun


def renew(dsn: str, node: str, seconds: float) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE nodes SET lease_until = now() + make_interval(secs => %s) WHERE name = %s",
            (seconds, node),
        )


def _lapsed(dsn: str, node: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_until <= clock_timestamp() FROM nodes WHERE name = %s", (node,)
        ).fetchone()
    return bool(row and row[0])


def _waiting(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%WITH fence AS%'"
        ).fetchone()
    return bool(row and row[0])


def test_an_append_that_waited_on_a_lock_past_its_lease_is_refused(pg_dsn: str) -> None:
    a = PgStore(pg_dsn, node="a", lease_ttl=60)

    async def go() -> None:
        log = await a.create("alpha")
        await log.append(LifecycleChanged(to="ready"))
        renew(pg_dsn, "a", seconds=2)  # from now, a lease that lapses by the clock
        with psycopg.connect(pg_dsn) as holder:
            holder.execute("SELECT 1 FROM sessions WHERE name = 'alpha' FOR UPDATE")
            late = asyncio.ensure_future(log.append(MessageReceived(sender="bob", text="late")))
            for _ in range(2000):  # bounded: the append reaches the database and waits
                if await asyncio.to_thread(_waiting, pg_dsn):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the append never waited on the row lock")
            # its lease runs out while it waits (no renewal here), and nobody claims
            for _ in range(3000):  # bounded: the lease is 2 s
                if await asyncio.to_thread(_lapsed, pg_dsn, "a"):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the lease never lapsed")
            holder.rollback()
        with pytest.raises(LogFailed):  # Fenced, or the wait bounded (both LogFailed)
            await late
        await log.close()
        await a.aclose()

    try:
        arun(go())
    finally:
        a.close_sync()
    reader = PgStore(pg_dsn, node="b", lease_ttl=60)
    try:
        assert [r["seq"] for r in reader.read("alpha")] == [1]  # the late write is not there
    finally:
        reader.close_sync()
