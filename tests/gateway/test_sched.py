"""The gateway's scheduler on a manual clock: limits, order, fair share, 429s."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sessiond.gateway.sched import Ask, GaveUp, Limits, Scheduler, Throttled
from tests.gateway.clock import ManualClock, aio, settle


def ask(session: str, priority: int = 0, agent: str | None = None, est: int = 10) -> Ask:
    return Ask(session, agent, priority, "p", "m", est)


class Upstream:
    """Records the order calls reach it; each answers when the test lets it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.seen: list[str] = []
        self.in_flight = 0
        self.peak = 0
        self.starts: list[float] = []
        self.gates: list[asyncio.Event] = []

    def send(self, name: str, hold: bool = False) -> Callable[[], Awaitable[str]]:
        async def go() -> str:
            self.seen.append(name)
            self.starts.append(self.clock.now())
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                if hold:
                    gate = asyncio.Event()
                    self.gates.append(gate)
                    await gate.wait()
                return name
            finally:
                self.in_flight -= 1

        return go

    async def open_all(self) -> None:
        while self.gates:
            self.gates.pop(0).set()
            await settle()


@aio
async def test_concurrency_is_never_exceeded() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=3)}, clock=clock)
    up = Upstream(clock)
    tasks = [
        asyncio.create_task(sched.call(ask(f"s{i}"), up.send(f"s{i}", True))) for i in range(10)
    ]
    await settle()
    assert up.in_flight == 3
    assert sched.snapshot()["limits"][0]["in_flight"] == 3
    await up.open_all()
    assert sorted(await asyncio.gather(*tasks)) == sorted(f"s{i}" for i in range(10))
    assert up.peak == 3


@aio
async def test_rpm_holds_calls_to_the_next_window() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(rpm=4)}, clock=clock)
    up = Upstream(clock)
    tasks = [asyncio.create_task(sched.call(ask(f"s{i}"), up.send(f"s{i}"))) for i in range(10)]
    await settle()
    assert len(up.seen) == 4
    await clock.advance(59.0)
    assert len(up.seen) == 4  # not one more within the minute
    await clock.advance(1.0)
    assert len(up.seen) == 8
    await clock.run_until_idle()
    await asyncio.gather(*tasks)
    assert len(up.seen) == 10
    assert up.starts[-1] == up.starts[0] + 120


@aio
async def test_tpm_uses_the_estimate_then_the_usage() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(tpm=1000)}, clock=clock)
    up = Upstream(clock)
    first = ask("a", est=800)
    await sched.call(first, up.send("a"))
    # the estimate holds 800 of 1000: a second call of 500 waits
    second = asyncio.create_task(sched.call(ask("b", est=500), up.send("b")))
    await settle()
    assert up.seen == ["a"]
    sched.settle(first, 300)  # it used less than estimated: room now
    await settle()
    assert await second == "b"


@aio
async def test_a_call_larger_than_the_whole_tpm_goes_alone() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(tpm=100)}, clock=clock)
    up = Upstream(clock)
    await sched.call(ask("a", est=50), up.send("a"))
    big = asyncio.create_task(sched.call(ask("b", est=5000), up.send("b")))
    await settle()
    assert up.seen == ["a"]
    await clock.run_until_idle()
    assert await big == "b"


async def _queue_behind_one(
    sched: Scheduler, up: Upstream, asks: list[tuple[str, Ask]]
) -> list[asyncio.Task[str]]:
    """One call holds the only slot; the others queue behind it in the given order."""
    tasks = [asyncio.create_task(sched.call(ask("first"), up.send("first", True)))]
    await settle()
    for name, a in asks:
        tasks.append(asyncio.create_task(sched.call(a, up.send(name, True))))
        await settle()
    return tasks


@aio
async def test_priority_order_holds() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock)
    up = Upstream(clock)
    tasks = await _queue_behind_one(
        sched, up, [("low", ask("low", 1)), ("high", ask("high", 50)), ("mid", ask("mid", 10))]
    )
    assert sched.ahead("high") == 0
    assert sched.ahead("mid") == 1
    assert sched.ahead("low") == 2
    assert sched.ahead("first") is None
    await up.open_all()
    await asyncio.gather(*tasks)
    assert up.seen == ["first", "high", "mid", "low"]


