"""Three real nodes on one real PostgreSQL: kill -9 of one moves its sessions to
the others (DESIGN.md section 10, "Failover")."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for

TTL = 2.0

HELLO = """name = "hello"
[run]
exec = ["sh", "-c", "echo hello >> out.txt"]
cwd = "."
writes = ["out.txt"]
side_effect = "read"
idempotency = "safe"

[[trigger]]
type = "message"
"""


@pytest.fixture
def three(pg_dsn: str) -> Iterator[list[Daemon]]:
    nodes: list[Daemon] = []
    try:
        for i in (1, 2, 3):
            config = f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n{i}"\nlease_ttl = "{TTL}s"\n'
            nodes.append(Daemon(short_dir(), config).start())
        yield nodes
    finally:
        for d in nodes:
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)


def taken_over(nodes: list[Daemon], session: str) -> Daemon | None:
    for d in nodes:
        if any(
            line.get("event") == "cluster.taken_over" and line.get("session") == session
            for line in list(d.lines)
        ):
            return d
    return None


def test_kill_9_of_a_node_moves_its_session_and_a_send_wakes_it_there(
    three: list[Daemon],
) -> None:
    first, *others = three
    spec = first.write_spec("hello", HELLO)
    first.ctl("create", str(spec), check=True)
    first.ctl("activate", "hello", check=True)
    wait_event(first, "hello", "run.finished")
    assert first.json("ps")[0]["name"] == "hello"
    for d in others:  # the others do not run what a live node owns
        assert all(row["name"] != "hello" for row in d.json("ps"))

    killed = time.monotonic()
    first.kill9()
    new = wait_for(lambda: taken_over(others, "hello"), timeout=TTL + 30, what="a take-over")
    moved = time.monotonic() - killed
    assert moved < TTL + 10, f"failover took {moved:.1f}s"

    seen = len(new.json("log", "hello"))
    new.ctl("send", "hello", "wake up on your new node", check=True)
    finished = wait_event(new, "hello", "run.finished", since=seen + 1)
    records: list[dict[str, Any]] = new.json("log", "hello")
    epochs = [r["epoch"] for r in records]
    assert epochs == sorted(epochs)  # the epoch never decreases along the seqs
    nodes = [r["node"] for r in records]
    assert nodes[0] == "n1"
    assert finished["node"] in ("n2", "n3")
    assert finished["node"] != "n1"
    # n1's finished run was replayed on the new node, never run again: two runs in all
    assert (first.root / "out.txt").read_text() == "hello\nhello\n"
    print(f"failover: kill -9 to taken over in {moved:.2f}s (lease_ttl {TTL}s)")
