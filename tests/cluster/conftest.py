"""Three real nodes on one real PostgreSQL (a database of its own per test)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator

import pytest

from tests.e2e.harness import Daemon, short_dir

TTL = 2.0

# Every node of a test runs on this one machine, and the tests' workspaces lie in
# its /tmp: declared shared, so that their sessions may fail over (placement).
SHARED = 'shared_paths = ["/tmp"]\n'

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
            config = f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n{i}"\nlease_ttl = "{TTL}s"\n{SHARED}'
            nodes.append(Daemon(short_dir(), config).start())
        yield nodes
    finally:
        for d in nodes:
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)


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
