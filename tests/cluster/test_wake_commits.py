"""A wake on a cluster node waits for one commit before its program runs.

Each PostgreSQL commit costs milliseconds on a loaded disk: the path from a
``send`` (or ``activate``) to the program's first instruction commits once, the
run's intent together with everything the wake recorded before it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from sessiond.log.store.pg.pgstore import PgStore
from tests.e2e.harness import Daemon, short_dir, wait_event
from tests.e2e.wakecommits import activate_and_count, send_and_count

BUSY = """name = "busy"
[run]
exec = ["sleep", "60"]
cwd = "."
side_effect = "read"
idempotency = "safe"

[[trigger]]
type = "message"
"""


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
    assert len(commits) == 1, commits


def test_an_activate_commits_once_before_the_program_runs(node: Daemon) -> None:
    commits = activate_and_count(node, "a")
    assert len(commits) == 1, commits


def test_a_send_to_a_running_session_is_committed_before_its_answer(
    node: Daemon, pg_dsn: str
) -> None:
    """Nothing starts: the message and its pending wake are one commit, made before
    ``send`` answers (a node killed right after keeps both)."""
    node.ctl("create", str(node.write_spec("busy", BUSY)), check=True)
    node.ctl("send", "busy", "first", check=True)
    wait_event(node, "busy", "run.started")
    since = len(node.lines)
    answer = node.json("send", "busy", "second")
    node.reap()  # kill -9 of the whole node: what was not committed is gone
    mine = [
        line["types"]
        for line in node.lines[since:]
        if line.get("event") == "log.commit" and line.get("session") == "busy"
    ]
    assert mine == [["message.received", "wake.requested"]], mine
    reader = PgStore(pg_dsn, node="reader")
    try:
        records = [r for r, _line in reader.read_lines("busy")]
    finally:
        reader.close_sync()
    (second,) = [
        r for r in records if r["type"] == "message.received" and r["seq"] == answer["seq"]
    ]
    assert second["data"]["text"] == "second"
    assert records[-1]["type"] == "wake.requested"
    assert records[-1]["data"]["details"]["seq"] == answer["seq"]
