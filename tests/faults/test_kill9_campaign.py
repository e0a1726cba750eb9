"""The kill -9 campaign in its reduced form (``make faults`` runs 200 rounds).

The seed is printed with the table, so a failing campaign can be repeated with
``python -m tests.faults.campaign --iterations N --seed S``."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.faults.campaign import Campaign, run_campaign

ROUNDS = int(os.environ.get("FAULT_ROUNDS", "20"))


@pytest.mark.timeout(600)
def test_kill_9_and_power_cuts_lose_nothing_and_repeat_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = int(os.environ.get("FAULT_SEED", str(int(time.time()))))
    tally, seconds = run_campaign(ROUNDS, seed)
    table = tally.table(seconds)
    with capsys.disabled():
        print(f"\nseed {seed}\n{table}")
    assert tally.rounds == ROUNDS
    assert tally.acked_sends > 0  # the load really ran
    assert tally.acked_tools > 0
    assert tally.power_cuts == ROUNDS // 2
    assert not tally.failed, table


@pytest.mark.timeout(300)
def test_with_durability_os_every_log_stays_readable_and_consistent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = int(os.environ.get("FAULT_SEED", str(int(time.time()))))
    tally, seconds = run_campaign(max(4, ROUNDS // 4), seed, durability="os")
    table = tally.table(seconds)
    with capsys.disabled():
        print(f"\nseed {seed}\n{table}")
    assert tally.power_cuts > 0
    assert not tally.unreadable, table
    assert not tally.stuck, table
    assert not tally.unhandled, table


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The invariants are only worth their zeros if they see a violation."""
    campaign = Campaign(tmp_path, random.Random(0), power_cut=True)
    (tmp_path / "ledger.agent").write_text("1 c1\n2 c2\n2 c3\n")  # step 2 done twice
    (tmp_path / "ledger.unsafe").write_text("c9\nc9\n")  # one call run twice
    campaign._check_ledgers()
    assert campaign.tally.twice == [
        "ledger.agent: step 2 ran 2 times",
        "ledger.unsafe: call c9 ran 2 times",
    ]
    assert campaign.tally.failed
