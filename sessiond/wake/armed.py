"""A session's live triggers: the state every trigger kind keeps per armed session.

Separate so that the timers, the watcher and the git trigger can share it
without importing one another or the coordinator (sessiond.wake.triggers).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from sessiond.table.sessions import Session
from sessiond.table.spec import SessionSpec

# What a change of a watched path is measured against: modification time, size and
# inode (sessiond.wake.watch, _look).
Look = tuple[int, int, int]


@dataclass
class Armed:
    """A session's live triggers."""

    session: Session
    spec: SessionSpec | None = None  # the spec it was armed with (a re-arming compares)
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    next_fires: dict[str, datetime] = field(default_factory=dict)  # trigger key -> next fire
    pending_paths: set[str] = field(default_factory=set)
    flush: asyncio.TimerHandle | None = None
    # repo:ref -> last commit seen; shared by every arming of the session (see arm)
    git_seen: dict[str, str] = field(default_factory=dict)
    scan: dict[str, Look] = field(default_factory=dict)  # the last look at each watched path
    # path -> when the watcher last looked at it (monotonic ns): newer than a scan
    # that began before, whose finding for it is then stale (watch.py, _differences)
    looked: dict[str, int] = field(default_factory=dict)
    # whose baseline ``scan`` and ``looked`` continue: this arming's, or the one before
    # when a re-arming kept its looks (a scan in a thread for either applies to it)
    lineage: object = field(default_factory=object)

    def cancel(self) -> None:
        """Stop its timers and a pending debounce flush (disarming)."""
        for timer in self.timers:
            timer.cancel()
        if self.flush is not None:
            self.flush.cancel()
