"""``python -m sessiond.bench.cluster --fleet``: a fleet of real ``sessiond`` nodes
on one PostgreSQL of this machine (default 10 nodes, 10,000 sessions).

One run, in order:

1. the nodes start at once; a cron session (``* * * * *``) is created through
   the first node, then the sessions (a tiny program each, no trigger) through
   the nodes in turn: sessions created per second;
2. **placement**: sessions per live node and max/mean, from ``sessionctl nodes
   --json`` (with the load figures it gives, where it gives them) or, where it
   has no per-node count, from the database's ``sessions`` table;
3. **append throughput**: ``send`` to random sessions through their owners,
   ``clients`` at once, for a few seconds: events committed per second (the
   database's count before and after);
4. **failover**: kill -9 of the node that holds the cron session (about
   sessions/nodes of them); for each of its sessions, the time from the kill
   until a survivor logs ``cluster.taken_over`` (the session claimed, replayed,
   armed, served), p50/p99/max; then every one of them is checked in the
   database (owned by a live node) and answered by ``show`` through its owner;
5. **return**: the killed node starts again (a new incarnation), and placement
   is read again after ``settle`` seconds (today nothing moves back: the
   figure says so);
6. **cron once**: the cron session's fires in its log, one per fire time, one
   for each minute that began while it existed (it waits for a fire after
   the take-over);
7. throughout, every second: PostgreSQL connections in use (``pg_stat_activity``)
   and each node's RSS (the daemon and its spawner).

``run`` returns the figures and a ``correct`` part (what the test of the reduced
form asserts: every session placed and owned once, none lost, cron once).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from sessiond.bench.cluster_nodes import until
from sessiond.bench.daemon import call
from sessiond.bench.fleet_nodes import (
    CRON,
    Db,
    Figures,
    FleetNode,
    Sampler,
    calling,
    create_all,
    minute_boundaries,
    placement,
    start_all,
)

CRON_NAME = "fleet-cron"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def quantile(seconds: list[float], of: int, q: float) -> float | None:
    """The ``q`` quantile of ``of`` times of which only ``seconds`` ever came."""
    if not of:
        return None
    got = sorted(seconds) + [math.inf] * (of - len(seconds))
    value = got[min(of - 1, int(q * of))]
    return None if math.isinf(value) else round(value, 2)


def _until(check: Any, timeout: float, what: str) -> Any:
    return until(check, timeout, what, step=0.05)  # a fleet answers slower than a node


def listing(nodes: list[FleetNode], expected: set[str]) -> Figures:
    """One ``ps`` through a live node: the whole fleet, each row from the node
    that runs it."""
    live = [n for n in nodes if n.up]
    rows = calling(live[0], "ps", {"all": True})
    names = [str(r["name"]) for r in rows]
    where = {str(r["name"]): r.get("node") for r in rows}
    up = {n.name for n in live}
    return {
        "listed": len(names),
        "twice": len(names) - len(set(names)),
        "missing": len(expected - set(names)),
        "not_on_a_live_node": sum(1 for n in expected if where.get(n) not in up),
    }


def owned_once(nodes: list[FleetNode], expected: set[str]) -> Figures:
    """Every session listed once, each on a live node. ``ps`` asks the nodes one
    after another, so a session handed from one to the other meanwhile (placement
    moving a share to a returned node) can be listed twice or by neither: looked
    at again, up to 30 s, until the listing is whole. A session that two nodes
    really run, or that none does, stays so and is counted. ``looks``: how many."""
    deadline = time.monotonic() + 30
    looks = 0
    while True:
        looks += 1
        got = listing(nodes, expected)
        whole = got["twice"] == got["missing"] == got["not_on_a_live_node"] == 0
        if whole or time.monotonic() > deadline:
            return {**got, "looks": looks}
        time.sleep(0.5)  # a tool waiting for a move to finish, not a test


def throughput(
    nodes: list[FleetNode], db: Db, names: list[str], seconds: float, clients: int
) -> Figures:
    """``send`` through each session's owner, ``clients`` at once, for ``seconds``."""
    owner = dict(db.rows("SELECT name, owner FROM sessions WHERE name = ANY(%s)", (names,)))
    by_name = {n.name: n for n in nodes}
    sent = [0] * clients
    before = db.events()
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        pick = random.Random(i)
        while time.monotonic() < stop:
            name = pick.choice(names)
            params = {"to": name, "text": "x", "sender": "bench"}
            calling(by_name[owner[name]], "send", params)
            sent[i] += 1

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        for _ in pool.map(client, range(clients)):
            pass
    took = time.monotonic() - started
    events = db.events() - before
    return {
        "seconds": round(took, 1),
        "clients": clients,
        "sends_per_s": round(sum(sent) / took),
        "events_per_s": round(events / took),
    }


