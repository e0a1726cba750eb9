"""Three real nodes on one real PostgreSQL (a database of its own per test)."""

from __future__ import annotations

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


def taken_over(nodes: list[Daemon], session: str) -> Daemon | None:
    for d in nodes:
        if any(
            line.get("event") == "cluster.taken_over" and line.get("session") == session
            for line in list(d.lines)
        ):
            return d
    return None
