"""``python -m sessiond.bench.cluster``: the cluster backend's figures, side by side.

Starts a PostgreSQL of its own (sessiond.localpg: fsync on, ``synchronous_commit
= on``, a Unix socket), makes the schema, and measures in one run:

- append latency, sample by sample in turn so both see the same machine: a
  fenced append (``PgEventLog.append``: the record built, the epoch and lease
  check and the insert in one statement, one commit) beside a bare single-row
  ``INSERT`` + commit on the same server, and beside the fenced statement alone
  sent on a connection of its own (what the database costs, without the node);
- appends/s from three node processes at once (each a ``PgStore`` with its own
  lease and incarnation, 50 sessions, one writer coroutine each; they start
  together at a barrier), beside the floor: the same three processes, the same
  50 writers each, committing plain rows through a bare group commit (one
  multi-row ``INSERT`` per batch, two in flight per process, no fence, no
  event). Rounds alternate the two; medians are quoted;
- the database part of a cross-node wake: a message left for another node's
  session (the ``messages`` row and its NOTIFY, committed) until that node,
  LISTENing, has read it from the table.

``--nodes`` adds the figures of real ``sessiond`` nodes (cluster_nodes.py): a
cross-node wake end to end, and failover over several rounds.

``--fleet`` (``--fleet-nodes N --sessions M``, or ``--curve 3x1000,10x10000``)
measures instead a fleet of N nodes and M sessions on one PostgreSQL: placement
skew, append throughput, failover of a node's sessions, connections, cron once,
RSS (fleet.py).
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
from typing import Any

import psycopg

from sessiond.bench import machine, run_async
from sessiond.cluster.pg import mail
from sessiond.localpg import LocalPostgres, bindir
from sessiond.log.event_data import MessageReceived
from sessiond.log.store.pg import schema
from sessiond.log.store.pg.arrays import ByteaArray, Int8Array, TextArray
from sessiond.log.store.pg.committer import Batch, statement
from sessiond.log.store.pg.pgstore import PgStore

SESSIONS = 50  # per node process
BARE = "CREATE TABLE IF NOT EXISTS bare (session text, seq bigint, line bytea)"
INSERT_ONE = "INSERT INTO bare (session, seq, line) VALUES (%s, %s, %s)"
INSERT_MANY = (
    "INSERT INTO bare (session, seq, line) "
    "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::bytea[])"
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latencies(dsn: str, store: PgStore, n: int) -> dict[str, list[float]]:
    """Bare insert, fenced append and the fenced statement alone, in turn."""
    log = await store.create("latency")
    raw = await store.create("statement")
    await raw.close()
    event = MessageReceived(sender="bench", text="x" * 100)
    line = b"x" * 200
    out: dict[str, list[float]] = {"bare": [], "append": [], "statement": []}
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=0
    ) as conn:
        await conn.execute(BARE)
        for i in range(n):
            t = time.perf_counter()
            await conn.execute(INSERT_ONE, ("b", i, line))
            out["bare"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await log.append(event)
            out["append"].append(time.perf_counter() - t)
            t = time.perf_counter()
            batch = Batch("statement", raw.epoch, i, [i + 1], [f"s{i + 1}"], [line])
            cur = await conn.execute(*statement([batch], store.lease))
            if not await cur.fetchall():
                raise RuntimeError("the bench's own fenced statement was refused")
            out["statement"].append(time.perf_counter() - t)
    await log.close()
    return out


class BareGroupCommit:
    """The floor's group commit: rows waiting are inserted in one statement, at
    most ``parallel`` in flight; no fence, no event, no log."""

    def __init__(self, conns: list[psycopg.AsyncConnection[Any]]) -> None:
        self._free = list(conns)
        self._queue: list[tuple[str, int, bytes, asyncio.Future[None]]] = []

    async def insert(self, session: str, seq: int, line: bytes) -> None:
        done = asyncio.get_running_loop().create_future()
        self._queue.append((session, seq, line, done))
        if self._free:
            asyncio.get_running_loop().call_soon(self._start)
        await done

    def _start(self) -> None:
        if self._free and self._queue:
            rows, self._queue = self._queue, []
            asyncio.get_running_loop().create_task(self._commit(self._free.pop(), rows))

    async def _commit(
        self, conn: psycopg.AsyncConnection[Any], rows: list[tuple[str, int, bytes, Any]]
    ) -> None:
        try:
            await conn.execute(
                INSERT_MANY,
                (
                    TextArray.of([r[0] for r in rows]),
                    Int8Array.of([r[1] for r in rows]),
                    ByteaArray.of([r[2] for r in rows]),
                ),
            )
        except Exception as exc:
            for *_, done in rows:
                done.set_exception(exc)
            return
        for *_, done in rows:
            done.set_result(None)
        self._free.append(conn)
        self._start()


async def worker(dsn: str, node: str, mode: str, seconds: float) -> int:
    """One node process of the throughput run: appends (or bare rows) committed."""
    count = 0
    event = MessageReceived(sender="bench", text="x" * 100)
    line = b"x" * 200
    store = PgStore(dsn, node=node, lease_ttl=600, pool_size=4)
    await store.connect()
    conns = []
    if mode == "append":
        logs = [await store.create(f"{node}-{i}") for i in range(SESSIONS)]
    else:
        conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(2)]
        bare = BareGroupCommit(conns)
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # the barrier: all three start at once
    stop = time.monotonic() + seconds

    async def write(i: int) -> None:
        nonlocal count
        seq = 0
        while time.monotonic() < stop:
            if mode == "append":
                await logs[i].append(event)
            else:
                seq += 1
                await bare.insert(f"{node}-{i}", seq, line)
            count += 1

    await asyncio.gather(*(write(i) for i in range(SESSIONS)))
    if mode == "append":
        for log in logs:
            await log.close()
    for conn in conns:
        await conn.close()
    await store.aclose()
    return count


def throughput(dsn: str, mode: str, round_: int, seconds: float) -> float:
    """Rows committed per second by three node processes running at once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(BARE)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sessiond.bench.cluster",
                "--worker",
                dsn,
                f"{mode}{round_}x{i}",
                mode,
                str(seconds),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {mode} worker did not start")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        counts = [int(p.communicate(timeout=300)[0].strip()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return sum(counts) / seconds