def failover(nodes: list[FleetNode], db: Db, victim: FleetNode, ttl: float) -> Figures:
    """kill -9 of ``victim``: per session of its, kill until a survivor's take-over."""
    theirs = [
        str(r[0]) for r in db.rows("SELECT name FROM sessions WHERE owner = %s", (victim.name,))
    ]
    survivors = [n for n in nodes if n is not victim]
    for n in survivors:
        n.taken.clear()
    killed = time.monotonic()
    victim.kill9()

    def all_taken() -> bool:
        return all(any(s in n.taken for n in survivors) for s in theirs)

    # Not an error when some are never taken over: that is a finding, and the
    # figures say how many (the test of the reduced form asserts none).
    with contextlib.suppress(RuntimeError):
        _until(all_taken, ttl + 60 + len(theirs) * 0.1, f"the take-over of {len(theirs)} sessions")
    waited = time.monotonic() - killed
    seconds = [
        min(n.taken[s] for n in survivors if s in n.taken) - killed
        for s in theirs
        if any(s in n.taken for n in survivors)
    ]
    owners = db.owner_of(theirs)
    by_name = {n.name: n for n in survivors}
    moved_to: dict[str, int] = {}
    for s in theirs:
        moved_to[str(owners.get(s))] = moved_to.get(str(owners.get(s)), 0) + 1

    def served(s: str) -> bool:
        node = by_name.get(str(owners.get(s)))
        return (
            node is not None
            and s in node.taken
            and call(node.socket, "show", {"name": s})["name"] == s
        )

    with ThreadPoolExecutor(8) as pool:
        answered = sum(pool.map(served, theirs))
    return {
        "victim": victim.name,
        "sessions": len(theirs),
        "lease_ttl_s": ttl,
        # over all its sessions: null where that quantile was never taken over
        "p50_s": quantile(seconds, len(theirs), 0.5),
        "p99_s": quantile(seconds, len(theirs), 0.99),
        "first_s": round(min(seconds), 2) if seconds else None,
        "max_s": round(max(seconds), 2) if seconds else None,
        "moved_to": moved_to,
        "not_on_a_survivor": sum(1 for s in theirs if str(owners.get(s)) not in by_name),
        # how fast the survivors claim, replay and arm: the fleet's take-over rate
        "taken_per_s": round(len(seconds) / (max(seconds) - min(seconds)))
        if len(seconds) > 1 and max(seconds) > min(seconds)
        else None,
        "taken_over": len(seconds),
        "not_taken_over": len(theirs) - len(seconds),
        "waited_s": round(waited, 1),
        "served": answered,
    }


def cron_once(db: Db, killed_at: datetime) -> Figures:
    """The cron session's fires: each fire time once, one per minute it lived."""
    fires = _until(
        lambda: (
            (f := db.cron_fires(CRON_NAME))
            and any(datetime.fromisoformat(x) > killed_at for x in f)
            and f
        ),
        75,
        "a cron fire after the take-over",
    )
    created, now = db.rows("SELECT created_at, now() FROM sessions WHERE name = %s", (CRON_NAME,))[
        0
    ]
    expected = minute_boundaries(created, now)
    keys = int(db.one("SELECT count(*) FROM wakes WHERE session = %s", (CRON_NAME,)))
    return {
        "minutes": expected,
        "fires": len(fires),
        "distinct": len(set(fires)),
        "twice": len(fires) - len(set(fires)),
        "dedup_keys": keys,
        # a fire due in the very second of the check may not have landed yet
        "missed": max(0, expected - len(set(fires)) - 1),
    }


def steady(
    nodes: list[FleetNode], db: Db, ws: Path, *, sessions: int, clients: int, send_s: float
) -> Figures:
    """Steps 1 to 3: the cron session and ``sessions`` tiny ones created, placement,
    connections, append throughput, RSS."""
    out: Figures = {"connections_idle_fleet": db.connections()}
    spec = CRON.format(name=CRON_NAME, ws=ws)
    call(nodes[0].socket, "create", {"spec": spec, "base": str(ws), "source": CRON_NAME})
    names = [f"s{i:06d}" for i in range(sessions)]
    t = time.monotonic()
    create_all(nodes, names, ws, clients)
    took = time.monotonic() - t
    out["create"] = {"seconds": round(took, 1), "per_s": round(sessions / took)}
    out["placement_created"] = placement(nodes, db)
    out["connections_steady"] = db.connections()
    if send_s > 0:
        out["throughput"] = throughput(nodes, db, names, send_s, clients)
    out["rss_kib_steady"] = {n.name: n.rss() for n in nodes}
    return out


