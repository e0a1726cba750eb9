"""The kill -9 campaign against a cluster in its reduced form (``make
faults-cluster`` runs 30 rounds): three real nodes on a real PostgreSQL, a
random node killed each round, the same invariants as on one machine plus no
write under a stale epoch. Repeat a failure with ``python -m tests.faults.cluster
--iterations N --seed S``."""

from __future__ import annotations

import os
import time

import pytest

from tests.faults.cluster import run_cluster_campaign

ROUNDS = int(os.environ.get("CLUSTER_FAULT_ROUNDS", "4"))


@pytest.mark.timeout(900)
def test_kill_9_of_random_nodes_loses_nothing_repeats_nothing_and_fences_stale_owners(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = int(os.environ.get("FAULT_SEED", str(int(time.time()))))
    tally, seconds = run_cluster_campaign(ROUNDS, seed, pg_dsn)
    table = tally.table(seconds)
    with capsys.disabled():
        print(f"\nseed {seed}\n{table}")
    assert tally.rounds == ROUNDS
    assert tally.acked_sends > 0  # the load really ran
    assert tally.executions > 0
    assert tally.failovers > 0  # a killed node's sessions moved to the others
    assert not tally.failed, table
