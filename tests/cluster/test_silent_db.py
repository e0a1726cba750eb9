"""A node whose database stops answering without closing anything (a partition,
a hung server): it must end by its deadline as a lost lease does, its programs
stopped by then, and its sessions move (docs/design.md section 10, "Ownership and fencing").
The other test of a cut-off node closes its connections; here they stay open
and silent, behind a proxy the test freezes. Real nodes, real PostgreSQL."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sessiond.cluster.lease import LEASE_LOST_EXIT
from sessiond.localpg import LocalPostgres
from tests.cluster.conftest import SHARED, TTL, lease, taken_over
from tests.cluster.proxy import FrozenProxy
from tests.cluster.test_failover import LEDGER, LEDGER_PROGRAM
from tests.e2e.harness import SESSIONCTL, Daemon, short_dir, wait_event, wait_for
from tests.patience import SLOW


@pytest.fixture
def proxied(postgres: LocalPostgres, pg_dsn: str) -> Iterator[tuple[Daemon, Daemon, FrozenProxy]]:
    proxy = FrozenProxy(postgres.sock)
    n1 = Daemon(
        short_dir(),
        f'[cluster]\ndsn = "{proxy.dsn(pg_dsn, postgres.sock)}"\nnode = "n1"\n'
        f"{lease(True)}{SHARED}",
    )
    n2 = Daemon(short_dir(), f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n2"\n{lease(False)}{SHARED}')
    try:
        n1.start()
        n2.start()
        yield n1, n2, proxy
    finally:
        proxy.thaw()
        for d in (n1, n2):
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)
        proxy.close()
        shutil.rmtree(proxy.dir, ignore_errors=True)


def test_a_node_whose_database_goes_silent_ends_by_its_deadline_and_its_session_moves(
    proxied: tuple[Daemon, Daemon, FrozenProxy],
) -> None:
    n1, n2, proxy = proxied
    spec = n1.write_spec("ledger", LEDGER)
    (n1.root / "ledger.py").write_text(LEDGER_PROGRAM)
    n1.ctl("create", str(spec), check=True)
    n1.ctl("activate", "ledger", check=True)
    run = wait_event(n1, "ledger", "run.started")["data"]["run"]
    ledger = n1.root / "ledger"
    wait_for(lambda: ledger.exists() and ledger.read_text().count("\n") >= 2, what="the ledger")

    frozen = time.monotonic()
    proxy.freeze()
    assert n1.proc is not None
    # It ends on its own, as a lost lease does, within its lease (and some slack
    # for a loaded machine): not hung on a query the database never answers.
    try:
        code = n1.proc.wait(TTL + 15 * SLOW)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"node n1 still runs {time.monotonic() - frozen:.1f}s after its database went "
            f"silent (lease_ttl {TTL}s): it should have ended as a lost lease"
        ) from exc
    assert n1.stop() == code == LEASE_LOST_EXIT  # (stop: its log pipe closed)
    wait_for(lambda: taken_over([n2], "ledger"), timeout=TTL + 30, what="n2 to take it")

    mine = [
        float(line.split()[1]) for line in ledger.read_text().splitlines() if line.split()[0] == run
    ]
    assert max(mine) <= frozen + TTL  # stopped by the deadline, on the machine's clock
    records: list[dict[str, Any]] = n2.json("log", "ledger")
    first_new = min(r["seq"] for r in records if r["node"] == "n2")
    assert all(r["seq"] < first_new for r in records if r["node"] == "n1")


@pytest.mark.parametrize("reader", [["log", "ledger"], ["replay", "ledger"]])
def test_a_node_reading_a_log_when_its_database_goes_silent_still_ends_by_its_deadline(
    proxied: tuple[Daemon, Daemon, FrozenProxy], reader: list[str]
) -> None:
    n1, n2, proxy = proxied
    spec = n1.write_spec("ledger", LEDGER)
    (n1.root / "ledger.py").write_text(LEDGER_PROGRAM)
    n1.ctl("create", str(spec), check=True)
    n1.ctl("activate", "ledger", check=True)
    wait_event(n1, "ledger", "run.started")

    frozen = time.monotonic()
    proxy.freeze()
    # An operator reads the session's log meanwhile: a query the database never
    # answers. The node must still end by its deadline, whatever its loop waits on.
    asker = subprocess.Popen(
        [SESSIONCTL, *reader], env=n1.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    assert n1.proc is not None
    try:
        code = n1.proc.wait(TTL + 15 * SLOW)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"node n1 still runs {time.monotonic() - frozen:.1f}s after its database went "
            f"silent (lease_ttl {TTL}s), hung in `sessionctl {' '.join(reader)}`"
        ) from exc
    finally:
        asker.kill()
        asker.wait()
    assert n1.stop() == code == LEASE_LOST_EXIT  # (stop: its log pipe closed)
    wait_for(lambda: taken_over([n2], "ledger"), timeout=TTL + 30, what="n2 to take it")


def _renewed(dsn: str, node: str) -> float:
    """The database's clock at the node's last renewal (epoch seconds)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM renewed_at)::float8 FROM nodes WHERE name = %s", (node,)
        ).fetchone()
    assert row is not None
    return float(row[0])


@pytest.mark.parametrize("reader", [["log", "plain"], ["replay", "plain"]])
def test_a_log_read_waiting_on_a_locked_table_leaves_the_node_serving_and_renewing(
    proxied: tuple[Daemon, Daemon, FrozenProxy], pg_dsn: str, reader: list[str]
) -> None:
    n1, _n2, _proxy = proxied
    spec = n1.write_spec("plain", 'name = "plain"\n[run]\nexec = ["true"]\ncwd = "."\n')
    n1.ctl("create", str(spec), check=True)
    with psycopg.connect(pg_dsn) as holder:
        # what a schema upgrade's ALTER TABLE, or a VACUUM FULL, holds for a while
        holder.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        now = holder.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert now is not None
        asker = subprocess.Popen(
            [SESSIONCTL, *reader], env=n1.env, stdout=subprocess.PIPE, text=True
        )
        try:
            # The read waits for the lock; the node meanwhile answers, and keeps its
            # lease for longer than lease_ttl (it was ended by it before).
            def renewing() -> bool:
                assert n1.proc is not None
                if n1.proc.poll() is not None:
                    raise AssertionError(f"n1 ended ({n1.proc.returncode}) while the read waited")
                return _renewed(pg_dsn, "n1") > float(now[0]) + 2 * TTL

            wait_for(
                renewing,
                timeout=4 * TTL + 15,
                what="n1 to keep renewing its lease while the read waits",
            )
            assert n1.ctl("ping", timeout=10).returncode == 0
            assert asker.poll() is None  # still waiting for the table
        finally:
            holder.rollback()
        out, _ = asker.communicate(timeout=30)
    assert asker.returncode == 0
    assert out.strip()
    assert n1.proc is not None
    assert n1.proc.poll() is None
