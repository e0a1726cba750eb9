"""Three real nodes on one real PostgreSQL (a database of its own per test)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.e2e.harness import Daemon, short_dir

TTL = 2.0

# Every node of a test runs on this one machine, and the tests' workspaces lie in
# its /tmp: declared shared, so that their sessions may fail over (placement).
# And nothing moves for load: a session stays on the node it was made on, so that
# a test knows which node runs what (tests/cluster/test_balance.py turns it on;
# a dead node's sessions are still dealt out by load).
SHARED = 'shared_paths = ["/tmp"]\nmoves_per_interval = 0\n'

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


def node(dsn: str, name: str, extra: str = SHARED) -> Daemon:
    """A cluster node named ``name`` on ``dsn`` (not started), ``extra`` in its
    ``[cluster]`` table."""
    return Daemon(
        short_dir(), f'[cluster]\ndsn = "{dsn}"\nnode = "{name}"\nlease_ttl = "{TTL}s"\n{extra}'
    )


@contextmanager
def nodes_of(
    dsn: str, count: int, *, extra: str = SHARED, start: bool = True
) -> Iterator[list[Daemon]]:
    """Nodes n1..n``count``, started unless not ``start``; each reaped and removed after."""
    made: list[Daemon] = []
    try:
        for i in range(1, count + 1):
            made.append(node(dsn, f"n{i}", extra))
            if start:
                made[-1].start()
        yield made
    finally:
        for d in made:
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)


@pytest.fixture
def three(pg_dsn: str) -> Iterator[list[Daemon]]:
    with nodes_of(pg_dsn, 3) as made:
        yield made


def node_name(d: Daemon) -> str:
    """The node a daemon of these tests is (its [cluster] node)."""
    found = re.search(r'^node = "([^"]+)"', d.config.read_text(), re.MULTILINE)
    assert found is not None
    return found.group(1)


def owned(d: Daemon) -> list[str]:
    """The sessions node ``d`` runs (its ``ps`` lists the whole cluster's)."""
    return [r["name"] for r in d.json("ps") if r.get("node") == node_name(d)]


def taken_over(nodes: list[Daemon], session: str) -> Daemon | None:
    for d in nodes:
        if any(
            line.get("event") == "cluster.taken_over" and line.get("session") == session
            for line in list(d.lines)
        ):
            return d
    return None
