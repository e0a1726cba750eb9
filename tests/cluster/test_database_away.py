"""Operating a cluster when its database goes away: a clear error with its own
exit code (6) instead of "internal error … a bug", a node that cannot reach it
at start exits 75 (EX_TEMPFAIL: its supervisor starts it again), and a run
learns which node runs it (SESSIOND_NODE). Real nodes, real PostgreSQL."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import psycopg
import psycopg_pool
import pytest

from sessiond.cluster.lease import LEASE_LOST_EXIT
from sessiond.errors import DatabaseUnavailable
from sessiond.localpg import LocalPostgres
from sessiond.log.store.pg.reach import is_gone, where
from tests.cluster.conftest import TTL, lease
from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for
from tests.patience import SLOW

JOB = """name = "job"
[run]
exec = ["sh", "-c", "echo \\"$SESSIOND_NODE\\" > node.txt"]
cwd = "."
writes = ["node.txt"]
retries = 0
"""


@pytest.fixture
def patient(pg_dsn: str) -> Iterator[Daemon]:
    """A node whose lease outlives a short outage (30 s, scaled by the load factor:
    on a loaded host stopping and starting PostgreSQL alone can take that long)."""
    ttl = f'lease_ttl = "{30 * SLOW}s"\n'
    daemon = Daemon(short_dir(), f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n1"\n{ttl}')
    try:
        yield daemon.start()
    finally:
        daemon.reap()
        shutil.rmtree(daemon.root, ignore_errors=True)


def test_a_run_on_a_cluster_node_gets_the_nodes_name_in_sessiond_node(patient: Daemon) -> None:
    spec = patient.write_spec("job", JOB)
    patient.ctl("create", str(spec), check=True)
    patient.ctl("activate", "job", check=True)
    wait_event(patient, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
    assert (patient.root / "node.txt").read_text() == "n1\n"


def test_with_the_database_stopped_a_command_says_so_with_exit_6_not_an_internal_error(
    patient: Daemon, postgres: LocalPostgres
) -> None:
    spec = patient.write_spec("job", JOB)
    patient.ctl("create", str(spec), check=True)
    assert DatabaseUnavailable.exit_code == 6
    postgres.stop()  # -m fast: every connection of the node ends (AdminShutdown)
    try:
        done = patient.ctl("ps")
        assert done.returncode == 6, done.stderr
        assert "internal error" not in done.stderr
        assert "bug" not in done.stderr
        said = done.stderr
        assert "the cluster's database is not reachable from node 'n1'" in said
        assert f"at {postgres.sock}" in said  # which database: its socket, never a password
        assert "Start PostgreSQL again" in said
        json = patient.ctl("--json", "ps")
        assert json.returncode == 6
        assert '"code":"database_unavailable"' in json.stdout.replace(" ", "")
    finally:
        postgres.start()
    # Back: the same node answers again (its lease outlived the outage).
    wait_for(lambda: patient.ctl("ps").returncode == 0, timeout=60, what="ps to work again")
    assert "job" in patient.ctl("ps", check=True).stdout


def test_a_node_that_cannot_reach_its_database_at_start_exits_75_naming_it() -> None:
    """No server on the socket the dsn names: a temporary failure (75, start it
    again), said with the database, not a refusal (1) that a supervisor gives up on."""
    root = short_dir()
    nowhere = root / "nopg"
    nowhere.mkdir()
    dsn = f"postgresql://sessiond@/sessiond?host={nowhere}"
    daemon = Daemon(root, f'[cluster]\ndsn = "{dsn}"\nnode = "n1"\n')
    try:
        daemon.start(wait=False)
        assert daemon.proc is not None
        try:
            code = daemon.proc.wait(60)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError("a node with no database did not end") from exc
        assert code == LEASE_LOST_EXIT, daemon.lines
        daemon.stop()  # its log read to the end
        text = " ".join(str(line.get("text", "")) for line in daemon.lines)
        assert "the cluster's database is not reachable from node 'n1'" in text, daemon.lines
        assert f"database 'sessiond' at {nowhere}" in text
        # While it is down, sessionctl says why it ended, not only "not reachable".
        done = daemon.ctl("ps")
        assert done.returncode == 3
        assert "the daemon is not reachable" in done.stderr
        assert "Its last word: at " in done.stderr
        assert "the node could not start: the cluster's database is not reachable" in done.stderr
    finally:
        daemon.reap()
        shutil.rmtree(root, ignore_errors=True)


def test_a_node_that_ended_for_its_database_says_so_while_it_is_down(
    pg_dsn: str, postgres: LocalPostgres
) -> None:
    """The database stops under a node with a short lease: it ends (75), and until
    it is back `sessionctl` names the database, not only "not reachable"; once the
    node answers again, the note is gone."""
    daemon = Daemon(short_dir(), f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n1"\n{lease(True)}')
    try:
        daemon.start()
        assert daemon.proc is not None
        postgres.stop()
        try:
            assert daemon.proc.wait(TTL + 30 * SLOW) == LEASE_LOST_EXIT
            done = daemon.ctl("ps")
            assert done.returncode == 3
            assert "Its last word: at " in done.stderr
            assert "node 'n1' ended (exit 75)" in done.stderr
            assert "Is the cluster's database (database 't" in done.stderr
            assert f" at {postgres.sock}) up?" in done.stderr
        finally:
            postgres.start()
        daemon.start()  # as its supervisor would
        done = daemon.ctl("ps")
        assert done.returncode == 0, done.stderr
        assert not (daemon.root / "s.sock.ended").exists()
    finally:
        daemon.reap()
        shutil.rmtree(daemon.root, ignore_errors=True)


@pytest.mark.parametrize(
    ("exc", "gone"),
    [
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
        (psycopg.OperationalError("connection failed: No such file or directory"), True),
        (psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"), True),
        (psycopg.errors.QueryCanceled("canceling statement"), False),  # it answered
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (ValueError("not a database error"), False),
    ],
)
def test_which_errors_mean_the_database_is_away(exc: Exception, gone: bool) -> None:
    assert is_gone(exc) is gone


def test_the_database_is_named_without_its_password() -> None:
    said = where("postgresql://ann:s3cret@db.example:5433/app")
    assert said == "database 'app' at db.example:5433"
    assert where("host=/run/pg dbname=x password=p") == "database 'x' at /run/pg"
