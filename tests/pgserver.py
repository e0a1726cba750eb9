"""A real PostgreSQL for the tests: one server per test process (initdb into a tmp
folder, a Unix socket in it, no TCP port), a fresh database per test.

Under pytest-xdist (`make test`) each worker is a test process of its own and so
starts its own server, in a folder named after the worker (PYTEST_XDIST_WORKER):
no two workers share a server, and a database name carries the process id.

Skipped, with the reason, only where the machine has no PostgreSQL binaries;
under CI=true their absence fails instead (.ci/run installs them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import psycopg
import pytest

from sessiond.localpg import LocalPostgres, NoPostgres, bindir
from sessiond.log.store.pg import schema

_databases = count(1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    try:
        binaries = bindir()
    except NoPostgres as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {exc}")
        pytest.skip(str(exc))
    # Not under pytest's tmp_path: as root the server runs as the postgres user,
    # which must reach its folder (pytest's are 0700 root's).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = Path(tempfile.mkdtemp(prefix=f"sessiond-pg-{worker}-"))
    server = LocalPostgres(folder, binaries)
    # A session of its own: a kill of the test run's process group leaves it
    # alive to notice and stop the server (tests/pgwatch.py says why).
    watcher = subprocess.Popen(
        [sys.executable, "-m", "tests.pgwatch", str(folder), str(binaries)],
        stdin=subprocess.PIPE,
        start_new_session=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert watcher.stdin is not None
    try:
        server.init()
        server.start()
        yield server
    finally:
        # ``immediate``, as tests/pgwatch.py: the folder is removed next, so nothing
        # in it is worth the shutdown checkpoint, which flushed every test's database
        # first (bench/README.md: 36 s charged to the last test of a run).
        if (server.data / "postmaster.pid").exists():
            pg_ctl = str(server.bin / "pg_ctl")
            server._run(pg_ctl, "stop", "-D", str(server.data), "-m", "immediate")
        shutil.rmtree(folder, ignore_errors=True)
        watcher.stdin.write(b"done\n")
        watcher.stdin.close()
        watcher.wait()


@pytest.fixture
def pg_dsn(postgres: LocalPostgres) -> str:
    """A new, migrated database of its own for one test."""
    name = f"t{os.getpid()}_{next(_databases)}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    dsn = postgres.dsn_for(name)
    schema.migrate(dsn)
    return dsn
