"""Who gets the model next: the gateway's scheduler (the model is the CPU).

Every model call a run sends asks here for a slot before it goes upstream.

* **Limits** per provider and per ``provider/model``: ``concurrency`` (calls in
  flight), ``rpm`` (calls started in any 60 s window) and ``tpm`` (tokens in any
  60 s window: the input is estimated when the call starts and corrected by the
  reply's usage in :meth:`Scheduler.settle`). A call needs a free place in every
  limit that names it.
* **Order.** Waiting calls are served by band, highest first: the session's
  priority plus one point for every ``aging`` seconds waited, so a low-priority
  call rises above any steady flow of higher ones and never starves. Within a
  band the share is fair, as a CPU scheduler shares a core: each agent (a session
  without one is a group of its own) and each session within its agent has a
  virtual time, one unit per call served; the call of the least-served agent,
  then of its least-served session, goes first (then the oldest). A group or
  session that comes back after an idle spell starts at the virtual time of the
  last served, so it gets its share, not a burst for the time it was away.
* **Head of line.** A call that cannot start blocks the limits that refused it
  for the calls after it (a big call is not overtaken for ever by small ones);
  calls that need other limits (another provider) go on.
* **429 and 529** (:class:`Throttled` from ``send``) are absorbed here: the
  provider's limits pause until ``Retry-After`` (or an exponential backoff with
  jitter where there is none), the call goes back to its place in the queue,
  and the limit learns a lower concurrency (halved steps down, one up per
  window of successes, never above the configured one). Only when ``max_retries``
  are spent does :class:`GaveUp` reach the caller, who answers the program in
  the provider's shape.

Pure logic on an injected :class:`Clock`: the tests drive it with a manual one.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sessiond.replies import LimitUse, QueuedCall, SchedulerSnapshot

T = TypeVar("T")
V = TypeVar("V")
WINDOW = 60.0  # the rate limits' window, seconds
BACKOFF_BASE = 0.5  # the first backoff without Retry-After, seconds
BACKOFF_CAP = 30.0
# the waits' histogram (/metrics): from a millisecond to five minutes
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True)
class Limits:
    concurrency: int | None = None
    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True)
class Ask:
    """One call asking for the model."""

    session: str
    agent: str | None
    priority: int
    provider: str
    model: str
    est_tokens: int


class Throttled(Exception):
    """Raised by ``send`` when the upstream answered 429 or 529."""

    def __init__(self, retry_after: float | None = None, status: int = 429, body: Any = None):
        super().__init__(f"upstream answered {status}")
        self.retry_after = retry_after
        self.status = status
        self.body = body  # the upstream's answer, for the caller to pass on at the end


class GaveUp(Exception):
    """Every retry was throttled: ``last`` is the last 429/529."""

    def __init__(self, last: Throttled, attempts: int) -> None:
        super().__init__(f"upstream still answered {last.status} after {attempts} attempts")
        self.last = last
        self.attempts = attempts


class Handle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...
    def call_later(self, delay: float, fn: Callable[[], None]) -> Handle: ...


class LoopClock:
    """The event loop's monotonic clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Handle:
        return asyncio.get_running_loop().call_later(delay, fn)


