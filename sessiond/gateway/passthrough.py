"""A pass-through scheduler and budgets with the interface of ``gateway.sched`` and
``gateway.budgets``: every call goes at once, nothing is refused. The gateway uses
them until the real ones are in place (then this module goes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    concurrency: int | None = None
    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True)
class Ask:
    session: str
    agent: str | None
    priority: int
    provider: str
    model: str
    est_tokens: int


class Throttled(Exception):
    def __init__(self, retry_after: float | None = None, status: int = 429, body: Any = None):
        super().__init__(f"upstream answered {status}")
        self.retry_after = retry_after
        self.status = status
        self.body = body


class GaveUp(Exception):
    def __init__(self, last: Throttled, attempts: int) -> None:
        super().__init__(f"upstream still answered {last.status} after {attempts} attempts")
        self.last = last
        self.attempts = attempts


class Held(Generic[T]):
    def __init__(self, value: T) -> None:
        self.value = value

    def release(self) -> None:
        pass


class Scheduler:
    def __init__(self, limits: Mapping[str, Limits], **_: Any) -> None:
        self.limits = dict(limits)

    async def open(self, _ask: Ask, send: Callable[[], Awaitable[T]]) -> Held[T]:
        try:
            return Held(await send())
        except Throttled as t:
            raise GaveUp(t, 1) from t

    def settle(self, *_: Any) -> None:
        pass

    def ahead(self, *_: Any) -> int | None:
        return None

    def snapshot(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class Refusal:
    budget: str
    limit: float
    used: float
    message: str


class Budgets:
    def check(self, *_: Any, **__: Any) -> Refusal | None:
        return None

    def charge(self, *_: Any, **__: Any) -> None:
        pass
