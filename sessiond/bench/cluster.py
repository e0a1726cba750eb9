"""``python -m sessiond.bench.cluster``: the cluster backend's figures, side by side.

Starts a PostgreSQL of its own (sessiond.localpg: fsync on, ``synchronous_commit
= on``, a Unix socket), makes the schema, and measures in one run:

- append latency: a fenced append (``PgEventLog.append``: the epoch and lease
  check and the insert, one statement, one commit) beside a bare single-row
  ``INSERT`` + commit on the same server;
- appends/s from three node processes (each a ``PgStore`` with its own lease,
  50 sessions, one writer each), beside a bare floor: the same three processes
  inserting the same rows with plain single-row ``INSERT``s, same concurrency;
- the database part of a cross-node wake: a message left for another node's
  session (the ``messages`` row and its NOTIFY, committed) until that node,
  LISTENing, has read it from the table.

Failover time comes from the three-node tests (tests/cluster/test_failover.py
prints it); see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from sessiond.bench import machine, run_async
from sessiond.localpg import LocalPostgres, bindir
from sessiond.log.event_data import MessageReceived
from sessiond.log.store.pg import schema
from sessiond.log.store.pg.pgstore import PgStore

N = 2000  # appends (and bare inserts) for the latency figures
SECONDS = 5.0  # of each throughput run
SESSIONS = 50  # per node process


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bare_latency(dsn: str) -> list[float]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS bare (session text, seq bigint, line bytea)")
        line = b"x" * 200
        out = []
        for i in range(N):
            t = time.perf_counter()
            await conn.execute(
                "INSERT INTO bare (session, seq, line) VALUES (%s, %s, %s)", ("b", i, line)
            )
            out.append(time.perf_counter() - t)
        return out


async def append_latency(store: PgStore) -> list[float]:
    log = await store.create("latency")
    out = []
    event = MessageReceived(sender="bench", text="x" * 100)
    for _ in range(N):
        t = time.perf_counter()
        await log.append(event)
        out.append(time.perf_counter() - t)
    await log.close()
    return out


async def worker(dsn: str, node: str, mode: str, seconds: float) -> int:
    """One node process of the throughput run: appends (or bare inserts) done."""
    store = PgStore(dsn, node=node, lease_ttl=60, pool_size=16)
    await store.connect()
    count = 0
    stop = time.monotonic() + seconds
    event = MessageReceived(sender="bench", text="x" * 100)
    if mode == "append":
        logs = [await store.create(f"{node}-{i}") for i in range(SESSIONS)]

        async def write(log: object) -> None:
            nonlocal count
            while time.monotonic() < stop:
                await log.append(event)  # type: ignore[attr-defined]
                count += 1

        await asyncio.gather(*(write(log) for log in logs))
        for log in logs:
            await log.close()
    else:
        pool = await store.connect()
        line = b"x" * 200

        async def insert(i: int) -> None:
            nonlocal count
            seq = 0
            while time.monotonic() < stop:
                seq += 1
                async with pool.connection() as conn:
                    await conn.execute(
                        "INSERT INTO bare (session, seq, line) VALUES (%s, %s, %s)",
                        (f"{node}-{i}", seq, line),
                    )
                count += 1

        await asyncio.gather(*(insert(i) for i in range(SESSIONS)))
    await store.aclose()
    return count


def throughput(dsn: str, mode: str) -> float:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "sessiond.bench.cluster", "--worker", dsn, f"{mode}{i}", mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    counts = [int(p.communicate(timeout=120)[0].strip()) for p in procs]
    return sum(counts) / SECONDS


async def wake_latency(dsn: str, store: PgStore) -> list[float]:
    """A message left for another node's session until that node has read it."""
    log = await store.create("wakee")
    await log.close()
    out = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("LISTEN sessiond_messages")
        for _ in range(300):
            t = time.perf_counter()
            await asyncio.to_thread(store.post_message, "wakee", "bench", "wake")
            async for _n in conn.notifies(timeout=5.0, stop_after=1):
                pass
            rows = await asyncio.to_thread(store.messages_for, ["wakee"])
            out.append(time.perf_counter() - t)
            for message, *_ in rows:
                await asyncio.to_thread(store.message_taken, message)
    return out


def ms(v: float) -> str:
    return f"{v * 1000:.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m sessiond.bench.cluster")
    parser.add_argument("--worker", nargs=3, metavar=("DSN", "NODE", "MODE"))
    args = parser.parse_args()
    if args.worker:
        dsn, node, mode = args.worker
        print(run_async(lambda: worker(dsn, node, mode, SECONDS)))
        return 0
    folder = Path(tempfile.mkdtemp(prefix="sessiond-bench-pg-"))
    server = LocalPostgres(folder, bindir())
    try:
        server.init()
        server.start()
        schema.migrate(server.dsn)
        store = PgStore(server.dsn, node="bench", lease_ttl=60)

        async def latencies() -> tuple[list[float], list[float], list[float]]:
            bare = await bare_latency(server.dsn)
            appends = await append_latency(store)
            wakes = await wake_latency(server.dsn, store)
            await store.aclose()
            return bare, appends, wakes

        bare, appends, wakes = run_async(latencies)
        floor = throughput(server.dsn, "bare")
        rate = throughput(server.dsn, "append")
        figures = {
            "machine": machine(),
            "bare_insert_commit_p50_ms": round(statistics.median(bare) * 1000, 3),
            "bare_insert_commit_p99_ms": round(pct(bare, 0.99) * 1000, 3),
            "append_p50_ms": round(statistics.median(appends) * 1000, 3),
            "append_p99_ms": round(pct(appends, 0.99) * 1000, 3),
            "append_p50_over_bare_p50": round(
                statistics.median(appends) / statistics.median(bare), 2
            ),
            "appends_per_s_three_nodes": round(rate),
            "bare_inserts_per_s_three_processes": round(floor),
            "appends_over_bare_floor": round(rate / floor, 2),
            "cross_node_message_p50_ms": round(statistics.median(wakes) * 1000, 3),
            "cross_node_message_p99_ms": round(pct(wakes, 0.99) * 1000, 3),
        }
        print(json.dumps(figures, indent=2))
        print(
            f"append p50 {ms(statistics.median(appends))} (bare INSERT+COMMIT "
            f"{ms(statistics.median(bare))}); {rate:.0f} appends/s from three nodes "
            f"(bare floor {floor:.0f}/s); cross-node message p50 {ms(statistics.median(wakes))} "
            f"p99 {ms(pct(wakes, 0.99))}",
            file=sys.stderr,
        )
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
