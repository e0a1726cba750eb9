"""Three real nodes on one real PostgreSQL (a database of its own per test)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Collection, Generator, Iterator
from contextlib import contextmanager

import pluggy
import pytest

from tests.e2e.harness import STARTED, Daemon, short_dir
from tests.patience import SLOW

# Two leases. A node a test lets lapse (it kills, pauses or cuts it off, then waits
# for another node to take over, or checks its programs stop by the deadline) has
# a short one: 2 s on a quiet machine, scaled by SLOW (3x under CI=true or load,
# tests/patience.py), so that a renewal a busy machine delays does not lapse it
# before the test's own fault. Every other node
# has a long one: a late renewal never ends a node a test relies on (with two
# suites at once on 2 cores, 2 s leases lapsed on nodes that were to take over),
# though a drain reaches it only at its next renewal (a third of 30 s at most).
# A test names its short-lease nodes (``short``, or the ``short_lease`` mark for
# the ``three`` fixture); a clean stop lets go of a lease at once, whatever its
# length.
TTL = 2.0 * SLOW
KEPT_TTL = 30.0

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


def lease(short: bool) -> str:
    """The ``lease_ttl`` line of a node with the short lease, or the long one."""
    return f'lease_ttl = "{TTL if short else KEPT_TTL}s"\n'


def node(dsn: str, name: str, extra: str = SHARED, *, short_lease: bool = False) -> Daemon:
    """A cluster node named ``name`` on ``dsn`` (not started), ``extra`` in its
    ``[cluster]`` table; with ``short_lease``, the short lease."""
    return Daemon(
        short_dir(), f'[cluster]\ndsn = "{dsn}"\nnode = "{name}"\n{lease(short_lease)}{extra}'
    )


@contextmanager
def nodes_of(
    dsn: str,
    count: int,
    *,
    extra: str = SHARED,
    start: bool = True,
    short: Collection[str] = (),
) -> Iterator[list[Daemon]]:
    """Nodes n1..n``count``, started unless not ``start``, those named in
    ``short`` with the short lease; each reaped and removed after."""
    made: list[Daemon] = []
    try:
        for i in range(1, count + 1):
            made.append(node(dsn, f"n{i}", extra, short_lease=f"n{i}" in short))
            if start:
                made[-1].start()
        yield made
    finally:
        for d in made:
            d.reap()
            shutil.rmtree(d.root, ignore_errors=True)


def short_leased(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The nodes a test names in ``@pytest.mark.short_lease(...)``."""
    mark = request.node.get_closest_marker("short_lease")
    return tuple(mark.args) if mark is not None else ()


@pytest.fixture
def three(pg_dsn: str, request: pytest.FixtureRequest) -> Iterator[list[Daemon]]:
    """n1, n2, n3; those a test names in ``@pytest.mark.short_lease(...)`` with
    the short lease."""
    with nodes_of(pg_dsn, 3, short=short_leased(request)) as made:
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
    """The node of ``nodes`` that took ``session`` over, if one did; an error once
    all of them have ended (a wait for it would wait for nothing)."""
    ended = [d.proc.poll() for d in nodes if d.proc is not None and d.proc.poll() is not None]
    for d in nodes:
        if any(
            line.get("event") == "cluster.taken_over" and line.get("session") == session
            for line in list(d.lines)
        ):
            return d
    if nodes and len(ended) == len(nodes):
        raise AssertionError(f"every node that could take {session} over has ended: {ended}")
    return None


# What a failed cluster test's report shows of each node it started: whether a
# lease lapsed under one (and why) is the first question such a failure asks.
LEASE_EVENTS = frozenset(
    {"cluster.joined", "cluster.renew_failed", "cluster.lease_lost", "cluster.taken_over"}
)


@pytest.fixture(autouse=True)
def _started_afresh() -> None:
    STARTED.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    result = outcome.get_result()
    if result.when != "call" or not result.failed:
        return
    said = []
    for d in STARTED:  # (their folders may be gone: what they said is kept)
        lines = [line for line in list(d.lines) if line.get("event") in LEASE_EVENTS]
        name = next((line["node"] for line in lines if "node" in line), d.root)
        code = d.proc.poll() if d.proc is not None else None
        said.append(f"{name} (exit {code}):")
        said += [f"  {line}" for line in lines]
    if said:
        result.sections.append(("the nodes' lease events", "\n".join(said)))
