"""Properties of the gateway's scheduler under random load (manual clock)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from sessiond.gateway.sched import Ask, Limits, Scheduler
from tests.gateway.clock import ManualClock, settle

CALL = st.tuples(
    st.integers(0, 5),  # session
    st.integers(0, 3),  # priority
    st.floats(0, 30),  # arrives after the previous one, seconds
    st.floats(0.1, 20),  # takes, seconds
    st.integers(1, 400),  # estimated tokens
)


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


@given(
    calls=st.lists(CALL, min_size=1, max_size=40),
    concurrency=st.integers(1, 6),
    rpm=st.integers(1, 12),
    tpm=st.integers(400, 3000),
)
def test_limits_hold_in_every_window(
    calls: list[tuple[int, int, float, float, int]], concurrency: int, rpm: int, tpm: int
) -> None:
    async def go() -> None:
        clock = ManualClock()
        sched = Scheduler({"p": Limits(concurrency, rpm, tpm)}, clock=clock)
        starts: list[float] = []
        tokens: list[tuple[float, int]] = []
        state = {"in_flight": 0, "peak": 0}

        def send(takes: float, used: int) -> object:
            async def go() -> None:
                starts.append(clock.now())
                tokens.append((clock.now(), used))
                state["in_flight"] += 1
                state["peak"] = max(state["peak"], state["in_flight"])
                done = asyncio.Event()
                clock.call_later(takes, done.set)
                await done.wait()
                state["in_flight"] -= 1

            return go

        async def one(a: Ask, takes: float) -> None:
            await sched.call(a, send(takes, a.est_tokens))  # type: ignore[arg-type]
            sched.settle(a, a.est_tokens)

        tasks = []
        for session, priority, gap, takes, est in calls:
            await clock.advance(gap)
            a = Ask(f"s{session}", None, priority, "p", "m", est)
            tasks.append(asyncio.create_task(one(a, takes)))
            await settle()
        while not all(t.done() for t in tasks):
            await clock.run_until_idle()
            await settle()
        for t in tasks:
            t.result()
        assert state["peak"] <= concurrency
        assert len(starts) == len(calls)
        for i in range(len(starts) - rpm):
            assert starts[i + rpm] - starts[i] >= 60.0 - 1e-9
        for at, _ in tokens:
            window = [n for t, n in tokens if t <= at < t + 60.0]
            # a call bigger than the whole limit goes alone in its window
            assert sum(window) <= tpm or len(window) == 1

    run(go())


@given(queued=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3)), min_size=2, max_size=30))
def test_priority_order_and_equal_shares(queued: list[tuple[int, int]]) -> None:
    """Calls queued together are served by priority, and within a priority the
    session served least so far goes first (so equal sessions take turns)."""

    async def go() -> None:
        clock = ManualClock()
        sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock, aging=1e9)
        seen: list[tuple[int, int]] = []
        gate = asyncio.Event()

        async def hold() -> None:
            await gate.wait()

        first = asyncio.create_task(sched.call(Ask("h", None, 0, "p", "m", 1), hold))
        await settle()
        tasks = []
        for session, priority in queued:

            async def send(s: int = session, p: int = priority) -> None:
                seen.append((p, s))

            a = Ask(f"s{session}", None, priority, "p", "m", 1)
            tasks.append(asyncio.create_task(sched.call(a, send)))
        await settle()
        gate.set()
        await asyncio.gather(first, *tasks)
        priorities = [p for p, _ in seen]
        assert priorities == sorted(priorities, reverse=True)
        # the least served session (over every band) goes first
        total: dict[int, int] = {}
        for i, (p, s) in enumerate(seen):
            waiting = {x for q, x in seen[i:] if q == p}
            assert all(total.get(s, 0) <= total.get(y, 0) for y in waiting)
            total[s] = total.get(s, 0) + 1

    run(go())


@given(
    queued=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(["x", "y", None])), min_size=2, max_size=30
    )
)
def test_agents_share_first_then_their_sessions(queued: list[tuple[int, str | None]]) -> None:
    """At equal priority the least served agent (a session without one is its own
    group) goes first, then its least served session."""

    async def go() -> None:
        clock = ManualClock()
        sched = Scheduler({"p": Limits(concurrency=1)}, clock=clock, aging=1e9)
        seen: list[tuple[str, str]] = []
        gate = asyncio.Event()

        async def hold() -> None:
            await gate.wait()

        first = asyncio.create_task(sched.call(Ask("h", None, 0, "p", "m", 1), hold))
        await settle()
        agent_of: dict[str, str | None] = {}
        tasks = []
        for session, asked_agent in queued:
            name = f"s{session}"
            agent = agent_of.setdefault(name, asked_agent)  # a session has one agent
            group = f"a:{agent}" if agent else f"s:{name}"

            async def send(g: str = group, s: str = name) -> None:
                seen.append((g, s))

            tasks.append(asyncio.create_task(sched.call(Ask(name, agent, 0, "p", "m", 1), send)))
        await settle()
        gate.set()
        await asyncio.gather(first, *tasks)
        groups: dict[str, int] = {}
        sessions: dict[str, int] = {}
        for i, (g, s) in enumerate(seen):
            waiting = seen[i:]
            assert all(groups.get(g, 0) <= groups.get(h, 0) for h, _ in waiting)
            assert all(sessions.get(s, 0) <= sessions.get(t, 0) for h, t in waiting if h == g)
            groups[g] = groups.get(g, 0) + 1
            sessions[s] = sessions.get(s, 0) + 1

    run(go())
