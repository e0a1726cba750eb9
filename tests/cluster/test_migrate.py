"""``sessiond db migrate``: the real command, against a real PostgreSQL."""

from __future__ import annotations

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