@aio
async def test_aging_lifts_a_low_priority_call_above_newer_high_ones() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock, aging=10.0)
    up = Upstream(clock)
    tasks = await _queue_behind_one(sched, up, [("old-low", ask("old-low", 0))])
    await clock.advance(35.0)  # three points of age
    tasks.append(asyncio.create_task(sched.call(ask("new", 2), up.send("new", True))))
    await settle()
    assert sched.ahead("old-low") == 0
    assert sched.ahead("new") == 1
    await up.open_all()
    await asyncio.gather(*tasks)
    assert up.seen == ["first", "old-low", "new"]


@aio
async def test_equal_priority_sessions_take_turns() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock)
    up = Upstream(clock)
    # a floods the queue before b asks at all
    asks = [(f"a{i}", ask("a")) for i in range(6)] + [(f"b{i}", ask("b")) for i in range(3)]
    tasks = await _queue_behind_one(sched, up, asks)
    await up.open_all()
    await asyncio.gather(*tasks)
    served = [n[0] for n in up.seen[1:]]
    assert served[:6] == ["a", "b", "a", "b", "a", "b"]


@aio
async def test_fair_share_is_across_agents_then_sessions() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock)
    up = Upstream(clock)
    # agent x runs three sessions, agent y one: x's three share x's half
    asks = [(f"x{s}{i}", ask(f"x{s}", agent="x")) for i in range(4) for s in "123"]
    asks += [(f"y1{i}", ask("y1", agent="y")) for i in range(6)]
    tasks = await _queue_behind_one(sched, up, asks)
    await up.open_all()
    await asyncio.gather(*tasks)
    served = up.seen[1:13]
    assert sum(1 for n in served if n.startswith("y")) == 6
    assert {n[:2] for n in served if n.startswith("x")} == {"x1", "x2", "x3"}


@aio
async def test_a_429_is_absorbed_and_retry_after_honoured() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=4)}, clock=clock, rng=random.Random(1))
    attempts: list[float] = []

    async def send() -> str:
        attempts.append(clock.now())
        if len(attempts) < 3:
            raise Throttled(retry_after=7.0)
        return "ok"

    task = asyncio.create_task(sched.call(ask("a"), send))
    await settle()
    await clock.run_until_idle()
    assert await task == "ok"
    assert attempts[1] - attempts[0] >= 7.0
    assert attempts[2] - attempts[1] >= 7.0
    snap = sched.snapshot()
    assert snap["throttled"] == 2
    assert snap["limits"][0]["throttles"] == 2


@aio
async def test_a_429_pauses_the_provider_for_every_call() -> None:
    clock = ManualClock()
    sched = Scheduler({}, clock=clock, rng=random.Random(1))
    up = Upstream(clock)
    throttled: list[float] = []

    async def first() -> str:
        if not throttled:
            throttled.append(clock.now())
            raise Throttled(retry_after=5.0, status=529)
        return "first"

    t1 = asyncio.create_task(sched.call(ask("a"), first))
    await settle()
    t2 = asyncio.create_task(sched.call(ask("b"), up.send("b")))
    await settle()
    assert up.seen == []  # the provider is paused: b waits too
    assert 5.0 <= sched.snapshot()["limits"][0]["paused_for"] <= 5.5  # Retry-After, never less
    await clock.run_until_idle()
    assert await t1 == "first"
    assert await t2 == "b"
    assert up.starts[0] >= throttled[0] + 5.0


@aio
async def test_backoff_without_retry_after_grows_then_gives_up() -> None:
    clock = ManualClock()
    sched = Scheduler({}, clock=clock, max_retries=4, rng=random.Random(2))
    attempts: list[float] = []

    async def send() -> str:
        attempts.append(clock.now())
        raise Throttled(status=529)

    task = asyncio.create_task(sched.call(ask("a"), send))
    await settle()
    await clock.run_until_idle()
    with pytest.raises(GaveUp) as caught:
        await task
    assert caught.value.last.status == 529
    assert caught.value.attempts == 5
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(gaps) == 4
    assert gaps[-1] > gaps[0]
    assert sched.snapshot()["limits"][0]["in_flight"] == 0


@aio
async def test_throttles_lower_the_learned_concurrency() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=20)}, clock=clock, rng=random.Random(3))
    allowed = 5
    up = Upstream(clock)

    def send(name: str) -> Callable[[], Awaitable[str]]:
        async def go() -> str:
            if up.in_flight >= allowed:
                raise Throttled(retry_after=1.0)
            return await up.send(name, True)()

        return go

    tasks = [asyncio.create_task(sched.call(ask(f"s{i}"), send(f"s{i}"))) for i in range(20)]
    for _ in range(60):
        await settle()
        await up.open_all()
        await clock.advance(1.5)
    assert len(await asyncio.gather(*tasks)) == 20
    assert sched.snapshot()["limits"][0]["learned_concurrency"] is not None


