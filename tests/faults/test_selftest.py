"""The campaign's self-test in its reduced form (``make faults-selftest`` tries all
seven breaks): the campaign catches a broken build, and the invariant that
catches it is the one the break names. Each short campaign stops at the first
round with a violation."""

from __future__ import annotations

import os
import time

import pytest

from tests.faults import faultfs
from tests.faults.selftest import try_break

SEED = int(os.environ.get("FAULT_SEED", str(int(time.time()))))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["gate-allows", "no-redaction"])
def test_the_campaign_catches_a_broken_build(name: str) -> None:
    result = try_break(name, 6, SEED)
    assert result.caught, f"seed {SEED}: {result.line()}"


@pytest.mark.timeout(600)
def test_the_fault_file_system_catches_fsync_that_does_nothing() -> None:
    """What the daemon's own word could never show: only a power cut that loses
    what was not fsynced does."""
    why_not = faultfs.usable()
    if why_not is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI=true the fault file system must be usable: {why_not}")
        pytest.skip(why_not)
    result = try_break("fsync-noop", 6, SEED)
    assert result.caught, f"seed {SEED}: {result.line()}"
