"""Three real nodes on one real PostgreSQL: kill -9 of one moves its sessions to
the others (docs/design.md section 10, "Failover")."""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Any

import psycopg
import pytest

from sessiond.cluster.lease import LEASE_LOST_EXIT
from tests.cluster.conftest import HELLO, SHARED, TTL, lease, taken_over
from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for
from tests.patience import SLOW


@pytest.mark.short_lease("n1")
def test_kill_9_of_a_node_moves_its_session_and_a_send_wakes_it_there(
    three: list[Daemon],
) -> None:
    first, *others = three
    spec = first.write_spec("hello", HELLO)
    first.ctl("create", str(spec), check=True)
    first.ctl("activate", "hello", check=True)
    wait_event(first, "hello", "run.finished")
    assert first.json("ps")[0]["name"] == "hello"
    for d in others:  # the others list it, and do not run what a live node owns
        assert [row["node"] for row in d.json("ps") if row["name"] == "hello"] == ["n1"]

    killed = time.monotonic()
    first.kill9()
    new = wait_for(lambda: taken_over(others, "hello"), timeout=TTL + 30, what="a take-over")
    moved = time.monotonic() - killed
    assert moved < TTL + 10 * SLOW, f"failover took {moved:.1f}s"

    seen = len(new.json("log", "hello"))
    bystander = next(d for d in others if d is not new)  # the send goes through it
    bystander.ctl("send", "hello", "wake up on your new node", check=True)
    finished = wait_event(new, "hello", "run.finished", since=seen + 1)
    records: list[dict[str, Any]] = new.json("log", "hello")
    epochs = [r["epoch"] for r in records]
    assert epochs == sorted(epochs)  # the epoch never decreases along the seqs
    nodes = [r["node"] for r in records]
    assert nodes[0] == "n1"
    assert finished["node"] in ("n2", "n3")
    assert finished["node"] != "n1"
    # n1's finished run was replayed on the new node, never run again: two runs in all
    assert (first.root / "out.txt").read_text() == "hello\nhello\n"
    print(f"failover: kill -9 to taken over in {moved:.2f}s (lease_ttl {TTL}s)")


def test_a_send_through_any_node_reaches_the_session_where_it_runs(
    three: list[Daemon],
) -> None:
    owner, other, third = three
    spec = owner.write_spec("hello", HELLO)
    owner.ctl("create", str(spec), check=True)
    sent = other.json("send", "hello", "from another node")
    assert sent["node"] == "n1"  # left in the database for its owner
    received = wait_event(owner, "hello", "message.received")
    assert received["data"]["text"] == "from another node"
    assert received["node"] == "n1"
    wait_event(owner, "hello", "run.finished")  # its message trigger woke it there
    text = third.ctl("send", "hello", "and from a third", check=True).stdout
    assert "on node n1" in text
    wait_event(
        owner, "hello", "message.received", match=lambda r: r["data"]["text"] == "and from a third"
    )
    missing = other.ctl("send", "nobody", "hi")
    assert missing.returncode == 4  # no such session anywhere: refused as on one machine


LEDGER = """name = "ledger"
[run]
exec = ["python3", "ledger.py"]
cwd = "."
side_effect = "read"
idempotency = "safe"
"""

# The program's own ledger: its run and the machine's monotonic time, 20 times a second.
LEDGER_PROGRAM = """import os, time
while True:
    with open("ledger", "a") as f:
        f.write(os.environ["SESSIOND_RUN"] + " " + repr(time.monotonic()) + "\\n")
    time.sleep(0.05)
"""


