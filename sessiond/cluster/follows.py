"""Hints for ``log --follow`` across nodes (sessiond.ipc.tail reads the events).

A node with a follower of a session says so on the cluster's broker
(sessiond.cluster.channels: ``Followed``, the session's name), at once and then
every ``REFRESH`` seconds while it follows. Every node listens; the one that
runs the session remembers it for three refreshes and, after each of its
commits for it, publishes ``Committed`` (the name again), coalesced: at most one
a session per ``COALESCE``. The follower's node wakes its followers of that
session, which read the table.

Only hints: a lost one costs a follower one poll, and a session nobody follows
costs no wake-up at all (on PostgreSQL every notifying commit takes a
cluster-wide lock, so the appends themselves never notify). After a take-over
the new owner hears of the follower at its next refresh; until then the poll
carries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from sessiond.cluster.channels import Broker, Committed, Followed, Published, WakeUp
from sessiond.log.store.base import Record
from sessiond.table.sessions import Table

log = structlog.get_logger(__name__)

REFRESH = 5.0  # seconds between a follower node's announcements
COALESCE = 0.02  # seconds: a burst of commits is one hint


class FollowHints:
    """This node's side of the hints: it announces its followers, listens for the
    others', and notifies the commits of the sessions followed elsewhere."""

    def __init__(self, broker: Broker, table: Table) -> None:
        self.broker = broker
        self.table = table
        self._wakes: dict[str, set[Callable[[], None]]] = {}  # followed here
        self._followed: dict[str, float] = {}  # followed elsewhere: until (monotonic)
        self._dirty: set[str] = set()  # committed here, to notify
        self._new: set[str] = set()  # followed here since the last announcement
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._unlisten: Callable[[], None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        self._unlisten = self.table.listen(self._committed)
        self._unsubscribe = self.broker.subscribe(self._heard, (Followed, Committed))
        self._tasks = [asyncio.ensure_future(self._notify())]

    async def close(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
        if self._unsubscribe is not None:
            self._unsubscribe()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def watch(self, session: str, wake: Callable[[], None]) -> Callable[[], None]:
        wakes = self._wakes.setdefault(session, set())
        if not wakes:
            self._new.add(session)
            self._kick.set()
        wakes.add(wake)

        def unwatch() -> None:
            wakes.discard(wake)
            if not wakes and self._wakes.get(session) is wakes:
                del self._wakes[session]

        return unwatch

    def _committed(self, session: str, _record: Record) -> None:
        until = self._followed.get(session)
        if until is None:
            return
        if until < time.monotonic():
            del self._followed[session]
            return
        self._dirty.add(session)
        self._kick.set()

    def _heard(self, wake: WakeUp) -> None:
        if isinstance(wake, Followed):
            self._followed[wake.session] = time.monotonic() + 3 * REFRESH
        elif isinstance(wake, Committed):
            for woken in list(self._wakes.get(wake.session, ())):
                woken()

    async def _notify(self) -> None:
        while True:
            try:
                announced = 0.0
                while True:
                    left = announced + REFRESH - time.monotonic()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._kick.wait(), max(0.0, left))
                    self._kick.clear()
                    now = time.monotonic()
                    if now >= announced + REFRESH:
                        follows, announced = set(self._wakes), now
                        # forget the follows elsewhere that were not renewed
                        for name, until in list(self._followed.items()):
                            if until < now:
                                del self._followed[name]
                    else:
                        follows = self._new & set(self._wakes)
                    self._new.clear()
                    events, self._dirty = sorted(self._dirty), set()
                    said: list[Published] = [Followed(n) for n in sorted(follows)]
                    said += [Committed(n) for n in events]
                    if said:
                        await self.broker.publish(said)
                    await asyncio.sleep(COALESCE)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker away: everything again, a second later
                log.warning("follows.notify_failed", error=repr(exc))
                await asyncio.sleep(1.0)
