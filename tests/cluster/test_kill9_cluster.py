"""The kill -9 campaign against a cluster in its reduced form (``make
faults-cluster`` runs 30 rounds): three real nodes on a real PostgreSQL, a
random node killed each round, the same invariants as on one machine plus no
write under a stale epoch. Repeat a failure with ``python -m tests.faults.cluster
--iterations N --seed S``."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import psycopg
import pytest

from sessiond.codec import encode_line
from tests.faults.cluster import ClusterCampaign, run_cluster_campaign

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
    assert tally.freezes == ROUNDS // 4  # a whole node paused past its lease, resumed
    assert not tally.failed, table


def test_the_campaign_counts_a_paused_nodes_write_after_take_over_as_a_violation(
    pg_dsn: str, tmp_path: Path
) -> None:
    campaign = ClusterCampaign(tmp_path, random.Random(1), pg_dsn)
    try:
        entries = [  # n1 paused, resumed at 10.0: its try at 10.004 came after the take-over
            {"session": "fenced", "epoch": 1, "text": "n1", "ok": True, "at": 9.0},
            {"session": "fenced", "epoch": 2, "text": "n2", "ok": True, "at": 9.5},
            {"session": "fenced", "epoch": 1, "text": "n1", "ok": False, "at": 10.004},
        ]
        campaign.fenced.file.write_text("".join(json.dumps(e) + "\n" for e in entries))
        campaign._judge_resume("n2", 10.0)
        assert campaign.cluster_tally.late_writes == []
        campaign._judge_resume("n1", 10.0)
        campaign._check_fenced()
    finally:
        campaign.reader.close_sync()
    tally = campaign.cluster_tally
    assert len(tally.late_writes) == 1
    assert (
        "n1's run of fenced under epoch 1, 0.004 s after the resume (refused)"
        in (tally.late_writes[0])
    )
    assert tally.refused == 1
    assert tally.stale == []  # the ledger itself refused it: no stale epoch accepted
    assert "ledger writes by a paused node after take-over" in tally.violations()


def test_the_campaign_counts_a_write_under_a_stale_epoch_as_a_violation(
    pg_dsn: str, tmp_path: Path
) -> None:
    campaign = ClusterCampaign(tmp_path, random.Random(1), pg_dsn)
    try:
        campaign._check_database()
        assert campaign.cluster_tally.stale == []
        lines = [  # seq 2 landed under epoch 1 after epoch 2 had claimed the session
            encode_line({"v": 1, "session": "s", "seq": seq, "id": f"i{seq}", "epoch": epoch})
            for seq, epoch in ((1, 2), (2, 1))
        ]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO sessions (name, epoch, last_seq, last_id) "
                         "VALUES ('s', 2, 2, 'i2')")  # fmt: skip
            for seq, line in enumerate(lines, 1):
                conn.execute(
                    "INSERT INTO events (session, seq, id, line) VALUES ('s', %s, %s, %s)",
                    (seq, f"i{seq}", line[:-1]),
                )
        campaign._check_database()
    finally:
        campaign.reader.close_sync()
    tally = campaign.cluster_tally
    assert len(tally.stale) == 1
    assert "seq 2 was written under epoch 1 after epoch 2" in tally.stale[0]
    assert tally.failed
    assert "writes under a stale epoch" in tally.violations()
