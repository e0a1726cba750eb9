"""Cron logic on a controllable clock: next fires, DST, catch-up after downtime."""

from __future__ import annotations

from datetime import UTC, datetime

from sessiond.wake.cron import Cron


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def test_the_next_fire_of_a_monthly_schedule() -> None:
    cron = Cron("0 9 1 * *", "UTC")
    assert cron.next_after(utc(2026, 1, 15)) == utc(2026, 2, 1, 9)
    assert cron.next_after(utc(2026, 2, 1, 9)) == utc(2026, 3, 1, 9)  # strictly after


def test_a_time_zone_moves_the_fire_with_summer_time() -> None:
    cron = Cron("0 9 * * *", "Europe/Paris")
    winter = cron.next_after(utc(2026, 3, 20, 12))
    summer = cron.next_after(utc(2026, 4, 2, 12))
    assert winter is not None
    assert summer is not None
    assert winter.astimezone(UTC).hour == 8  # 09:00 CET
    assert summer.astimezone(UTC).hour == 7  # 09:00 CEST


def test_a_fire_inside_the_skipped_dst_hour_still_fires_once_that_day() -> None:
    cron = Cron("30 2 * * *", "Europe/Paris")  # 02:30 does not exist on 2026-03-29
    fire = cron.next_after(utc(2026, 3, 28, 12))
    after = cron.next_after(fire) if fire else None
    assert fire is not None
    assert after is not None
    assert fire.date().isoformat() == "2026-03-29"
    assert after.date().isoformat() == "2026-03-30"


def test_catch_up_after_downtime_is_one_fire_however_long_the_gap() -> None:
    cron = Cron("* * * * *", "UTC")  # every minute: months of downtime miss many
    first = cron.first_missed(utc(2026, 1, 1), utc(2026, 6, 1))
    assert first == utc(2026, 1, 1, 0, 1)
    assert cron.first_missed(utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 1, 30)) is None


def test_a_clock_set_back_finds_no_missed_fire() -> None:
    cron = Cron("0 9 1 * *", "UTC")
    last_fire = utc(2026, 5, 1, 9)
    now_after_setback = utc(2026, 4, 20)  # the wall clock went back before the last fire
    assert cron.first_missed(last_fire, now_after_setback) is None
    assert cron.next_after(now_after_setback) == utc(2026, 5, 1, 9)


def test_cron_jitter_is_the_same_in_every_process() -> None:
    """A restart must not move a jittered fire: Python's hash() of a str is salted
    per process (PYTHONHASHSEED), so the jitter is a digest of the session, the
    trigger and the fire time instead."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "from datetime import UTC, datetime\n"
        "from sessiond.wake.timers import jitter\n"
        "fire = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)\n"
        "import json\n"
        "print(json.dumps([jitter('nightly', f'cron:{i}', fire) for i in range(5)]))\n"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(seen) == 1, seen
    values = json.loads(seen.pop())
    assert all(0 <= v < 1 for v in values)
    assert len(set(values)) > 1  # spread, not one constant
