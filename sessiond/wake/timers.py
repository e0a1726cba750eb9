"""``cron`` and ``every``: timers on the daemon's clock.

A timer never sleeps more than a minute before looking at the clock again, so a
wall clock set back or forward, or a suspended machine, causes at most one run
and a recomputed next fire — never a burst and never a hang. Cron fires missed
while the daemon was down run once at start-up (``catch_up = "once"``); the last
fire is taken from the session's own log (its last cron ``wake.requested``).

Separate from the watcher and the git trigger because it alone reasons about
time: the clock, next fires, catch-up, clock jumps.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sessiond.table.spec import CronTriggerSpec, EveryTriggerSpec
from sessiond.wake.armed import Armed
from sessiond.wake.cron import Cron
from sessiond.wake.host import WakeHost, last_wake

RECHECK = 60.0  # seconds: the longest a timer sleeps before reading the clock again


def jitter(session: str, key: str, fire: datetime) -> float:
    """A fraction in [0, 1) for this session, trigger and fire time: the same in
    every process (Python's hash() of a str is salted per process, so a restart
    would move every jittered fire)."""
    digest = hashlib.sha256(f"{session}\0{key}\0{fire.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 1000 / 1000


class Timers:
    """Arms a session's cron and every triggers; each fire asks the host for a wake.

    ``armed`` is the coordinator's table of armed sessions: a timer whose session
    was disarmed (or re-armed) meanwhile does nothing.
    """

    def __init__(self, host: WakeHost, clock: Callable[[], float], armed: dict[str, Armed]) -> None:
        self.host = host
        self.clock = clock  # seconds since the epoch (the daemon's clock)
        self.armed = armed

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def _live(self, armed: Armed) -> bool:
        return self.armed.get(armed.session.name) is armed

    def _schedule(self, armed: Armed, key: str, fire: datetime, fn: Callable[[], None]) -> None:
        armed.next_fires[key] = fire
        delay = min(max((fire - self.now()).total_seconds(), 0.0), RECHECK)
        armed.timers.append(asyncio.get_running_loop().call_later(delay, fn))

    # --- cron -----------------------------------------------------------------------

    def arm_cron(self, armed: Armed, key: str, trig: CronTriggerSpec) -> None:
        cron = Cron(trig.schedule, trig.timezone, trig.jitter)
        s = armed.session
        now = self.now()
        last = last_wake(self.host, s, "cron")
        if last is not None:
            details = last["data"]["details"]
            # a catch-up stands for every fire up to the moment it was made
            reference = datetime.fromisoformat(str(details.get("caught_up_to") or details["fire"]))
        else:
            created = s.journal.state.created_at
            reference = datetime.fromisoformat(created.replace("Z", "+00:00")) if created else now
        missed = cron.first_missed(reference, now) if trig.catch_up == "once" else None
        if missed is not None:
            details = {
                "schedule": trig.schedule, "fire": missed.isoformat(), "catch_up": True,
                "caught_up_to": now.isoformat(),
            }  # fmt: skip
            self.host.spawn(self.host.wake(s, "cron", details))
        # Never a fire the log has already: a cluster node whose clock is behind the
        # one that recorded it (a take-over) would otherwise run that time again.
        self._next_cron(armed, key, trig, cron, max(now, reference))

    def _next_cron(
        self, armed: Armed, key: str, trig: CronTriggerSpec, cron: Cron, after: datetime
    ) -> None:
        fire = cron.next_after(after)
        if fire is None:
            armed.next_fires.pop(key, None)
            return
        if trig.jitter:
            fire += timedelta(seconds=jitter(armed.session.name, key, fire) * trig.jitter)

        def tick() -> None:
            if not self._live(armed):
                return  # disarmed meanwhile
            now = self.now()
            if now >= fire:
                details = {"schedule": trig.schedule, "fire": fire.isoformat()}
                self.host.spawn(self.host.wake(armed.session, "cron", details))
                self._next_cron(armed, key, trig, cron, now)  # missed fires collapse into one
            elif fire - now > timedelta(days=400):
                self._next_cron(armed, key, trig, cron, now)  # the clock went back: recompute
            else:
                self._schedule(armed, key, fire, tick)

        self._schedule(armed, key, fire, tick)

    # --- every ----------------------------------------------------------------------

    def arm_every(self, armed: Armed, key: str, trig: EveryTriggerSpec) -> None:
        s = armed.session
        state = s.journal.state
        anchor = (state.last_run["ts"] if state.last_run else None) or state.created_at
        base = datetime.fromisoformat(anchor.replace("Z", "+00:00")) if anchor else self.now()
        fire = max(base + timedelta(seconds=trig.interval), self.now())

        def tick() -> None:
            if not self._live(armed):
                return
            now = self.now()
            if now >= fire or fire - now > timedelta(seconds=trig.interval * 2):
                self.host.spawn(self.host.wake(s, "every", {"interval": trig.interval}))
                # measured from the end of the run: re-armed when the run ends
            else:
                self._schedule(armed, key, fire, tick)

        self._schedule(armed, key, fire, tick)
