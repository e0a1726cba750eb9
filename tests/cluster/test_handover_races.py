"""A hand-over (``migrate --node``, ``drain``) racing a wake on the same session:
the session goes at a stable point or not at all, never with its program running
(docs/design.md section 10: "hands a session over at a stable point").

Three real nodes, one real PostgreSQL. The race is made certain, not likely: a
row lock the test holds on the session keeps a durable append of the owner
(a ``send``) waiting in the database while it holds the session's lock; an
``activate`` and then a ``migrate --node`` queue behind it, in that order,
each seen arriving (the carried request taken, the hand-over's target query in
the server's statement log) before the lock is let go.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sessiond.localpg import LocalPostgres
from tests.cluster.conftest import SHARED, TTL, lease
from tests.e2e.harness import SESSIONCTL, Daemon, short_dir, wait_event, wait_for

# No message trigger: a send's message is committed on its own, under the
# session's lock (what the test holds up). The program says where it ran.
SLOW = """name = "slow"
[run]
exec = ["sh", "-c", "echo start >> {ledger}; sleep 2; echo end >> {ledger}"]
cwd = "."
side_effect = "read"
idempotency = "safe"
"""

# a longer lease where a send held in the database waits past the mailbox's
# polls: an append that waits past its TTL is refused (the xfail below)
LONG_TTL = 20.0
TARGET_QUERY = "SELECT n.name FROM nodes AS n, sessions AS s WHERE n.lease_until > now()"


@pytest.fixture
def logged(postgres: LocalPostgres, pg_dsn: str) -> Iterator[tuple[list[Daemon], Path]]:
    yield from _logged(postgres, pg_dsn, TTL)


@pytest.fixture
def logged_long(postgres: LocalPostgres, pg_dsn: str) -> Iterator[tuple[list[Daemon], Path]]:
    yield from _logged(postgres, pg_dsn, LONG_TTL)


def _logged(
    postgres: LocalPostgres, pg_dsn: str, ttl: float
) -> Iterator[tuple[list[Daemon], Path]]:
    """Three nodes on a database whose every statement goes to the server's log."""
    name = pg_dsn.rsplit("/", 1)[-1].split("?", 1)[0]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET log_statement = 'all'".encode())
    nodes: list[Daemon] = []
    try:
        for i in (1, 2, 3):
            # n1's own lease is the one the tests watch pass; the others keep theirs
            ttl_line = f'lease_ttl = "{ttl}s"\n' if i == 1 else lease(False)
            config = f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n{i}"\n{ttl_line}{SHARED}'
            nodes.append(Daemon(short_dir(), config).start())
        yield nodes, postgres.folder / "server.log"
    finally:
        for d in nodes:
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)


def _blocked_on_lock(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%WITH fence AS%'"
    ).fetchone()
    return bool(row and row[0])