@aio
async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock)
    up = Upstream(clock)
    tasks = await _queue_behind_one(sched, up, [("b", ask("b")), ("c", ask("c"))])
    assert sched.ahead("c") == 1
    tasks[1].cancel()
    await settle()
    assert sched.ahead("c") == 0
    assert sched.ahead("b") is None
    await up.open_all()
    await asyncio.gather(*tasks[0::2])
    assert up.seen == ["first", "c"]


@aio
async def test_a_failing_send_frees_its_slot() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock)

    async def boom() -> Any:
        raise RuntimeError("connection reset")

    with pytest.raises(RuntimeError):
        await sched.call(ask("a"), boom)
    up = Upstream(clock)
    assert await sched.call(ask("b"), up.send("b")) == "b"


@aio
async def test_a_held_slot_is_kept_until_released() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock)
    up = Upstream(clock)
    held = await sched.open(ask("stream"), up.send("stream"))
    assert held.value == "stream"
    waiting = asyncio.create_task(sched.call(ask("b"), up.send("b")))
    await settle()
    assert up.seen == ["stream"]
    assert sched.ahead("b") == 0
    async with held:
        pass
    assert await waiting == "b"


@aio
async def test_a_model_limit_and_the_providers_both_apply() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=3), "p/m": Limits(concurrency=1)}, clock=clock)
    up = Upstream(clock)
    a = asyncio.create_task(sched.call(ask("a"), up.send("a", True)))
    b = asyncio.create_task(sched.call(ask("b"), up.send("b", True)))
    other = Ask("c", None, 0, "p", "other", 1)
    c = asyncio.create_task(sched.call(other, up.send("c", True)))
    await settle()
    assert up.seen == ["a", "c"]  # b waits for p/m; c's model has room under p
    await up.open_all()
    await asyncio.gather(a, b, c)


@aio
async def test_a_throttled_call_keeps_its_place() -> None:
    """Its backoff pauses the provider as long: no lower call passes it meanwhile."""
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=4)}, clock=clock, rng=random.Random(5))
    seen: list[str] = []

    async def high() -> str:
        seen.append("high")
        if seen.count("high") == 1:
            raise Throttled(retry_after=3.0)
        return "high"

    async def low() -> str:
        seen.append("low")
        return "low"

    first = asyncio.create_task(sched.call(ask("h", 9), high))
    await settle()
    second = asyncio.create_task(sched.call(ask("l", 1), low))
    await settle()
    await clock.run_until_idle()
    assert await first == "high"
    assert await second == "low"
    assert seen == ["high", "high", "low"]


@aio
async def test_the_queue_shows_and_keeps_the_fair_order_when_slots_free_together() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=2)}, clock=clock)
    up = Upstream(clock)
    holders = [
        asyncio.create_task(sched.call(ask(f"h{i}"), up.send(f"h{i}", True))) for i in range(2)
    ]
    await settle()
    tasks = []
    for name, session in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("b2", "b")]:
        tasks.append(asyncio.create_task(sched.call(ask(session), up.send(name, True))))
    await settle()
    shown = [q["session"] for q in sched.snapshot()["queue"]]
    assert shown == ["a", "b", "a", "b", "a"]
    assert sched.ahead("b") == 1
    for gate in up.gates[:2]:  # both slots free at once
        gate.set()
    await settle()
    assert up.seen[2:4] == ["a1", "b1"]  # not a1, a2
    await up.open_all()
    await asyncio.gather(*holders, *tasks)


@aio
async def test_nothing_is_kept_for_calls_no_tpm_counts_or_never_settled() -> None:
    clock = ManualClock()
    sched = Scheduler({"p": Limits(concurrency=2), "q": Limits(tpm=10**9)}, clock=clock)
    up = Upstream(clock)
    for i in range(3):
        await sched.call(ask(f"s{i}"), up.send(f"s{i}"))
    assert sched._unsettled == {}
    for i in range(1100):  # answered, never settled (failed upstream, say)
        await sched.call(Ask(f"t{i}", None, 0, "q", "m", 1), up.send("t"))
        await clock.advance(0.1)
    assert len(sched._unsettled) < 1100
