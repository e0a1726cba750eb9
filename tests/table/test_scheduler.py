"""The scheduler's logic: limits, priority with aging, rate limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessiond.table.scheduler import Scheduler
from sessiond.table.sessions import Session
from sessiond.table.spec import parse_spec


def session(name: str, priority: int = 0, agent: str = "", limits: str = "") -> Session:
    spec = parse_spec(
        f'name = "{name}"\npriority = {priority}\nagent = "{agent}"\n{limits}', base=Path("/")
    )
    return Session(name, None, spec)


def test_the_total_and_per_agent_limits_are_kept() -> None:
    sched = Scheduler(max_running=2, per_agent=1, aging=60)
    a1, a2, b1 = session("a1", agent="a"), session("a2", agent="a"), session("b1", agent="b")
    assert sched.admits(a1, [])
    assert not sched.admits(a2, [a1])  # one per agent
    assert sched.admits(b1, [a1])
    assert not sched.admits(b1, [a1, session("c", agent="c")])  # two in all


def test_priority_first_then_aging_lets_the_low_one_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = {"now": 1000.0}
    monkeypatch.setattr("sessiond.table.scheduler.time.monotonic", lambda: clock["now"])
    sched = Scheduler(max_running=1, per_agent=0, aging=10)
    low = session("low", priority=0)
    sched.enqueue(low)
    clock["now"] += 25  # low has waited 25 s: worth 2.5 points
    high = session("high", priority=2)
    sched.enqueue(high)
    assert [s.name for s in sched.order()] == ["low", "high"]
    higher = session("higher", priority=5)
    sched.enqueue(higher)
    assert sched.order()[0].name == "higher"


def test_more_wakes_than_the_burst_start_a_cool_down() -> None:
    sched = Scheduler(max_running=1, per_agent=0, aging=60)
    s = session("s", limits='[limits]\nburst = 2\ninterval = "10s"\ncool_down = "30s"\n')
    results: list[Any] = [sched.rate_limited(s, t) for t in (100.0, 101.0)]
    assert results == [None, None]
    assert sched.rate_limited(s, 102.0) == 132.0  # the third within 10 s
    assert sched.rate_limited(s, 110.0) == 132.0  # still cooling
    assert sched.rate_limited(s, 133.0) is None  # over
    assert sched.rate_limited(s, 200.0) is None  # old wakes left the window
