"""Messages across nodes, attacked (docs/design.md section 10, "Wakes"): a ``send``
acknowledged to its sender is delivered, once, and one its session cannot take
is refused, as on its own node. Real nodes, real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.cluster.conftest import HELLO, nodes_of
from tests.e2e.harness import Daemon, wait_for


@pytest.fixture
def nodes(pg_dsn: str) -> Iterator[list[Daemon]]:
    with nodes_of(pg_dsn, 3, start=False) as made:
        yield made


def test_a_send_to_a_terminated_session_on_another_node_is_refused_not_dropped(
    nodes: list[Daemon],
) -> None:
    n1, n2, _ = nodes
    n1.start()
    n2.start()
    n2.ctl("create", str(n2.write_spec("hello", HELLO)), check=True)
    n2.ctl("cancel", "hello", check=True)
    here = n2.ctl("send", "hello", "lost?")
    assert here.returncode == 1  # on its own node: refused, saying why
    assert "terminated" in here.stderr
    there = n1.ctl("send", "hello", "lost?")
    assert (there.returncode, "terminated" in there.stderr) == (1, True), there


def _waiting_update(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%UPDATE messages SET taken_at%'"
    ).fetchone()
    return int(row[0]) if row else 0


def _received(d: Daemon) -> int:
    return len(d.json("log", "pinned", "--type", "message.received"))


def test_a_message_delivered_by_a_node_killed_before_it_marked_it_is_not_delivered_twice(
    nodes: list[Daemon], pg_dsn: str
) -> None:
    n1, _, n3 = nodes
    n1.start()
    # pinned to n3, which is down: n1 lets it go, and a send waits in the table
    spec = HELLO.replace('name = "hello"', 'name = "pinned"\nnode = "n3"')
    n1.ctl("create", str(n1.write_spec("pinned", spec)), check=True)
    sent = n1.ctl("send", "pinned", "once")
    assert sent.returncode == 0, sent.stderr
    with psycopg.connect(pg_dsn, autocommit=True) as watch, psycopg.connect(pg_dsn) as holder:
        # readers pass; whatever marks the row taken waits: before the fix a
        # statement of its own after the delivery's commit, now the delivery's
        # commit itself
        holder.execute("LOCK TABLE messages IN SHARE MODE")
        n3.start()
        wait_for(lambda: _waiting_update(watch) == 1, timeout=60, what="n3 to deliver")
        n3.kill9()  # between its delivery and the row's mark (or inside their one commit)
        # a new incarnation claims the session and reads the table again (not
        # waited for: its claim may wait on the killed delivery's transaction)
        n3.start(wait=False)
        # Before the fix it delivers again at once and its mark waits too; now its
        # claim waits for the killed delivery's transaction, which never commits.
        wait_for(
            lambda: _lock_waits(watch) >= 2 or _in_log(watch) > 1,
            timeout=60,
            what="n3 to look at the session again",
        )
        holder.rollback()
    n3.wait_ready()
    wait_for(lambda: _taken(pg_dsn), timeout=60, what="the message to be taken")
    wait_for(lambda: _received(n3) >= 1, timeout=60, what="the message in the log")
    assert _received(n3) == 1  # once: the row is taken exactly when it is in the log


def _lock_waits(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0]) if row else 0


def _in_log(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    """How many ``message.received`` the database has for it (the daemon may not
    answer yet)."""
    row = conn.execute(
        "SELECT count(*) FROM events WHERE session = 'pinned' "
        "AND position('\"message.received\"'::bytea IN line) > 0"
    ).fetchone()
    return int(row[0]) if row else 0


def _taken(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE taken_at IS NULL), count(*) FROM messages "
            "WHERE session = 'pinned'"
        ).fetchone()
    return row is not None and (row[0], row[1]) == (0, 1)


def test_a_send_to_an_imported_terminated_session_on_another_node_is_refused(
    nodes: list[Daemon],
) -> None:
    """A bundle of a terminated session imports terminated: its row must say so
    (``ended``) as a termination committed here does, or a send from another node
    is acknowledged and then dropped by its owner."""
    n1, n2, _ = nodes
    n1.start()
    n2.start()
    n2.ctl("create", str(n2.write_spec("hello", HELLO)), check=True)
    n2.ctl("cancel", "hello", check=True)
    bundle = n2.root / "hello.bundle"
    n2.ctl("export", "hello", "-o", str(bundle), check=True)
    n2.ctl("import", str(bundle), "--as", "again", check=True)
    assert n2.json("show", "again")["state"] == "terminated"
    here = n2.ctl("send", "again", "lost?")
    assert (here.returncode, "terminated" in here.stderr) == (1, True), here
    there = n1.ctl("send", "again", "lost?")
    assert (there.returncode, "terminated" in there.stderr) == (1, True), there


def test_a_send_to_a_live_fork_of_a_terminated_session_on_another_node_is_delivered(
    nodes: list[Daemon],
) -> None:
    """A fork copies its parent's end, then starts: its row is not ``ended``."""
    n1, n2, _ = nodes
    n1.start()
    n2.start()
    n2.ctl("create", str(n2.write_spec("hello", HELLO)), check=True)
    n2.ctl("cancel", "hello", check=True)
    n2.ctl("fork", "hello", "--as", "kid", check=True)
    assert n2.json("show", "kid")["state"] != "terminated"
    there = n1.ctl("send", "kid", "still here")
    assert there.returncode == 0, there
    wait_for(
        lambda: len(n2.json("log", "kid", "--type", "message.received")) == 1,
        timeout=60,
        what="the message in the fork's log",
    )
