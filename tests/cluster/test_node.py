"""A real sessiond node on a real PostgreSQL ([cluster] dsn), driven by sessionctl."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sessiond.cluster.lease import LEASE_LOST_EXIT
from sessiond.log.store.pg.pgstore import PgStore
from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for

DONE = """name = "job"
[run]
exec = ["sh", "-c", "echo ran >> out.txt"]
cwd = "."
writes = ["out.txt"]
retries = 0
"""

LONG = """name = "long"
[run]
exec = ["sh", "-c", "echo $$ > pid; exec sleep 600.4242"]
cwd = "."
retries = 0
"""


@pytest.fixture
def node(pg_dsn: str) -> Iterator[Daemon]:
    root = short_dir()
    config = f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n1"\nlease_ttl = "3s"\n'
    daemon = Daemon(root, config)
    try:
        yield daemon.start()
    finally:
        daemon.reap()
        shutil.rmtree(root, ignore_errors=True)


def events(d: Daemon, name: str) -> list[dict[str, Any]]:
    return d.json("log", name)  # type: ignore[no-any-return]


def test_a_node_runs_a_session_and_every_event_names_node_and_epoch(node: Daemon) -> None:
    spec = node.write_spec("job", DONE)
    node.ctl("create", str(spec), check=True)
    node.ctl("activate", "job", check=True)
    wait_event(node, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
    records = events(node, "job")
    assert records
    assert len({(r["node"], r["epoch"]) for r in records}) == 1  # one owner, one claim
    assert records[0]["node"] == "n1"
    assert (node.root / "out.txt").read_text() == "ran\n"


def test_a_restarted_node_claims_its_sessions_under_a_new_epoch(node: Daemon) -> None:
    spec = node.write_spec("job", DONE)
    node.ctl("create", str(spec), check=True)
    node.kill9()
    node.start()
    node.ctl("activate", "job", check=True)
    wait_event(node, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
    epochs = [r["epoch"] for r in events(node, "job")]
    assert epochs[-1] > epochs[0]  # claimed again by the new incarnation
    assert epochs == sorted(epochs)  # never decreases along the seqs


def test_a_node_that_lost_its_lease_ends_and_its_program_with_it(node: Daemon, pg_dsn: str) -> None:
    spec = node.write_spec("long", LONG)
    node.ctl("create", str(spec), check=True)
    node.ctl("activate", "long", check=True)
    wait_event(node, "long", "run.started")
    pid_file = node.root / "pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="pid")
    # the pid it wrote is its own pid namespace's (the sandbox): found on the host
    # by its distinctive command line instead
    (pid,) = wait_for(lambda: _host_pids(b"sleep\x00600.4242\x00"), what="the program's pid")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as if paused past lease_ttl
        conn.execute("UPDATE nodes SET lease_until = now() - interval '1 second'")
    node.wait_line("cluster.lease_lost", timeout=30)
    assert node.stop(timeout=30) == LEASE_LOST_EXIT
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), what="the program to be stopped")
    reader = PgStore(pg_dsn, node="reader")
    try:
        types = [r["type"] for r in reader.read("long")]
    finally:
        reader.close_sync()
    # The lost node recorded nothing of its run's end: it stopped writing (and its
    # program) at the lapse; the session waits for its next owner's replay and gate.
    assert "run.started" in types
    assert "run.finished" not in types


def _host_pids(cmdline: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read() == cmdline:
                        found.append(int(entry))
            except OSError:
                continue  # gone meanwhile
    return found


def test_nodes_lists_the_cluster_and_ps_names_each_sessions_node(node: Daemon) -> None:
    spec = node.write_spec("job", DONE)
    node.ctl("create", str(spec), check=True)
    (row,) = node.json("nodes")
    assert (row["name"], row["state"], row["alive"], row["self"]) == ("n1", "up", True, True)
    assert row["incarnation"] == 1
    assert row["sessions"] == 1
    assert 0 <= row["lease_age_s"] < 3
    text = node.ctl("nodes", check=True).stdout
    assert "INCARNATION" in text
    assert "n1 *" in text
    assert node.json("ps")[0]["node"] == "n1"
    assert "NODE" in node.ctl("ps", check=True).stdout


def test_nodes_is_refused_by_a_daemon_on_files() -> None:
    from tests.e2e.harness import running

    with running() as d:
        done = d.ctl("nodes")
        assert done.returncode == 1
        assert "[cluster] dsn" in done.stderr
        assert "NODE" not in d.ctl("ps", check=True).stdout