@dataclass
class _Limiter:
    """One limit key's accounting."""

    key: str
    limits: Limits
    in_flight: int = 0
    starts: deque[float] = field(default_factory=deque)
    tokens: deque[list[float]] = field(default_factory=deque)  # [time, tokens] entries
    paused_until: float = 0.0
    learned: float | None = None  # concurrency learned from 429s
    throttles: int = 0
    calls: int = 0

    def cap(self) -> float:
        configured = self.limits.concurrency
        if self.learned is None:
            return math.inf if configured is None else configured
        return self.learned if configured is None else min(configured, self.learned)

    def prune(self, now: float) -> None:
        # the same sum as ready_at's, so a timer set for it finds the entry gone
        while self.starts and self.starts[0] + WINDOW <= now:
            self.starts.popleft()
        while self.tokens and self.tokens[0][0] + WINDOW <= now:
            self.tokens.popleft()

    def tokens_used(self) -> int:
        return int(sum(t for _, t in self.tokens))

    def ready_at(self, now: float, est: int) -> float | None:
        """None if a call of ``est`` tokens may start now; else when it might
        (math.inf: when a call in flight ends)."""
        self.prune(now)
        wait = 0.0
        if self.paused_until > now:
            wait = self.paused_until
        cap = self.cap()
        if cap != math.inf and self.in_flight >= max(1, math.floor(cap)):
            return math.inf
        rpm = self.limits.rpm
        if rpm is not None and len(self.starts) >= rpm:
            wait = max(wait, self.starts[len(self.starts) - rpm] + WINDOW)
        tpm = self.limits.tpm
        if tpm is not None and self.tokens:
            used = self.tokens_used()
            if used + est > tpm:
                # when enough of the window has expired (a call larger than the whole
                # limit goes alone, once the window is empty)
                need = used + min(est, tpm) - tpm
                freed = 0.0
                for at, n in self.tokens:
                    freed += n
                    if freed >= need:
                        wait = max(wait, at + WINDOW)
                        break
        return wait if wait > now else None


@dataclass(eq=False)
class _Waiter:
    ask: Ask
    seq: int
    since: float  # when the call first asked (kept across retries: its place)
    future: asyncio.Future[_Grant]
    not_before: float = 0.0


@dataclass(eq=False)
class _Grant:
    ask: Ask
    limiters: list[_Limiter]
    tokens: list[list[float]]  # the tpm entries charged, one per limiter with tpm
    at: float = 0.0  # when it was given
    released: bool = False