def size(db: Db) -> Figures:
    """What the fleet left in the database: for the plan's arithmetic (docs/scale.md)."""
    events, avg = db.rows("SELECT count(*), coalesce(avg(octet_length(line)), 0) FROM events")[0]
    return {
        "events": int(events),
        "event_line_bytes_avg": round(float(avg)),
        "events_table_bytes": int(db.one("SELECT pg_total_relation_size('events')")),
        "sessions_table_bytes": int(db.one("SELECT pg_total_relation_size('sessions')")),
        "database_bytes": int(db.one("SELECT pg_database_size(current_database())")),
    }


def run(
    dsn: str,
    folder: Path,
    *,
    count: int = 10,
    sessions: int = 10_000,
    ttl: float = 10.0,
    clients: int = 8,
    send_seconds: float = 10.0,
    settle: float = 15.0,
    say: Any = print,
) -> Figures:
    """The fleet's figures (module docstring); ``folder`` holds the nodes and the
    sessions' shared workspace, and is removed after."""
    ws = folder / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    nodes = [FleetNode(folder / f"f{i}", dsn, f"f{i}", ttl, ws) for i in range(1, count + 1)]
    db = Db(dsn)
    sampler: Sampler | None = None
    out: Figures = {"nodes": count, "sessions": sessions, "lease_ttl_s": ttl}
    expected = {*(f"s{i:06d}" for i in range(sessions)), CRON_NAME}
    try:
        start_all(nodes)
        sampler = Sampler(db, nodes)
        out.update(steady(nodes, db, ws, sessions=sessions, clients=clients, send_s=send_seconds))
        correct: Figures = {"created": owned_once(nodes, expected)}
        say(f"{count} nodes, {sessions} sessions created in {out['create']['seconds']} s")
        victim = next(n for n in nodes if n.name == db.owner_of([CRON_NAME])[CRON_NAME])
        killed_at = datetime.fromisoformat(str(db.one("SELECT now()")))
        out["failover"] = failover(nodes, db, victim, ttl)
        out["placement_failed_over"] = placement(nodes, db)
        correct["failed_over"] = owned_once(nodes, expected)
        say(f"failover of {victim.name}: p50 {out['failover']['p50_s']} s; it starts again")
        victim.launch()
        victim.wait_ready()
        time.sleep(settle)  # what placement does with a returned node meanwhile
        out["placement_returned"] = {**placement(nodes, db), "after_s": settle}
        correct["returned"] = owned_once(nodes, expected)
        out["cron"] = cron_once(db, killed_at)
        out["connections_end"] = db.connections()
        out["connections_max"] = sampler.max_connections
        out["rss_kib_max"] = dict(sampler.max_rss)
        out["max_connections_setting"] = int(db.one("SHOW max_connections"))
        # a node that ended by itself (its lease lapsed under load: exit 75) and was
        # started again, as a supervisor would: each end's exit code
        out["ended_by_itself"] = {n.name: n.ended for n in nodes if n.ended}
        out["database"] = size(db)
        correct["sessions_in_db"] = int(db.one("SELECT count(*) FROM sessions"))
        correct["unowned_in_db"] = int(db.one("SELECT count(*) FROM sessions WHERE owner IS NULL"))
        out["correct"] = correct
    finally:
        if sampler is not None:
            sampler.stop()
        stoppers = [threading.Thread(target=n.stop) for n in nodes]
        for th in stoppers:
            th.start()
        for th in stoppers:
            th.join()
        db.close()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def spread(kib: list[int]) -> str:
    return f"{mib(min(kib))}-{mib(max(kib))}"


def skew(p: Figures) -> str:
    return f"{p['skew_max_over_mean']} (max {p['max']}, min {p['min']}, from {p['source']})"