async def wake_latency(dsn: str, store: PgStore, n: int) -> list[float]:
    """A message left for another node's session (mail.post: the row and its
    NOTIFY, one statement) until a LISTENing connection has it from the
    notification's payload; the sender's flush and the owner's mark follow."""
    log = await store.create("wakee")
    await log.close()
    pool = await store.connect()
    out = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"LISTEN {mail.CHANNEL}")
        for _ in range(n):
            t = time.perf_counter()
            posted = await mail.post(pool, "wakee", "bench", "wake")
            assert posted is not None
            got = [mail.parse(note.payload) async for note in conn.notifies(stop_after=1)]
            out.append(time.perf_counter() - t)
            if not isinstance(got[0], mail.Message) or got[0].id != posted[0]:
                raise RuntimeError(f"the notification did not carry message {posted[0]}")
            await mail.flush(pool, posted[0])
            await mail.taken(pool, posted[0])
    return out


def ms(values: list[float], q: float = 0.5) -> float:
    return round((statistics.median(values) if q == 0.5 else pct(values, q)) * 1000, 3)


def measure(dsn: str, quick: bool) -> dict[str, object]:  # figures, and rounds
    n = 300 if quick else 2000
    rounds, seconds = (1, 2.0) if quick else (3, 5.0)
    store = PgStore(dsn, node="bench", lease_ttl=600)

    async def latency_run() -> tuple[dict[str, list[float]], list[float]]:
        lat = await latencies(dsn, store, n)
        wakes = await wake_latency(dsn, store, n // 6)
        await store.aclose()
        return lat, wakes

    lat, wakes = run_async(latency_run)
    floors, rates = [], []
    for r in range(rounds):  # alternated: both see the machine's same moods
        floors.append(throughput(dsn, "bare", r, seconds))
        rates.append(throughput(dsn, "append", r, seconds))
    bare, append, statement = lat["bare"], lat["append"], lat["statement"]
    return {
        "bare_insert_commit_p50_ms": ms(bare),
        "bare_insert_commit_p99_ms": ms(bare, 0.99),
        "append_p50_ms": ms(append),
        "append_p99_ms": ms(append, 0.99),
        "append_p50_over_bare_p50": round(statistics.median(append) / statistics.median(bare), 2),
        "fenced_statement_p50_ms": ms(statement),
        "fenced_statement_p50_over_bare_p50": round(
            statistics.median(statement) / statistics.median(bare), 2
        ),
        "appends_per_s_three_nodes": round(statistics.median(rates)),
        "appends_per_s_rounds": [round(x) for x in rates],
        "bare_batched_inserts_per_s_three_processes": round(statistics.median(floors)),
        "bare_batched_rounds": [round(x) for x in floors],
        "appends_over_bare_floor": round(statistics.median(rates) / statistics.median(floors), 2),
        "cross_node_message_db_p50_ms": ms(wakes),
        "cross_node_message_db_p99_ms": ms(wakes, 0.99),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m sessiond.bench.cluster")
    parser.add_argument("--worker", nargs=4, metavar=("DSN", "NODE", "MODE", "SECONDS"))
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter rounds")
    parser.add_argument(
        "--nodes", action="store_true", help="also real nodes: wake end to end, failover rounds"
    )
    fleet = parser.add_argument_group("the fleet (sessiond/bench/fleet.py)")
    fleet.add_argument(
        "--fleet", action="store_true", help="only the fleet: N real nodes on one PostgreSQL"
    )
    fleet.add_argument("--fleet-nodes", type=int, default=10, metavar="N", help="default 10")
    fleet.add_argument("--sessions", type=int, default=10_000, metavar="M", help="default 10000")
    fleet.add_argument(
        "--curve", metavar="NxM,...", help="several fleets in one run, e.g. 3x1000,5x5000,10x10000"
    )
    fleet.add_argument("--lease-ttl", type=float, default=10.0, metavar="S", help="default 10")
    fleet.add_argument("--clients", type=int, default=8, help="requests at once (default 8)")
    fleet.add_argument("--send-seconds", type=float, default=10.0, metavar="S", help="default 10")
    fleet.add_argument(
        "--settle", type=float, default=15.0, metavar="S", help="after the return (default 15)"
    )
    args = parser.parse_args()
    if args.fleet or args.curve:
        from sessiond.bench import fleet as fleet_bench

        try:
            points = (
                [(int(n), int(m)) for n, m in (p.split("x") for p in args.curve.split(","))]
                if args.curve
                else [(args.fleet_nodes, args.sessions)]
            )
        except ValueError:
            parser.error(f"--curve {args.curve!r}: say NODESxSESSIONS,..., e.g. 3x1000,10x10000")
        if any(n < 2 or m < 1 for n, m in points):
            parser.error("a fleet needs at least 2 nodes (one is killed) and 1 session")
        return fleet_bench.main(
            points, args.lease_ttl, args.clients, args.send_seconds, args.settle
        )
    if args.worker:
        dsn, node, mode, seconds = args.worker
        print(run_async(lambda: worker(dsn, node, mode, float(seconds))))
        return 0
    folder = Path(tempfile.mkdtemp(prefix="sessiond-bench-pg-"))
    server = LocalPostgres(folder, bindir())
    started = time.monotonic()
    try:
        server.init()
        server.start()
        schema.migrate(server.dsn)
        figures: dict[str, object] = {"machine": machine(), **measure(server.dsn, args.quick)}
        if args.nodes:
            from sessiond.bench import cluster_nodes

            figures.update(cluster_nodes.measure(server, folder, args.quick))
        figures["seconds"] = round(time.monotonic() - started)
        print(json.dumps(figures, indent=2))
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
