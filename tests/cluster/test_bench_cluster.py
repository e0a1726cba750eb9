"""The cluster benchmark's code runs (tiny sizes, nothing timed is asserted)."""

from __future__ import annotations

from sessiond.bench import cluster
from sessiond.log.store.pg.pgstore import PgStore
from tests.helpers import arun


def test_the_latency_samples_are_taken_side_by_side(pg_dsn: str) -> None:
    store = PgStore(pg_dsn, node="bench", lease_ttl=60)

    async def go() -> dict[str, list[float]]:
        got = await cluster.latencies(pg_dsn, store, 8)
        await store.aclose()
        return got

    got = arun(go())
    assert {k: len(v) for k, v in got.items()} == {"bare": 8, "append": 8, "statement": 8}
    assert len(list(PgStore(pg_dsn, node="reader").read("latency"))) == 8


def test_three_node_processes_append_and_the_floor_inserts(pg_dsn: str) -> None:
    assert cluster.throughput(pg_dsn, "append", 0, 0.2) > 0
    assert cluster.throughput(pg_dsn, "bare", 0, 0.2) > 0


def test_the_crossing_samples_take_each_message_from_its_notification(pg_dsn: str) -> None:
    store = PgStore(pg_dsn, node="bench", lease_ttl=60)

    async def go() -> list[float]:
        got = await cluster.wake_latency(pg_dsn, store, 3)
        await store.aclose()
        return got

    assert len(arun(go())) == 3
    rows = PgStore(pg_dsn, node="reader").select(
        "SELECT count(*) FILTER (WHERE taken_at IS NOT NULL), count(*) FROM messages", {}
    )
    assert rows == [(3, 3)]