def table(f: Figures) -> str:
    """The figures of one fleet, a line each."""
    fo, cron, tp = f["failover"], f["cron"], f.get("throughput")
    rss = f["rss_kib_steady"]
    rows = [
        ("fleet", f"{f['nodes']} nodes x {f['sessions']} sessions, lease_ttl {f['lease_ttl_s']} s"),
        ("load average", f"{f['load_before']} before, {f['load_after']} after"),
        ("created", f"{f['create']['per_s']} sessions/s ({f['create']['seconds']} s)"),
        ("skew, created", skew(f["placement_created"])),
        (
            "append throughput",
            f"{tp['events_per_s']} events/s ({tp['sends_per_s']} sends/s, {tp['clients']} clients)"
            if tp
            else "-",
        ),
        (
            "failover",
            f"{fo['victim']}'s {fo['sessions']}: p50 {fo['p50_s']} s, p99 {fo['p99_s']} s, "
            f"max {fo['max_s']} s; {fo['not_taken_over']} never taken over in {fo['waited_s']} s",
        ),
        ("skew, failed over", skew(f["placement_failed_over"])),
        (f"skew, back {f['placement_returned']['after_s']} s", skew(f["placement_returned"])),
        (
            "cron once",
            f"{cron['distinct']} fire times in {cron['minutes']} minutes: "
            f"{cron['twice']} twice, {cron['missed']} missed",
        ),
        (
            "PG connections",
            f"{f['connections_idle_fleet']['total']} idle fleet, "
            f"{f['connections_steady']['total']} steady, {f['connections_max']} max "
            f"(max_connections {f['max_connections_setting']})",
        ),
        (
            "RSS MiB per node",
            f"daemon {spread([r[0] for r in rss.values()])}, "
            f"spawner {spread([r[1] for r in rss.values()])}; "
            f"both at most {mib(max(f['rss_kib_max'].values()))}",
        ),
    ]
    return "\n".join(f"{k:<22}{v}" for k, v in rows)


CURVE_COLUMNS = (
    ("nodes", lambda f: f["nodes"]),
    ("sessions", lambda f: f["sessions"]),
    ("create/s", lambda f: f["create"]["per_s"]),
    ("skew", lambda f: f["placement_created"]["skew_max_over_mean"]),
    ("events/s", lambda f: (f.get("throughput") or {}).get("events_per_s", "-")),
    ("fo p50 s", lambda f: f["failover"]["p50_s"]),
    ("fo p99 s", lambda f: f["failover"]["p99_s"]),
    ("stranded", lambda f: f["failover"]["not_taken_over"]),
    ("skew fo", lambda f: f["placement_failed_over"]["skew_max_over_mean"]),
    ("skew back", lambda f: f["placement_returned"]["skew_max_over_mean"]),
    ("conns max", lambda f: f["connections_max"]),
    ("RSS MiB", lambda f: mib(max(f["rss_kib_max"].values()))),
    ("cron 2x/miss", lambda f: f"{f['cron']['twice']}/{f['cron']['missed']}"),
)


def curve_table(points: list[Figures]) -> str:
    head = [c for c, _ in CURVE_COLUMNS]
    body = [[str(get(f)) for _, get in CURVE_COLUMNS] for f in points]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *body]
    )


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(
    points: list[tuple[int, int]], ttl: float, clients: int, send_s: float, settle: float
) -> int:
    """Each (nodes, sessions) point on a database of its own, one server: a table
    each, the curve, then every figure as JSON."""
    from sessiond.bench import machine
    from sessiond.localpg import LocalPostgres, bindir
    from sessiond.log.store.pg import schema

    server = LocalPostgres(Path(tempfile.mkdtemp(prefix="sessiond-fleet-pg-")), bindir())
    work = Path(tempfile.mkdtemp(prefix="sessiond-fleet-"))
    figures: list[Figures] = []
    try:
        server.init()
        server.start()
        for i, (count, sessions) in enumerate(points, 1):
            server.createdb(f"fleet{i}")
            dsn = server.dsn_for(f"fleet{i}")
            schema.migrate(dsn)
            before = load()
            got = run(dsn, work / f"p{i}", count=count, sessions=sessions, ttl=ttl,
                      clients=clients, send_seconds=send_s, settle=settle,
                      say=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
            figures.append({**got, "load_before": before, "load_after": load()})
            print(table(figures[-1]), end="\n\n", flush=True)
    finally:
        server.stop()
        shutil.rmtree(server.folder, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    if len(figures) > 1:
        print(curve_table(figures), end="\n\n")
    print(json.dumps({"machine": machine(), "fleets": figures}, indent=2))
    return 0
