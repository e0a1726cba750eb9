"""/metrics for the model gateway: the queue, the calls in flight, the waits and
the throttles, per provider, read from the gateway at each scrape (so they are
never stale and need no listener wired in order)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from sessiond.replies import ModelsView


class ModelCollector(Collector):
    def __init__(self, view: Callable[[], ModelsView | None]) -> None:
        self.view = view  # the gateway's models_view, or None where it runs none

    def collect(self) -> Iterator[Any]:
        view: ModelsView = self.view() or {"providers": [], "queue": [], "served": 0,
                                           "throttled": 0}  # fmt: skip
        depth = GaugeMetricFamily(
            "sessiond_model_queue_depth", "Model calls waiting for a slot", labels=["provider"]
        )
        in_flight = GaugeMetricFamily(
            "sessiond_model_in_flight", "Model calls sent and not answered", labels=["provider"]
        )
        throttles = CounterMetricFamily(
            "sessiond_model_throttles",
            "429/529 answers absorbed by the gateway (retried, never passed on while "
            "retries remain)",
            labels=["provider"],
        )
        calls = CounterMetricFamily(
            "sessiond_model_calls", "Model calls sent upstream", labels=["provider"]
        )
        waiting: dict[str, int] = {}
        for q in view["queue"]:
            waiting[q["provider"]] = waiting.get(q["provider"], 0) + 1
        for p in view["providers"]:
            name = p["name"]
            depth.add_metric([name], waiting.get(name, 0))
            in_flight.add_metric([name], p.get("in_flight", 0))
            throttles.add_metric([name], p.get("throttles", 0))
            calls.add_metric([name], p.get("calls", 0))
        yield from (depth, in_flight, throttles, calls)
        waits = HistogramMetricFamily(
            "sessiond_model_wait_seconds",
            "How long a model call waited in the gateway's queue for its slot",
            labels=["provider"],
        )
        bounds = view.get("wait_buckets") or []
        for provider, w in sorted(view.get("waits", {}).items()):
            running, buckets = 0, []
            for bound, n in zip(bounds, w["buckets"], strict=False):
                running += n
                buckets.append((_le(bound), running))
            buckets.append(("+Inf", sum(w["buckets"])))
            waits.add_metric([provider], buckets, w["sum"])
        yield waits


def _le(bound: float) -> str:
    return f"{bound:g}" if bound < 1 else f"{bound:.1f}"
