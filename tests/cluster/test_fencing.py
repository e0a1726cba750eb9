"""Ownership and fencing on a real PostgreSQL (docs/design.md section 10).

A lease that lapsed is simulated by moving ``lease_until`` into the past on the
database (what the clock would do, without waiting for it)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from sessiond.errors import Fenced, LogFailed, LogLocked
from sessiond.log.event_data import LifecycleChanged, MessageReceived
from sessiond.log.events import decode
from sessiond.log.store.pg.pgstore import PgStore
from tests.helpers import arun


@pytest.fixture
def nodes(pg_dsn: str) -> Iterator[list[PgStore]]:
    made: list[PgStore] = []
    yield made
    for store in made:
        store.close_sync()


def node(nodes: list[PgStore], dsn: str, name: str) -> PgStore:
    store = PgStore(dsn, node=name, lease_ttl=60)
    nodes.append(store)
    return store


def lapse(dsn: str, name: str) -> None:
    """The node's lease ran out (as if it had been paused past lease_ttl)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE nodes SET lease_until = now() - interval '1 second' WHERE name = %s", (name,)
        )


def test_a_node_whose_lease_lapsed_writes_nothing_even_with_no_other_node(
    pg_dsn: str, nodes: list[PgStore]
) -> None:
    a = node(nodes, pg_dsn, "a")

    async def go() -> None:
        log = await a.create("alpha")
        await log.append(LifecycleChanged(to="ready"))
        lapse(pg_dsn, "a")
        with pytest.raises(Fenced, match="lease lapsed or another node claimed"):
            await log.append(MessageReceived(sender="bob", text="late"))
        with pytest.raises(LogFailed):  # the log takes nothing more
            await log.append(MessageReceived(sender="bob", text="later"))
        await log.close()
        with pytest.raises(Fenced, match="own lease lapsed"):
            await a.open_log("alpha")  # nor can it claim anything
        assert not await a.lease.renew(await a.connect())  # a lapsed lease stays lapsed
        await a.aclose()

    arun(go())
    b = node(nodes, pg_dsn, "b")  # a reader: nothing of the late writes is there
    assert [r["seq"] for r in b.read("alpha")] == [1]


def test_a_claim_bumps_the_epoch_and_fences_the_old_owner(
    pg_dsn: str, nodes: list[PgStore]
) -> None:
    a, b = node(nodes, pg_dsn, "a"), node(nodes, pg_dsn, "b")

    async def go() -> None:
        old = await a.create("alpha")
        await old.append(LifecycleChanged(to="ready"))
        with pytest.raises(LogLocked, match="owned by node 'a'"):
            await b.open_log("alpha")  # a's lease still runs
        lapse(pg_dsn, "a")
        new = await b.open_log("alpha")
        assert [r["seq"] for r in new.recover()] == [1]
        await new.append(LifecycleChanged(to="running"))
        with pytest.raises(Fenced):
            await old.append(MessageReceived(sender="a", text="stale"))
        await new.append(MessageReceived(sender="b", text="fresh"))
        await old.close()
        await new.close()

    arun(go())
    records = list(b.read("alpha"))
    assert [(r["seq"], r["node"], r["epoch"]) for r in records] == [
        (1, "a", 1),
        (2, "b", 2),
        (3, "b", 2),
    ]
    assert [decode(r).data.EVENT_TYPE for r in records] == [  # valid envelopes
        "lifecycle.changed",
        "lifecycle.changed",
        "message.received",
    ]


def test_a_restarted_node_fences_its_own_earlier_incarnation(
    pg_dsn: str, nodes: list[PgStore]
) -> None:
    first = node(nodes, pg_dsn, "a")

    async def go() -> None:
        old = await first.create("alpha")
        await old.append(LifecycleChanged(to="ready"))
        again = node(nodes, pg_dsn, "a")  # the same node name, started again
        log = await again.open_log("alpha")
        assert again.lease.incarnation == first.lease.incarnation + 1
        list(log.recover())
        with pytest.raises(Fenced):
            await old.append(MessageReceived(sender="a", text="from the old process"))
        record = await log.append(MessageReceived(sender="a", text="from the new one"))
        assert (record["seq"], record["epoch"]) == (2, 2)
        await old.close()
        await log.close()

    arun(go())


def test_the_schema_is_never_made_implicitly(postgres: object, pg_dsn: str) -> None:
    from sessiond.log.store.pg import schema

    assert schema.migrate(pg_dsn) == (schema.VERSION, schema.VERSION)  # idempotent
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE empty_one")
    empty = pg_dsn.replace(pg_dsn.split("?", maxsplit=1)[0].rsplit("/", 1)[1], "empty_one", 1)
    with pytest.raises(schema.SchemaMismatch, match="sessiond db migrate"):
        PgStore(empty, node="a")


def test_the_node_and_epoch_fields_round_trip_and_old_records_stay_valid() -> None:
    from sessiond.log.events import encode

    base = {
        "v": 1,
        "session": "alpha",
        "seq": 1,
        "id": "0" * 32,
        "ts": "2026-01-31T09:00:00.000001Z",
        "type": "lifecycle.changed",
        "causation": None,
        "correlation": None,
        "data": {"to": "ready"},
    }
    old = decode(dict(base))
    assert (old.node, old.epoch) == (None, None)
    assert "node" not in encode(old)
    stamped = decode({**base, "node": "a", "epoch": 3})
    assert (stamped.node, stamped.epoch) == ("a", 3)
    assert encode(stamped)["node"] == "a"
    assert encode(stamped)["epoch"] == 3


def test_one_commit_carries_many_sessions_and_fences_each_on_its_own(
    pg_dsn: str, nodes: list[PgStore]
) -> None:
    a = node(nodes, pg_dsn, "a")

    async def go() -> None:
        import asyncio

        logs = [await a.create(f"s{i}") for i in range(20)]
        await asyncio.gather(*(log.append(LifecycleChanged(to="ready")) for log in logs))
        # s7 was claimed again meanwhile (a newer epoch): only s7 is fenced
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("UPDATE sessions SET epoch = epoch + 1 WHERE name = 's7'")
        outcomes = await asyncio.gather(
            *(log.append(MessageReceived(sender="x", text="y")) for log in logs),
            return_exceptions=True,
        )
        fenced = [i for i, o in enumerate(outcomes) if isinstance(o, Fenced)]
        assert fenced == [7]
        for log in logs:
            await log.close()

    arun(go())
    assert [len(list(a.read(f"s{i}"))) for i in range(20)] == [
        1 if i == 7 else 2 for i in range(20)
    ]