def _ctl(d: Daemon, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [SESSIONCTL, *args], env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_migrate_racing_a_wake_never_hands_over_a_running_session(
    logged: tuple[list[Daemon], Path], pg_dsn: str
) -> None:
    (n1, n2, n3), server_log = logged
    ledger = n1.root / "ledger"
    n1.ctl("create", str(n1.write_spec("slow", SLOW.format(ledger=ledger))), check=True)

    with psycopg.connect(pg_dsn, autocommit=True) as watch, psycopg.connect(pg_dsn) as holder:
        holder.execute("SELECT 1 FROM sessions WHERE name = 'slow' FOR UPDATE")
        sender = _ctl(n1, "send", "slow", "held")  # holds the session's lock, waiting
        wait_for(lambda: _blocked_on_lock(watch), what="the send's commit to wait")
        # an activate carried from n3: queued on the lock once n1 took the request
        activate = _ctl(n3, "activate", "slow")
        wait_for(
            lambda: watch.execute(
                "SELECT 1 FROM requests WHERE method = 'activate' AND taken_by = 'n1'"
            ).fetchone(),
            what="n1 to take the activate",
        )
        seen = server_log.stat().st_size
        migrate = _ctl(n1, "migrate", "slow", "--node", "n2")
        wait_for(
            lambda: TARGET_QUERY in server_log.read_bytes()[seen:].decode(errors="replace"),
            what="the migrate to choose its target (then it waits for the session's lock)",
        )
        holder.rollback()  # let go: the send commits, the activate starts a run

        for proc in (sender, activate):
            _, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr
        _, err = migrate.communicate(timeout=60)
        migrated = migrate.returncode

    # Whatever the migrate answered, the one activation ran the program once, on
    # one node, to its end; and the run it started is recorded as ended.
    def ended() -> bool:
        return ledger.exists() and ledger.read_text().count("end") >= 1

    wait_for(ended, timeout=30, what="the program to end")
    owner = n2 if migrated == 0 else n1
    wait_event(owner, "slow", "run.finished", timeout=30)
    lines = ledger.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["start", "end"], (lines, migrated, err)
    if migrated != 0:
        assert "stable point" in err, err


def test_a_request_queued_behind_a_hand_over_is_told_to_ask_again(
    logged: tuple[list[Daemon], Path], pg_dsn: str
) -> None:
    (n1, n2, n3), server_log = logged
    ledger = n1.root / "ledger"
    n1.ctl("create", str(n1.write_spec("slow", SLOW.format(ledger=ledger))), check=True)

    with psycopg.connect(pg_dsn, autocommit=True) as watch, psycopg.connect(pg_dsn) as holder:
        holder.execute("SELECT 1 FROM sessions WHERE name = 'slow' FOR UPDATE")
        sender = _ctl(n1, "send", "slow", "held")  # holds the session's lock, waiting
        wait_for(lambda: _blocked_on_lock(watch), what="the send's commit to wait")
        # this time the migrate queues first, then an activate carried from n3
        seen = server_log.stat().st_size
        migrate = _ctl(n1, "migrate", "slow", "--node", "n2")
        wait_for(
            lambda: TARGET_QUERY in server_log.read_bytes()[seen:].decode(errors="replace"),
            what="the migrate to choose its target (then it waits for the session's lock)",
        )
        activate = _ctl(n3, "activate", "slow")
        wait_for(
            lambda: watch.execute(
                "SELECT 1 FROM requests WHERE method = 'activate' AND taken_by = 'n1'"
            ).fetchone(),
            what="n1 to take the activate",
        )
        holder.rollback()
        for proc in (sender, migrate):
            _, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr
        _, err = activate.communicate(timeout=60)

    # Not an internal error about a closed log: where the session went, and to ask again.
    assert activate.returncode == 1, err
    assert "handed over to node 'n2'" in err
    assert "Ask again" in err
    assert not ledger.exists()  # nothing ran for it
    n3.ctl("activate", "slow", check=True)  # asked again: it runs on n2, once
    wait_event(n2, "slow", "run.finished", timeout=30)
    assert [line.split()[0] for line in ledger.read_text().splitlines()] == ["start", "end"]
    assert n1.ctl("ping").returncode == 0


FLUSH_QUERY = "UPDATE messages SET created_at = created_at"
# n2 looks for requests carried to it once a second (cluster.py's take-over tick)
TICK = "DETAIL:  parameters: $1 = 'n2', $2 = '1', $3 = '{}'"


def _ticks_after_flush(log: str) -> int:
    """How many of n2's take-over ticks the server logged after the message's flush."""
    at = log.rfind(FLUSH_QUERY)
    return 0 if at < 0 else log[at:].count(TICK)


def _message_row(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[object, ...] | None:
    return conn.execute(
        "SELECT taken_at IS NOT NULL FROM messages WHERE session = 'slow'"
    ).fetchone()


def test_a_carried_message_queued_behind_a_hand_over_is_not_lost(
    logged_long: tuple[list[Daemon], Path], pg_dsn: str
) -> None:
    """A message from another node that the owner's mailbox took up while a
    hand-over held the session is delivered by the new owner, not dropped as if
    the session had refused it (the send was acknowledged: it must arrive)."""
    (n1, n2, n3), server_log = logged_long
    ledger = n1.root / "ledger"
    n1.ctl("create", str(n1.write_spec("slow", SLOW.format(ledger=ledger))), check=True)
    text = "carried " + "x" * 8000  # past a notification's payload: n1 reads the table

    with psycopg.connect(pg_dsn, autocommit=True) as watch, psycopg.connect(pg_dsn) as holder:
        # NO KEY: the send from n3 inserts its row, whose key check must pass
        holder.execute("SELECT 1 FROM sessions WHERE name = 'slow' FOR NO KEY UPDATE")
        sender = _ctl(n1, "send", "slow", "held")  # holds the session's lock, waiting
        wait_for(lambda: _blocked_on_lock(watch), what="the send's commit to wait")
        seen = server_log.stat().st_size
        migrate = _ctl(n1, "migrate", "slow", "--node", "n2")
        wait_for(
            lambda: TARGET_QUERY in server_log.read_bytes()[seen:].decode(errors="replace"),
            what="the migrate to choose its target (then it waits for the session's lock)",
        )
        n3.ctl("send", "slow", text, check=True)  # acknowledged: in the table, on disk
        # n1's mailbox polls the table every second (and on the send's notification):
        # three ticks of n2's (a second apart) after the send's flush, and it has
        # read the message and queued its delivery on the session's lock, behind
        # the migrate (its delivery loop is serial)
        wait_for(
            lambda: _ticks_after_flush(server_log.read_bytes().decode(errors="replace")) >= 3,
            what="n1's mailbox to have read the table since the message was there",
        )
        holder.rollback()
        for proc in (sender, migrate):
            _, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr
        wait_for(lambda: _message_row(watch) == (True,), timeout=60, what="the message taken")

    got = [e["data"]["text"] for e in n2.json("log", "slow", "--type", "message.received")]
    assert text in got, "an acknowledged message was marked taken and never delivered"


def _lease_until(conn: psycopg.Connection[tuple[object, ...]]) -> object:
    row = conn.execute("SELECT lease_until FROM nodes WHERE name = 'n1'").fetchone()
    assert row is not None
    return row[0]


def test_an_append_of_a_healthy_node_that_waited_past_its_ttl_is_not_refused(
    logged: tuple[list[Daemon], Path], pg_dsn: str
) -> None:
    (n1, _, _), _ = logged
    ledger = n1.root / "ledger"
    n1.ctl("create", str(n1.write_spec("slow", SLOW.format(ledger=ledger))), check=True)
    with psycopg.connect(pg_dsn, autocommit=True) as watch, psycopg.connect(pg_dsn) as holder:
        holder.execute("SELECT 1 FROM sessions WHERE name = 'slow' FOR NO KEY UPDATE")
        sender = _ctl(n1, "send", "slow", "held")
        wait_for(lambda: _blocked_on_lock(watch), what="the send's commit to wait")
        first = _lease_until(watch)
        # the lease the waiting statement read has passed, and n1 renewed it meanwhile
        wait_for(
            lambda: (
                watch.execute(
                    "SELECT clock_timestamp() > %s AND lease_until > clock_timestamp() "
                    "FROM nodes WHERE name = 'n1'",
                    (first,),
                ).fetchone()
                == (True,)
            ),
            what="n1's first lease to pass while it renews",
        )
        holder.rollback()
        _, err = sender.communicate(timeout=60)
    assert sender.returncode == 0, err
    # and the session goes on here (refused, its log took no appends at all after,
    # on a node that is up and still owns it)
    n1.ctl("send", "slow", "again", check=True)
