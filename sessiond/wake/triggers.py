"""Triggers: what wakes a sleeping session.

* ``cron`` and ``every``: timers on the daemon's clock (sessiond.wake.timers).
* ``watch`` and ``[bind]`` (dependency): one shared watcher over every armed
  workspace, debounced per session, with a reconciliation scan
  (sessiond.wake.watch).
* ``git``: a moved ref whose commits touch the trigger's paths wakes the session
  with the commit range (sessiond.wake.git).
* ``message`` is ``sessionctl send``; ``manual`` is ``sessionctl activate``.

This module is the coordinator: it keeps the table of armed sessions, arms each
from its spec, disarms and re-arms it, and tells ``ps``/``show`` the next wake.
Each trigger kind is a part it owns; all of them ask the host (the kernel, see
sessiond.wake.host) for the wake itself.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from sessiond.table.sessions import Session
from sessiond.table.spec import (
    CronTriggerSpec,
    EveryTriggerSpec,
    GitTriggerSpec,
    WatchTriggerSpec,
)
from sessiond.wake.armed import Armed
from sessiond.wake.git import GitTriggers
from sessiond.wake.host import WakeHost
from sessiond.wake.timers import Timers
from sessiond.wake.watch import Watcher


class Triggers:
    def __init__(
        self,
        host: WakeHost,
        clock: Callable[[], float],
        poll_step_ms: int,
        hold: Callable[[str, str], Awaitable[None]] | None = None,  # tests (watch.py)
    ) -> None:
        self.host = host
        self.armed: dict[str, Armed] = {}
        self.started = False
        self.timers = Timers(host, clock, self.armed)
        self.git = GitTriggers(host)
        self.watcher = Watcher(host, poll_step_ms, self.armed, self.git.check, hold)

    # --- arming ---------------------------------------------------------------------

    def arm_all(self) -> None:
        self.started = True
        for s in self.host.table:
            self.arm(s)
        self.watcher.restart()
        self.watcher.start_reconciler()

    def arm(self, s: Session) -> None:
        """(Re)arm a session's triggers from its spec; disarm if it has none left."""
        old = self.armed.get(s.name)
        self.disarm(s.name, restart=False)
        spec = s.spec
        if spec is None or not spec.has_triggers or s.journal_or_none is None:
            return
        if s.state in ("terminated", "arriving"):  # arriving: armed when its hand-over ends
            return
        armed = Armed(s, spec, git_seen=self.git.seen(s.name))
        self.armed[s.name] = armed
        crons: set[tuple[str, str, float]] = set()
        for index, trig in enumerate(spec.trigger):
            key = f"{trig.type}#{index}"
            if isinstance(trig, CronTriggerSpec):
                # a repeated schedule fires the same times: one wake each (a cluster
                # takes a fire time once, and would refuse the second)
                if (same := (trig.schedule, trig.timezone, trig.jitter)) not in crons:
                    crons.add(same)
                    self.timers.arm_cron(armed, key, trig)
            elif isinstance(trig, EveryTriggerSpec):
                self.timers.arm_every(armed, key, trig)
            elif isinstance(trig, GitTriggerSpec):
                self.git.arm(armed, trig)
        if armed.git_seen:  # commits made since the last scan (a restart) wake it now
            self.git.check(armed)
        if old is None or not self.watcher.keep_looks(old, armed):
            self.watcher.baseline_scan(armed)
            if old is not None:
                self.watcher.carry_over(old, armed)

    def disarm(self, name: str, *, restart: bool = True) -> None:
        armed = self.armed.pop(name, None)
        if armed is None:
            return
        if armed.session.state == "terminated" or name not in self.host.table.sessions:
            self.git.forget(name)
        armed.cancel()
        if restart:
            self.watcher.restart()

    def rearm(self, s: Session) -> None:
        if not self.started:
            return  # arm_all() arms everyone once, at start-up
        self.arm(s)
        self.watcher.restart()

    def run_ended(self, s: Session) -> None:
        """An ``every`` interval is measured from the end of the last run."""
        spec = s.spec
        if spec is not None and any(isinstance(t, EveryTriggerSpec) for t in spec.trigger):
            self.rearm(s)

    def route(self, paths: set[str]) -> None:
        """Send changed absolute paths to the sessions that watch them."""
        self.watcher.route(paths)

    async def close(self) -> None:
        for name in list(self.armed):
            self.disarm(name, restart=False)
        await self.watcher.close()

    def next_wake(self, s: Session) -> str | None:
        """For ps/show: the next time for cron and every, "on change of …" for the rest."""
        armed = self.armed.get(s.name)
        spec = s.spec
        if armed is None or spec is None:
            return None
        parts = []
        if armed.next_fires:
            soonest = min(armed.next_fires.values())
            parts.append(soonest.isoformat(timespec="seconds").replace("+00:00", "Z"))
        for trig in spec.trigger:
            if isinstance(trig, WatchTriggerSpec):
                parts.append("on change of " + " ".join(trig.paths))
            elif isinstance(trig, GitTriggerSpec):
                parts.append(f"on commit to {' '.join(trig.paths)}")
            elif trig.type == "message":
                parts.append("on message")
        if spec.bind.files:
            parts.append("on change of " + " ".join(spec.bind.files))
        return "; ".join(parts) or None


def wall_clock(offset: float) -> Callable[[], float]:
    return lambda: time.time() + offset
