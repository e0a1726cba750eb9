"""What `sessionctl models`, ps/show and /metrics read of the gateway's scheduler."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from sessiond.gateway.sched import Ask, Scheduler, Throttled
from sessiond.gateway.view import QueueView, limits_of
from sessiond.syscalls.models import waiting_text
from sessiond.web.model_metrics import ModelCollector
from tests.gateway.clock import ManualClock, aio, settle

LIMITS = SimpleNamespace(concurrency=None, rpm=30, tpm=None)
PROVIDER = SimpleNamespace(
    name="up", kind="anthropic", base_url="http://127.0.0.1:9", models=["claude-*"],
    concurrency=1, rpm=None, tpm=1000, limits={"claude-x": LIMITS},
    price_in=3.0, price_out=15.0,
)  # fmt: skip


@aio
async def test_the_view_shows_limits_use_queue_and_waits() -> None:
    clock = ManualClock()
    limits = limits_of([PROVIDER])
    assert set(limits) == {"up", "up/claude-x"}
    sched = Scheduler(limits, clock=clock)
    view = QueueView(sched, lambda: [PROVIDER])
    gate = asyncio.Event()
    tries: list[int] = []

    async def hold() -> None:
        if not tries:
            tries.append(1)
            raise Throttled(retry_after=2.0)
        await gate.wait()

    async def quick() -> None:
        pass

    first = asyncio.create_task(sched.call(Ask("a", None, 5, "up", "claude-x", 10), hold))
    await settle()
    await clock.advance(2.5)  # the 429's pause is over: a's call is in flight again
    others = [
        asyncio.create_task(sched.call(Ask(n, "w", 1, "up", "claude-y", 10), quick))
        for n in ("b", "c")
    ]
    await settle()
    assert view.positions() == {"b": 0, "c": 1}
    assert waiting_text(1) == "waiting for model: 1 ahead"
    shown = view.models_view()
    (p,) = shown["providers"]
    assert p["in_flight"] == 1
    assert p["concurrency"] == 1
    assert p["throttles"] == 1
    assert p["model_limits"][0]["key"] == "up/claude-x"
    assert p["model_limits"][0]["rpm"] == 30
    assert [q["session"] for q in shown["queue"]] == ["b", "c"]
    assert shown["throttled"] == 1

    registry = CollectorRegistry()
    registry.register(ModelCollector(view.models_view))
    text = generate_latest(registry).decode()
    assert 'sessiond_model_queue_depth{provider="up"} 2.0' in text
    assert 'sessiond_model_throttles_total{provider="up"} 1.0' in text
    assert 'sessiond_model_in_flight{provider="up"} 1.0' in text
    gate.set()
    await asyncio.gather(first, *others)
    text = generate_latest(registry).decode()
    assert 'sessiond_model_wait_seconds_count{provider="up"} 3.0' in text
    assert 'sessiond_model_queue_depth{provider="up"} 0.0' in text


def test_no_gateway_no_figures_but_the_names() -> None:
    registry = CollectorRegistry()
    registry.register(ModelCollector(lambda: None))
    text = generate_latest(registry).decode()
    assert "sessiond_model_queue_depth" in text
    assert 'provider="' not in text