class Held(Generic[V]):
    """A slot kept after ``send`` returned (a stream): ``release()`` when it ends."""

    def __init__(self, scheduler: Scheduler, grant: _Grant, value: V) -> None:
        self._scheduler, self._grant, self.value = scheduler, grant, value

    def release(self) -> None:
        self._scheduler._release(self._grant)

    async def __aenter__(self) -> V:
        return self.value

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Scheduler:
    def __init__(
        self,
        limits: Mapping[str, Limits],
        clock: Clock | None = None,
        max_retries: int = 8,
        aging: float = 10.0,
        rng: random.Random | None = None,
    ) -> None:
        if aging <= 0:
            raise ValueError("aging must be more than 0 seconds")
        self.clock: Clock = clock or LoopClock()
        self.max_retries = max_retries
        self.aging = aging
        self.rng = rng or random.Random()
        self.limiters: dict[str, _Limiter] = {k: _Limiter(k, v) for k, v in limits.items()}
        self.waiting: list[_Waiter] = []
        # how many calls wait per session and per fair-share group (for _activate)
        self._waiting_in: dict[str, int] = {}
        self._seq = 0
        # virtual time (calls served) per group and per session, and the floors a
        # returning one starts from
        self._group_v: dict[str, float] = {}
        self._session_v: dict[str, float] = {}
        self._group_floor = 0.0
        self._session_floor: dict[str, float] = {}
        self._timer: Handle | None = None
        self._timer_at = math.inf
        self._unsettled: dict[Ask, deque[_Grant]] = {}
        self.served = 0
        self.throttled = 0
        # per provider: how long calls waited for their slot (counts per bucket, sum)
        self.waits: dict[str, tuple[list[int], list[float]]] = {}

    # --- the interface -------------------------------------------------------------

    async def call(self, ask: Ask, send: Callable[[], Awaitable[T]]) -> T:
        """Wait for a slot, run ``send`` in it, release it; retry on :class:`Throttled`."""
        held = await self.open(ask, send)
        held.release()
        return held.value

    async def open(self, ask: Ask, send: Callable[[], Awaitable[T]]) -> Held[T]:
        """As :meth:`call`, but the slot stays taken until the result's ``release()``
        (for a stream: ``send`` returns at the headers, the slot ends with the stream)."""
        since, seq = self.clock.now(), self._next_seq()
        attempt = 0
        not_before = 0.0
        while True:
            grant = await self._acquire(ask, since, seq, not_before)
            try:
                value = await send()
            except Throttled as t:
                attempt += 1
                delay = self._delay(t, attempt)
                self._throttled(grant, delay)
                if attempt > self.max_retries:
                    raise GaveUp(t, attempt) from t
                not_before = self.clock.now() + delay
                continue
            except BaseException:
                self._release(grant)
                raise
            self._succeeded(grant, since)
            return Held(self, grant, value)

    def settle(self, ask: Ask, used_tokens: int) -> None:
        """The reply's usage replaces the estimate charged against ``tpm``."""
        grants = self._unsettled.get(ask)
        if not grants:
            return
        grant = grants.popleft()
        if not grants:
            del self._unsettled[ask]
        for entry in grant.tokens:
            entry[1] = max(0, used_tokens)
        if grant.tokens:
            self._pump()  # a smaller use may let a waiting call start

    def ahead(self, session: str) -> int | None:
        """How many calls are ahead of this session's first waiting call (in its
        provider's queue); None if it has none waiting."""
        return self.positions().get(session)

    def positions(self) -> dict[str, int]:
        """Each session with a call waiting: the calls ahead of its first one."""
        out: dict[str, int] = {}
        counts: dict[str, int] = {}
        for w in self.order():
            p = w.ask.provider
            if w.ask.session not in out:
                out[w.ask.session] = counts.get(p, 0)
            counts[p] = counts.get(p, 0) + 1
        return out

    def snapshot(self) -> SchedulerSnapshot:
        """The limits, what they hold now, and the queue in order (for `sessionctl
        models`, /metrics and the console)."""
        now = self.clock.now()
        limits: list[LimitUse] = []
        for lim in self.limiters.values():
            lim.prune(now)
            cap = lim.cap()
            limits.append(
                {
                    "key": lim.key,
                    "concurrency": lim.limits.concurrency,
                    "rpm": lim.limits.rpm,
                    "tpm": lim.limits.tpm,
                    "learned_concurrency": None if lim.learned is None else int(cap),
                    "in_flight": lim.in_flight,
                    "requests_last_minute": len(lim.starts),
                    # counted only where there is a tpm to keep
                    "tokens_last_minute": lim.tokens_used() if lim.limits.tpm else None,
                    "paused_for": round(max(0.0, lim.paused_until - now), 3),
                    "calls": lim.calls,
                    "throttles": lim.throttles,
                }
            )
        queue: list[QueuedCall] = []
        counts: dict[str, int] = {}
        for w in self.order():
            p = w.ask.provider
            queue.append(
                {
                    "session": w.ask.session,
                    "agent": w.ask.agent,
                    "priority": w.ask.priority,
                    "provider": p,
                    "model": w.ask.model,
                    "waited": round(now - w.since, 3),
                    "ahead": counts.get(p, 0),
                }
            )
            counts[p] = counts.get(p, 0) + 1
        return {
            "limits": limits,
            "queue": queue,
            "served": self.served,
            "throttled": self.throttled,
            "waits": {
                p: {"buckets": list(counts), "sum": total[0]}
                for p, (counts, total) in self.waits.items()
            },
        }

    # --- order ---------------------------------------------------------------------

    def order(self) -> list[_Waiter]:
        """The waiting calls, best first: the order they would start in."""
        return list(self._ordered())

    def _ordered(self) -> Iterator[_Waiter]:
        """The waiting calls one by one, best first. The fair share is played
        forward: each call yielded counts as served for the ones after it, so two
        calls of one session do not go before another session's first."""
        now, aging = self.clock.now(), self.aging
        ranked = sorted(
            (-(w.ask.priority + math.floor(max(0.0, now - w.since) / aging)), w.seq, w)
            for w in self.waiting
        )
        queues: dict[str, deque[tuple[int, int, _Waiter]]] = {}
        for item in ranked:
            queues.setdefault(item[2].ask.session, deque()).append(item)
        groups = {s: _group(q[0][2].ask) for s, q in queues.items()}
        vg = {g: self._group_v.get(g, 0.0) for g in groups.values()}
        vs = {s: self._session_v.get(s, 0.0) for s in queues}

        def key(s: str) -> tuple[int, float, float, int]:
            band, seq, _ = queues[s][0]
            return (band, vg[groups[s]], vs[s], seq)

        while queues:
            session = min(queues, key=key)
            waiting = queues[session]
            yield waiting.popleft()[2]
            vg[groups[session]] += 1
            vs[session] += 1
            if not waiting:
                del queues[session]

    # --- the machinery -------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _limiters_of(self, ask: Ask) -> list[_Limiter]:
        # the provider's accounting always exists: a 429 pauses it even unconfigured
        out = [self.limiters.get(ask.provider) or self._new(ask.provider)]
        specific = self.limiters.get(f"{ask.provider}/{ask.model}")
        if specific is not None:
            out.append(specific)
        return out

    def _new(self, key: str) -> _Limiter:
        lim = self.limiters[key] = _Limiter(key, Limits())
        return lim

    async def _acquire(self, ask: Ask, since: float, seq: int, not_before: float) -> _Grant:
        loop = asyncio.get_running_loop()
        w = _Waiter(ask, seq, since, loop.create_future(), not_before)
        self._activate(ask)
        self._add(w)
        self._pump()
        try:
            grant = await w.future
        except BaseException:
            if w in self.waiting:
                self._remove(w)
            elif w.future.done() and not w.future.cancelled():
                self._release(w.future.result())  # granted as we were cancelled
            self._pump()
            raise
        return grant

    def _activate(self, ask: Ask) -> None:
        """A group or session coming back after an idle spell starts at the floor."""
        group = _group(ask)
        if not self._waiting_in.get(group):
            self._group_v[group] = max(self._group_v.get(group, 0.0), self._group_floor)
        if not self._waiting_in.get(ask.session):
            floor = self._session_floor.get(group, 0.0)
            self._session_v[ask.session] = max(self._session_v.get(ask.session, 0.0), floor)

    def _add(self, w: _Waiter) -> None:
        self.waiting.append(w)
        for key in (w.ask.session, _group(w.ask)):
            self._waiting_in[key] = self._waiting_in.get(key, 0) + 1

    def _remove(self, w: _Waiter) -> None:
        self.waiting.remove(w)
        for key in (w.ask.session, _group(w.ask)):
            left = self._waiting_in[key] - 1
            if left:
                self._waiting_in[key] = left
            else:
                del self._waiting_in[key]

    def _pump(self) -> None:
        """Start every waiting call that may start now, best first."""
        if not self.waiting:
            return
        now = self.clock.now()
        blocked: set[str] = set()
        providers = {w.ask.provider for w in self.waiting}
        wake = math.inf
        # the common case under load: every provider is full, nothing starts (and
        # the queue need not be ordered to know it)
        for p in providers:
            at = (self.limiters.get(p) or self._new(p)).ready_at(now, 0)
            if at is None:
                break
            blocked.add(p)
            wake = min(wake, at)
        else:
            self._arm(wake)
            return
        blocked.clear()
        wake = math.inf
        for w in self._ordered():
            if w.not_before > now:
                wake = min(wake, w.not_before)
                continue
            limiters = self._limiters_of(w.ask)
            if any(lim.key in blocked for lim in limiters):
                continue
            refused = False
            for lim in limiters:
                at = lim.ready_at(now, w.ask.est_tokens)
                if at is not None:
                    blocked.add(lim.key)
                    wake = min(wake, at)
                    refused = True
            if not refused:
                self._start(w, limiters, now)
                at = limiters[0].ready_at(now, 0)  # its provider: full now?
                if at is not None:
                    blocked.add(limiters[0].key)
                    wake = min(wake, at)
            if providers <= blocked:
                break  # every provider's limit is reached: nothing after starts now
        self._arm(wake)

    def _start(self, w: _Waiter, limiters: list[_Limiter], now: float) -> None:
        self._remove(w)
        tokens: list[list[float]] = []
        for lim in limiters:
            lim.in_flight += 1
            lim.calls += 1
            lim.starts.append(now)
            if lim.limits.tpm is not None:
                entry = [now, float(w.ask.est_tokens)]
                lim.tokens.append(entry)
                tokens.append(entry)
        group = _group(w.ask)
        gv = self._group_v.get(group, 0.0)
        sv = self._session_v.get(w.ask.session, 0.0)
        self._group_floor = max(self._group_floor, gv)
        self._session_floor[group] = max(self._session_floor.get(group, 0.0), sv)
        self._group_v[group] = gv + 1
        self._session_v[w.ask.session] = sv + 1
        grant = _Grant(w.ask, limiters, tokens, now)
        if tokens:  # a tpm counts it: its usage will correct the estimate
            if len(self._unsettled) > 1024:
                self._forget_unsettled(now)
            self._unsettled.setdefault(w.ask, deque()).append(grant)
        self.served += 1
        w.future.set_result(grant)

    def _forget_unsettled(self, now: float) -> None:
        """Calls never settled (failed, cut off) whose tokens left the window."""
        for ask in list(self._unsettled):
            grants = self._unsettled[ask]
            while grants and grants[0].at + WINDOW <= now:
                grants.popleft()
            if not grants:
                del self._unsettled[ask]

    def _arm(self, at: float) -> None:
        """One timer, for the earliest moment a blocked call might start."""
        if at == math.inf or at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.clock.call_later(max(0.0, at - self.clock.now()), self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self._pump()

    def _release(self, grant: _Grant) -> None:
        if grant.released:
            return
        grant.released = True
        for lim in grant.limiters:
            lim.in_flight -= 1
        self._pump()

    def _succeeded(self, grant: _Grant, since: float) -> None:
        """A call answered: count its wait (its last slot's, from its first ask, so
        the time it spent backing off is in it) and let the learned limits grow."""
        ask = grant.ask
        waited = max(0.0, grant.at - since)
        # one count per bucket, the last for longer waits than the last bound
        counts, total = self.waits.setdefault(ask.provider, ([0] * (len(WAIT_BUCKETS) + 1), [0.0]))
        counts[next((i for i, b in enumerate(WAIT_BUCKETS) if waited <= b), -1)] += 1
        total[0] += waited
        for lim in grant.limiters:
            if lim.learned is not None:
                lim.learned += 1 / max(1.0, lim.learned)  # additive increase
                configured = lim.limits.concurrency
                if configured is not None and lim.learned >= configured:
                    lim.learned = None

    def _throttled(self, grant: _Grant, pause: float) -> None:
        """A 429/529: pause the limits for as long as the call backs off (so no
        call passes it meanwhile: it keeps its place), lower what they allow, give
        the call's share and tokens back (it was not served), and free its slot."""
        now = self.clock.now()
        self.throttled += 1
        ask = grant.ask
        for lim in grant.limiters:
            lim.throttles += 1
            if lim.paused_until <= now:
                # multiplicative decrease from what was in flight when it answered,
                # once per pause (the other calls of the same burst answer 429 too)
                lim.learned = max(1.0, min(lim.cap(), float(lim.in_flight)) / 2)
            lim.paused_until = max(lim.paused_until, now + max(0.0, pause))
            for entry in grant.tokens:
                if entry in lim.tokens:
                    lim.tokens.remove(entry)
        grants = self._unsettled.get(ask)
        if grants and grant in grants:
            grants.remove(grant)
            if not grants:
                del self._unsettled[ask]
        group = _group(ask)
        self._group_v[group] = self._group_v.get(group, 1.0) - 1
        self._session_v[ask.session] = self._session_v.get(ask.session, 1.0) - 1
        self.served -= 1
        self._release(grant)

    def _delay(self, t: Throttled, attempt: int) -> float:
        """Retry-After honoured (never earlier); else exponential backoff with jitter."""
        if t.retry_after is not None:
            return max(0.0, t.retry_after) * (1 + 0.1 * self.rng.random())
        ceiling = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** (attempt - 1))
        return ceiling * (0.5 + 0.5 * self.rng.random())


def _group(ask: Ask) -> str:
    """The fair-share group: the agent, or the session itself where it has none."""
    return f"agent:{ask.agent}" if ask.agent else f"session:{ask.session}"
