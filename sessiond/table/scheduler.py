"""Who runs next: concurrency limits, a priority queue with aging, rate limits.

* At most ``max_running`` programs run at once (0: one per CPU), and at most
  ``max_running_per_agent`` for one owning agent (0: no limit). A session that
  passed its gate but finds no free slot waits ``ready`` in the queue.
* The queue orders by the spec's ``priority`` plus one point for every ``aging``
  seconds waited, so a low-priority session still runs under steady load.
* Each session's ``[limits]``: more than ``burst`` wakes within ``interval``
  starts a visible cool-down (``sleeping`` with the reason and its end time);
  the wakes are recorded and run together when it ends.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

from sessiond.table.sessions import Session


@dataclass
class Queued:
    session: Session
    since: float  # monotonic


@dataclass
class Scheduler:
    max_running: int
    per_agent: int
    aging: float
    queue: dict[str, Queued] = field(default_factory=dict)
    wakes: dict[str, deque[float]] = field(default_factory=dict)
    cooling: dict[str, float] = field(default_factory=dict)  # session -> wall-clock end
    starting: set[str] = field(default_factory=set)  # admitted, program not started yet

    @property
    def limit(self) -> int:
        return self.max_running or os.cpu_count() or 1

    def admits(self, s: Session, running: list[Session]) -> bool:
        if len(running) >= self.limit:
            return False
        if self.per_agent and s.spec is not None:
            same = sum(1 for r in running if r.spec is not None and r.spec.agent == s.spec.agent)
            if same >= self.per_agent:
                return False
        return True

    def enqueue(self, s: Session) -> None:
        self.queue.setdefault(s.name, Queued(s, time.monotonic()))

    def order(self) -> list[Session]:
        """The queue, best first: priority plus one point per ``aging`` seconds waited."""
        now = time.monotonic()

        def score(q: Queued) -> tuple[float, float]:
            priority = q.session.spec.priority if q.session.spec is not None else 0
            return (-(priority + (now - q.since) / self.aging), q.since)

        return [q.session for q in sorted(self.queue.values(), key=score)]

    def rate_limited(self, s: Session, now: float) -> float | None:
        """Count a wake; the end of a cool-down (wall clock) if this one is over the limit."""
        if s.spec is None:
            return None
        limits = s.spec.limits
        end = self.cooling.get(s.name)
        if end is not None and now < end:
            return end
        self.cooling.pop(s.name, None)
        window = self.wakes.setdefault(s.name, deque())
        window.append(now)
        while window and window[0] < now - limits.interval:
            window.popleft()
        if len(window) > limits.burst:
            window.clear()
            self.cooling[s.name] = now + limits.cool_down
            return self.cooling[s.name]
        return None
