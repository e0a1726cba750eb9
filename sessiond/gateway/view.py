"""The gateway as ``sessionctl models``, ``ps``/``show``, the console and /metrics see it.

:class:`QueueView` is the daemon's :class:`sessiond.syscalls.models.ModelsSource`:
the configured providers beside what the scheduler holds for each (calls in
flight, requests and tokens in the last minute, a pause after a 429, the
throttles), and the calls waiting, best first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sessiond.gateway.sched import WAIT_BUCKETS, Limits, Scheduler
from sessiond.replies import LimitUse, ModelsView, ProviderUse


def limits_of(providers: Iterable[Any]) -> dict[str, Limits]:
    """The scheduler's limits from ``[[model.provider]]``: per provider (its own
    ``concurrency``/``rpm``/``tpm``), and per ``provider/model`` (its ``limits``)."""
    out: dict[str, Limits] = {}
    for p in providers:
        out[p.name] = Limits(p.concurrency, p.rpm, p.tpm)
        for model, lim in (getattr(p, "limits", None) or {}).items():
            out[f"{p.name}/{model}"] = Limits(lim.concurrency, lim.rpm, lim.tpm)
    return out


class QueueView:
    def __init__(self, scheduler: Scheduler, providers: Callable[[], Iterable[Any]]) -> None:
        self.scheduler = scheduler
        self.providers = providers  # read at each call: a reload may change them

    def positions(self) -> dict[str, int]:
        return self.scheduler.positions()

    def models_view(self) -> ModelsView:
        snap = self.scheduler.snapshot()
        by_key = {lim["key"]: lim for lim in snap["limits"]}
        providers: list[ProviderUse] = []
        for p in self.providers():
            name = p.name
            held = by_key.get(name) or _idle(name, p)
            models = [
                by_key.get(f"{name}/{m}") or _idle(f"{name}/{m}", lim)
                for m, lim in (getattr(p, "limits", None) or {}).items()
            ]
            providers.append(
                {
                    **held,
                    "name": name,
                    "kind": p.kind,
                    "base_url": p.base_url,
                    "models": list(p.models),
                    "price_in": p.price_in,
                    "price_out": p.price_out,
                    "model_limits": models,
                }
            )
        return {
            "providers": providers,
            "queue": snap["queue"],
            "served": snap["served"],
            "throttled": snap["throttled"],
            "waits": snap["waits"],  # per provider, for /metrics (WAIT_BUCKETS)
            "wait_buckets": list(WAIT_BUCKETS),
        }


def _idle(key: str, lim: Any) -> LimitUse:
    """A limit the scheduler has not used yet."""
    return {
        "key": key,
        "concurrency": lim.concurrency,
        "rpm": lim.rpm,
        "tpm": lim.tpm,
        "learned_concurrency": None,
        "in_flight": 0,
        "requests_last_minute": 0,
        "tokens_last_minute": 0 if lim.tpm else None,
        "paused_for": 0.0,
        "calls": 0,
        "throttles": 0,
    }