@pytest.mark.short_lease("n1")
def test_a_paused_node_writes_nothing_stale_and_its_programs_stop_by_the_deadline(
    three: list[Daemon],
) -> None:
    first, *others = three
    spec = first.write_spec("ledger", LEDGER)
    (first.root / "ledger.py").write_text(LEDGER_PROGRAM)
    first.ctl("create", str(spec), check=True)
    first.ctl("activate", "ledger", check=True)
    run = wait_event(first, "ledger", "run.started")["data"]["run"]
    ledger = first.root / "ledger"
    wait_for(lambda: ledger.exists() and ledger.read_text().count("\n") >= 2, what="the ledger")

    assert first.proc is not None
    stopped = time.monotonic()
    os.kill(first.proc.pid, signal.SIGSTOP)  # the daemon only: its spawner runs on
    try:
        new = wait_for(lambda: taken_over(others, "ledger"), timeout=TTL + 30, what="take-over")
        taken = time.monotonic()
        # paused for twice its lease_ttl in all, as the scenario says
        wait_for(lambda: time.monotonic() - stopped >= 2 * TTL, what="2 x lease_ttl")
        # Told to stop while still paused (a supervisor's SIGTERM): on waking it has
        # both the stop and its lapsed lease before it. Either way it writes
        # nothing and ends as a lost lease does, never through a graceful stop.
        os.kill(first.proc.pid, signal.SIGTERM)
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    assert first.stop(timeout=30) == LEASE_LOST_EXIT  # woke up, found its lease lost, ended

    # Its program's own ledger: nothing after the deadline (last renewal + ttl -
    # margin, and the last renewal was before the pause), nothing once taken over.
    mine = [
        float(line.split()[1]) for line in ledger.read_text().splitlines() if line.split()[0] == run
    ]
    assert mine
    assert max(mine) <= stopped + TTL, (max(mine) - stopped, TTL)
    assert max(mine) < taken

    # The log: the epoch never decreases along the seqs, and nothing the paused
    # node wrote landed after the new owner's first event (0 stale writes).
    records: list[dict[str, Any]] = new.json("log", "ledger")
    epochs = [r["epoch"] for r in records]
    assert epochs == sorted(epochs)
    first_new = min(r["seq"] for r in records if r["node"] != "n1")
    stale = [r for r in records if r["node"] == "n1" and r["seq"] > first_new]
    assert stale == []
    assert any(r["type"] == "run.finished" and r["node"] != "n1" for r in records)


def test_a_node_cut_off_from_the_database_stops_its_programs_and_its_sessions_move(
    pg_dsn: str,
) -> None:
    # n1 logs in as a role of its own, so that it alone can be cut off
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE n1user LOGIN SUPERUSER")
    cut_dsn = pg_dsn.replace("sessiond@", "n1user@", 1)
    n1 = Daemon(short_dir(), f'[cluster]\ndsn = "{cut_dsn}"\nnode = "n1"\n{lease(True)}{SHARED}')
    n2 = Daemon(short_dir(), f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n2"\n{lease(False)}{SHARED}')
    try:
        n1.start()
        n2.start()
        spec = n1.write_spec("ledger", LEDGER)
        (n1.root / "ledger.py").write_text(LEDGER_PROGRAM)
        n1.ctl("create", str(spec), check=True)
        n1.ctl("activate", "ledger", check=True)
        run = wait_event(n1, "ledger", "run.started")["data"]["run"]
        ledger = n1.root / "ledger"
        wait_for(lambda: ledger.exists() and ledger.read_text().count("\n") >= 2, what="ledger")

        cut = time.monotonic()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # no new connections, and
            conn.execute("ALTER ROLE n1user NOLOGIN")  # the ones it has are closed
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'n1user'"
            )
        n1.wait_line("cluster.lease_lost", timeout=TTL + 30)
        assert n1.stop(timeout=30) == LEASE_LOST_EXIT
        wait_for(lambda: taken_over([n2], "ledger"), timeout=TTL + 30, what="n2 to take it")

        mine = [
            float(line.split()[1])
            for line in ledger.read_text().splitlines()
            if line.split()[0] == run
        ]
        assert max(mine) <= cut + TTL  # stopped by the deadline, on the machine's clock
        records: list[dict[str, Any]] = n2.json("log", "ledger")
        first_new = min(r["seq"] for r in records if r["node"] == "n2")
        assert all(r["seq"] < first_new for r in records if r["node"] == "n1")
        assert [r["epoch"] for r in records] == sorted(r["epoch"] for r in records)
    finally:
        for d in (n1, n2):
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)
