"""``sessiond db migrate``: the real command, against a real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg

from sessiond.localpg import LocalPostgres
from sessiond.log.store.pg import schema


def sessiond(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sessiond.daemon.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_migrate_makes_the_schema_once_even_when_run_twice_at_once(
    postgres: LocalPostgres,
) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE fresh_migrate")
    dsn = postgres.dsn_for("fresh_migrate")
    runs = [sessiond("db", "migrate", "--dsn", dsn, "--json") for _ in range(3)]
    outs = [run.communicate(timeout=60) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], outs
    froms = sorted(out.split('"from":')[1].split(",")[0] for out, _ in outs)
    assert froms == ["0", str(schema.VERSION), str(schema.VERSION)]  # one did the work
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version FROM sessiond_schema ORDER BY version").fetchall()
    assert [r[0] for r in rows] == list(range(1, schema.VERSION + 1))
    again = sessiond("db", "migrate", "--dsn", dsn)
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 0
    assert "nothing to do" in out


def test_migrate_names_what_is_wrong_with_a_dsn(postgres: LocalPostgres) -> None:
    unreachable = postgres.dsn_for("sessiond").replace("sock", "nowhere")
    run = sessiond("db", "migrate", "--dsn", unreachable)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 3
    assert "cannot reach the database" in err
    run = sessiond("db", "migrate", "--dsn", "postgresql://x@/db?bogus_option=1")
    _, err = run.communicate(timeout=60)
    assert run.returncode == 5
    assert "check --dsn" in err


def _at_step(dsn: str, version: int) -> None:
    """Make the schema as a sessiond of schema ``version`` did, with a session of
    three events, so an upgrade runs over real rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE sessiond_schema (version integer NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for step in range(1, version + 1):
            conn.execute(schema.STEPS[step - 1].encode())
            conn.execute("INSERT INTO sessiond_schema (version) VALUES (%s)", (step,))
        _session_with_events(conn, "old")
        _session_with_events(conn, "done")  # one that terminated before the upgrade
        conn.execute(
            "UPDATE events SET line = %s WHERE session = 'done' AND seq = 3",
            (b'{"v":1,"type":"lifecycle.changed","data":{"from":"sleeping","to":"terminated"}}',),
        )
        # a fork of a terminated session: its parent's end is in its history, then
        # its own start (terminated -> created, lineage.fork): it is live
        _session_with_events(conn, "forked")
        for seq, to in ((2, "terminated"), (3, "created")):
            line = '{"v":1,"type":"lifecycle.changed","data":{"from":"x","to":"' + to + '"}}'
            conn.execute(
                "UPDATE events SET line = %s WHERE session = 'forked' AND seq = %s",
                (line.encode(), seq),
            )


def _session_with_events(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    conn.execute(
        "INSERT INTO nodes (name, incarnation, lease_until) VALUES ('n1', 1, now()) "
        "ON CONFLICT DO NOTHING"
    )
    conn.execute(
        "INSERT INTO sessions (name, owner, epoch, last_seq) VALUES (%s, 'n1', 1, 3)", (name,)
    )
    for seq in (1, 2, 3):
        conn.execute(
            "INSERT INTO events (session, seq, id, line) VALUES (%s, %s, %s, 'x')",
            (name, seq, f"id{seq}"),
        )


def _events_of(conn: psycopg.Connection[tuple[object, ...]], name: str) -> int:
    row = conn.execute("SELECT count(*) FROM events WHERE session = %s", (name,)).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_a_database_at_the_previous_step_upgrades_and_its_sessions_keep_their_events(
    postgres: LocalPostgres,
) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE step4_migrate")
    dsn = postgres.dsn_for("step4_migrate")
    _at_step(dsn, 4)
    run = sessiond("db", "migrate", "--dsn", dsn, "--json")
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert json.loads(out) == {"from": 4, "to": schema.VERSION}
    with psycopg.connect(dsn, autocommit=True) as conn:
        # step 5: no foreign key from events to sessions (the fence is the check) ...
        keys = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'events'::regclass "
            "AND contype = 'f'"
        ).fetchall()
        assert keys == []
        # ... room on the sessions' pages, so the fence's update stays HOT
        options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'sessions'")
        assert options.fetchone() == (["fillfactor=50"],)
        assert _events_of(conn, "old") == 3
        # step 6: a session that terminated before says so in its row; one whose
        # log goes on past a termination (a fork of a terminated session) does not
        ended = conn.execute("SELECT name FROM sessions WHERE ended ORDER BY name").fetchall()
        assert ended == [("done",)]
        _session_with_events(conn, "new")
        conn.execute("DELETE FROM sessions WHERE name = 'old'")
        assert (_events_of(conn, "old"), _events_of(conn, "new")) == (0, 3)


def test_deleting_a_session_row_deletes_its_events_without_a_foreign_key(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _session_with_events(conn, "a")
        _session_with_events(conn, "b")
        conn.execute("DELETE FROM sessions WHERE name = 'a'")
        assert (_events_of(conn, "a"), _events_of(conn, "b")) == (0, 3)
