"""The node's group commit on a real PostgreSQL: many sessions' appends in one
statement, each session fenced on its own, and each log told its own outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sessiond.errors import Fenced, LogFailed
from sessiond.log.event_data import LifecycleChanged, MessageReceived
from sessiond.log.store.pg.arrays import ByteaArray, Int8Array, TextArray
from sessiond.log.store.pg.committer import APPEND_ONE, Batch, Committer, statement
from sessiond.log.store.pg.pgstore import PgStore
from tests.helpers import arun


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PgStore]:
    made = PgStore(pg_dsn, node="a", lease_ttl=60)
    yield made
    made.close_sync()


class Probe:
    """A source that hands the committer one batch and keeps what it was told."""

    def __init__(self, batch: Batch) -> None:
        self.batch: Batch | None = batch
        self.outcome: bool | BaseException | None = None

    def take(self) -> Batch | None:
        batch, self.batch = self.batch, None
        return batch

    def settle(self, batch: Batch, outcome: bool | BaseException) -> None:
        self.outcome = outcome


def batch(session: str, epoch: int, after: int, count: int) -> Batch:
    seqs = list(range(after + 1, after + count + 1))
    return Batch(session, epoch, after, seqs, [f"{session}-{s}" for s in seqs], [b"{}"] * count)


def stored(dsn: str) -> dict[str, tuple[int, list[int]]]:
    """Each session's recorded end and the seqs of its events."""
    with psycopg.connect(dsn) as conn:
        ends: dict[str, int] = dict(conn.execute("SELECT name, last_seq FROM sessions").fetchall())
        rows = conn.execute("SELECT session, seq FROM events ORDER BY session, seq").fetchall()
    return {name: (end, [seq for s, seq in rows if s == name]) for name, end in ends.items()}


def test_one_statement_lands_the_fenced_sessions_and_refuses_only_the_others(
    pg_dsn: str, store: PgStore
) -> None:
    async def go() -> tuple[list[Probe], int]:
        for name in ("ok", "stale", "gap", "twice"):
            await (await store.create(name)).close()  # owned by "a", epoch 1, empty
        committer = Committer(await store.connect(), store.lease)
        probes = [
            Probe(batch("ok", 1, 0, 3)),
            Probe(batch("stale", 0, 0, 2)),  # an older epoch: claimed again since
            Probe(batch("gap", 1, 5, 1)),  # the row's end is 0, not 5
            Probe(batch("twice", 1, 0, 2)),
            Probe(batch("twice", 1, 2, 1)),  # a second batch of one session: never both
        ]
        for probe in probes:
            committer.want(probe)

        async def settled() -> None:
            while any(p.outcome is None for p in probes):
                await asyncio.sleep(0.01)  # a poll of the outcomes, bounded below

        await asyncio.wait_for(settled(), timeout=60)
        commits = committer.commits
        await committer.aclose()
        await store.aclose()
        return probes, commits

    probes, commits = arun(go())
    assert commits == 1  # one statement, one commit, for all five
    assert [p.outcome for p in probes] == [True, False, False, True, False]
    assert stored(pg_dsn) == {
        "ok": (3, [1, 2, 3]),
        "stale": (0, []),
        "gap": (0, []),
        "twice": (2, [1, 2]),  # the second batch's seq 3 did not land past the row's end
    }


def test_a_lone_event_goes_by_the_scalar_statement_with_the_same_fence(
    pg_dsn: str, store: PgStore
) -> None:
    """One event of one session (the commonest commit) is fenced exactly as the
    arrays' statement fences: epoch, the row's end, owner, incarnation, lease."""

    async def go() -> list[bool]:
        for name in ("s", "other"):
            await (await store.create(name)).close()  # owned by "a", epoch 1, empty
        pool = await store.connect()
        lease = store.lease
        tries = [
            (batch("s", 0, 0, 1), lease.incarnation),  # an older epoch
            (batch("s", 1, 4, 1), lease.incarnation),  # the row's end is 0, not 4
            (batch("s", 1, 0, 1), lease.incarnation - 1),  # an earlier incarnation
            (batch("s", 1, 0, 1), lease.incarnation),  # lands
            (batch("s", 1, 0, 1), lease.incarnation),  # the same seq again
        ]
        landed = []
        async with pool.connection() as conn:
            for one, inc in tries:
                sql, params = statement([one], lease)
                assert sql == APPEND_ONE
                cur = await conn.execute(sql, {**params, "inc": inc})
                landed.append(await cur.fetchall() == [("s", 1)])
            await conn.execute("UPDATE nodes SET lease_until = now() WHERE name = 'a'")
            sql, params = statement([batch("other", 1, 0, 1)], lease)
            cur = await conn.execute(sql, params)  # a lapsed lease
            landed.append(await cur.fetchall() != [])
        await store.aclose()
        return landed

    assert arun(go()) == [False, False, False, True, False, False]
    assert stored(pg_dsn) == {"s": (1, [1]), "other": (0, [])}


def test_a_stale_log_among_many_fails_alone_and_its_callers_learn_it(
    pg_dsn: str, store: PgStore
) -> None:
    async def go() -> tuple[list[Any], int]:
        logs = [await store.create(f"s{i}") for i in range(12)]
        await asyncio.gather(*(log.append(LifecycleChanged(to="ready")) for log in logs))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # s4 claimed elsewhere
            conn.execute("UPDATE sessions SET epoch = epoch + 1 WHERE name = 's4'")
        committer = store._committer
        assert committer is not None
        before = committer.commits
        # two appends per log in one turn of the loop: all in one commit
        outcomes = await asyncio.gather(
            *(log.append(MessageReceived(sender="x", text=str(n))) for log in logs for n in (1, 2)),
            return_exceptions=True,
        )
        commits = committer.commits - before
        with pytest.raises(LogFailed):
            await logs[4].append(MessageReceived(sender="x", text="after"))
        for log in logs:
            await log.close()
        await store.aclose()
        return outcomes, commits

    outcomes, commits = arun(go())
    assert commits == 1
    refused = [i // 2 for i, o in enumerate(outcomes) if isinstance(o, Fenced)]
    assert refused == [4, 4]  # both of s4's appends, and nothing else
    ends = stored(pg_dsn)
    assert {name: end for name, (end, _) in ends.items()} == {
        f"s{i}": 1 if i == 4 else 3 for i in range(12)
    }


def test_binary_arrays_round_trip(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT %b::bigint[], %b::text[], %b::bytea[], cardinality(%b::text[])",
            (
                Int8Array.of([1, -2, 2**62]),
                TextArray.of(["a", "é", ""]),
                ByteaArray.of([b"\x00\n", b""]),
                TextArray.of([]),
            ),
        ).fetchone()
    assert row == ([1, -2, 2**62], ["a", "é", ""], [b"\x00\n", b""], 0)
