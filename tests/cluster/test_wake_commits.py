"""A wake on a cluster node waits for one commit before its program runs.

Each PostgreSQL commit costs milliseconds on a loaded disk: the path from a
``send`` (or ``activate``) to the program's first instruction commits once, the
run's intent together with everything the wake recorded before it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.e2e.harness import Daemon, short_dir
from tests.e2e.wakecommits import activate_and_count, send_and_count


@pytest.fixture
def node(pg_dsn: str) -> Iterator[Daemon]:
    root = short_dir()
    config = f'log_level = "debug"\n[cluster]\ndsn = "{pg_dsn}"\nnode = "n1"\nlease_ttl = "3s"\n'
    daemon = Daemon(root, config)
    try:
        yield daemon.start()
    finally:
        daemon.reap()
        shutil.rmtree(root, ignore_errors=True)


def test_a_message_wake_commits_once_before_the_program_runs(node: Daemon) -> None:
    commits = send_and_count(node, "m")
    print(commits)
    assert len(commits) == 1, commits


def test_an_activate_commits_once_before_the_program_runs(node: Daemon) -> None:
    commits = activate_and_count(node, "a")
    print(commits)
    assert len(commits) == 1, commits
