"""The kill -9 campaign in its reduced form (``make faults`` runs 200 rounds).

The seed is printed with the table, so a failing campaign can be repeated with
``python -m tests.faults.campaign --iterations N --seed S``."""

from __future__ import annotations

import os
import time

import pytest

from tests.faults.campaign import run_campaign

ROUNDS = int(os.environ.get("FAULT_ROUNDS", "6"))


@pytest.mark.timeout(900)
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
    assert tally.executions > 0
    assert tally.power_cuts == ROUNDS // 2
    assert sum(tally.fault_points.values()) > 0  # a named fault point was hit
    assert tally.stops >= 2  # round 4's clean stop and the last: nothing left after either
    assert not tally.failed, table


@pytest.mark.timeout(300)
def test_with_durability_os_every_log_stays_readable_and_consistent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = int(os.environ.get("FAULT_SEED", str(int(time.time()))))
    tally, seconds = run_campaign(2, seed, durability="os")  # round 2 is a power cut
    table = tally.table(seconds)
    with capsys.disabled():
        print(f"\nseed {seed}\n{table}")
    assert tally.power_cuts > 0
    assert not tally.failed, table
