"""The campaign's self-test in its reduced form (``make faults-selftest`` tries all
eight breaks): the campaign catches a broken build, and the invariant that
catches it is the one the break names. Each short campaign stops at the first
round with a violation."""

from __future__ import annotations

import os
import time

import pytest

from tests.faults import faultfs
from tests.faults.selftest import try_break

SEED = int(os.environ.get("FAULT_SEED", str(int(time.time()))))


# A break shows only when a kill lands on the work it spoils (the gate's, a call
# cut off mid-run): at most this many rounds, stopping at the first that catches
# it (most do in round 1), so a slow machine's unlucky kills do not fail the test.
ROUNDS = 16


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", ["gate-allows", "no-redaction"])
def test_the_campaign_catches_a_broken_build(name: str) -> None:
    result = try_break(name, ROUNDS, SEED)
    assert result.caught, f"seed {SEED}: {result.line()}"


@pytest.mark.timeout(1200)
def test_the_fault_file_system_catches_fsync_that_does_nothing() -> None:
    """What the daemon's own word could never show: only a power cut that loses
    what was not fsynced does."""
    why_not = faultfs.usable()
    if why_not is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI=true the fault file system must be usable: {why_not}")
        pytest.skip(why_not)
    result = try_break("fsync-noop", ROUNDS, SEED)
    assert result.caught, f"seed {SEED}: {result.line()}"
