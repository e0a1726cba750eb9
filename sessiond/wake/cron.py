"""The one adapter around APScheduler 3.11's CronTrigger.

Only this module imports APScheduler. It answers one question — when is the
next fire after a given moment — so the rest of sessiond can reason about
catch-up and clock jumps with plain datetimes.
"""

from __future__ import annotations

import zoneinfo
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

# APScheduler is imported by the first cron made, not by the daemon's start: a
# daemon none of whose sessions has a cron trigger never loads it.
if TYPE_CHECKING:
    from apscheduler.triggers.cron import CronTrigger


class Cron:
    def __init__(self, schedule: str, timezone: str = "UTC", jitter: float = 0.0) -> None:
        self.schedule = schedule
        from apscheduler.triggers.cron import CronTrigger

        self.tz = zoneinfo.ZoneInfo(timezone)
        self._trigger: CronTrigger = CronTrigger.from_crontab(schedule, timezone=self.tz)
        self.jitter = jitter

    def next_after(self, moment: datetime) -> datetime | None:
        """The first fire strictly after ``moment`` (aware datetimes), without jitter."""
        # get_next_fire_time(previous, now) returns the first fire at or after `now`.
        fire: datetime | None = self._trigger.get_next_fire_time(
            None, moment + timedelta(microseconds=1)
        )
        return fire

    def first_missed(self, last: datetime, now: datetime) -> datetime | None:
        """The first fire in (last, now], if any: a catch-up run stands for all of them
        (however long the daemon was down, at most one run)."""
        fire = self.next_after(last)
        return fire if fire is not None and fire <= now else None
