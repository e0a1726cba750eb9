"""The test PostgreSQL's watcher: a test run that dies leaves no server behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sessiond.localpg import LocalPostgres, NoPostgres, bindir

ROOT = Path(__file__).resolve().parent.parent


def _server() -> LocalPostgres:
    try:
        binaries = bindir()
    except NoPostgres as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {exc}")
        pytest.skip(str(exc))
    server = LocalPostgres(Path(tempfile.mkdtemp(prefix="sessiond-pgw-")), binaries)
    server.init()
    server.start()
    return server


def _watch(server: LocalPostgres) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.pgwatch", str(server.folder), str(server.bin)],
        stdin=subprocess.PIPE,
        cwd=ROOT,
    )


def test_a_test_run_that_dies_has_its_server_stopped_and_removed() -> None:
    server = _server()
    try:
        watcher = _watch(server)
        assert watcher.stdin is not None
        watcher.stdin.close()  # what the death of the test process looks like
        assert watcher.wait(timeout=120) == 0
        assert not server.folder.exists()
    finally:
        server.stop()
        shutil.rmtree(server.folder, ignore_errors=True)


def test_a_clean_finish_leaves_the_server_to_its_fixture() -> None:
    server = _server()
    try:
        watcher = _watch(server)
        assert watcher.stdin is not None
        watcher.stdin.write(b"done\n")
        watcher.stdin.close()
        assert watcher.wait(timeout=120) == 0
        assert (server.data / "postmaster.pid").exists()
    finally:
        server.stop()
        shutil.rmtree(server.folder, ignore_errors=True)
