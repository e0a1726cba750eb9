"""A manual clock for the gateway's scheduler: time moves only when a test says."""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
from collections.abc import Callable, Coroutine
from typing import Any


class _Timer:
    def __init__(self, clock: ManualClock, at: float, fn: Callable[[], None]) -> None:
        self.clock, self.at, self.fn, self.cancelled = clock, at, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._timers: list[tuple[float, int, _Timer]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        return self.t

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Timer:
        timer = _Timer(self, self.t + max(0.0, delay), fn)
        heapq.heappush(self._timers, (timer.at, next(self._ids), timer))
        return timer

    def next_timer(self) -> float | None:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    async def advance(self, seconds: float) -> None:
        """Move time on, firing the timers due on the way (each with the loop let run)."""
        end = self.t + seconds
        while True:
            at = self.next_timer()
            if at is None or at > end:
                break
            _, _, timer = heapq.heappop(self._timers)
            self.t = max(self.t, at)
            timer.fn()
            await settle()
        self.t = end
        await settle()

    async def run_until_idle(self, limit: float = 3600.0) -> None:
        """Fire timers one after another until none is left (or ``limit`` passed)."""
        start = self.t
        await settle()
        while (at := self.next_timer()) is not None and at - start <= limit:
            await self.advance(at - self.t)


async def settle(rounds: int = 20) -> None:
    """Let every task that can run, run (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test run in a loop of its own (the suite has no asyncio plugin)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run
