"""The continuation: every run begins wake → replay → resume gate → run.

A wake is recorded first, always. Whether it continues now is decided here: a
session over its wake rate limit cools down visibly; one that runs, is
suspended or blocked keeps the wake pending; otherwise the gate is evaluated on
the replayed state and its outcome recorded. A passing gate's recovery actions
are applied (runs.recover), then the scheduler admits the run or queues it, and
a free slot later dispatches the queued ones, through the gate again. A spent
budget suspends the session (a daily one renews at 00:00 UTC).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import cast

from sessiond.codec import rfc3339
from sessiond.log.event_data import (
    BudgetExhausted,
    GateCheck,
    GateEvaluated,
    LifecycleChanged,
    WakeRequested,
)
from sessiond.log.event_records import JsonObject
from sessiond.log.store.base import Record
from sessiond.runs.context import RunContext
from sessiond.runs.recover import Recovery
from sessiond.runs.start import Starter
from sessiond.runs.workspace import workspace_hasher
from sessiond.table.gate import GateVerdict, evaluate
from sessiond.table.sessions import Session
from sessiond.table.spec import SessionSpec, under_profile


@contextlib.asynccontextmanager
async def covered(s: Session, durable: bool = False) -> AsyncIterator[None]:
    """What the block writes without a commit of its own (``durable=False``) is
    durable when it ends: a wake's events go to disk with the first commit of the
    start they lead to (the start waits for that one before its program runs), and
    otherwise with this flush, which costs nothing when that commit covered them.
    If the block fails, what it wrote is flushed all the same (best effort), as an
    acknowledged write would have been. ``durable=True``: the block's own appends
    waited already; nothing to do."""
    if durable:
        yield
        return
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            await s.journal.flush()
        raise
    await s.journal.flush()


class Continuation:
    """What decides that a run may start, and starts it when it may."""

    def __init__(self, ctx: RunContext, recovery: Recovery, starter: Starter) -> None:
        self.ctx = ctx
        self.recovery = recovery
        self.starter = starter

    async def wake(
        self,
        s: Session,
        trigger: str,
        details: JsonObject,
        paths: frozenset[str] = frozenset(),
        *,
        durable: bool = True,
    ) -> Record:
        """Record a wake; continue now if the session is idle and has a program.

        A session that runs, is suspended or blocked keeps the wake pending: it
        runs once when the session is free again (one follow-up carries them all).
        ``durable=False`` (a ``send``'s message wake): the wake is written without a
        commit of its own and made durable with the first one of what it starts (the
        run's intent, docs/design.md section 9) or, when nothing starts, before this
        returns: the caller acknowledges it only then.
        """
        async with s.lock, covered(s, durable):
            record = await self.ctx.table.append(
                s, WakeRequested(trigger=trigger, details=details), durable=durable
            )
            await self._continue(s, record, trigger, paths)
        return record

    async def _continue(
        self, s: Session, record: Record, trigger: str, paths: frozenset[str]
    ) -> None:
        if trigger not in ("manual", "approval", "resolve", "restart"):
            end = self.ctx.scheduler.rate_limited(s, self.ctx.store.clock() / 1e9)
            if end is not None:
                await self._cool_down(s, end)
                return
        idle = s.state in ("created", "sleeping", "ready") and s.run is None
        queued = s.name in self.ctx.scheduler.queue
        if idle and not queued and s.spec is not None and s.spec.run is not None:
            await self.proceed(s, record, paths)

    async def continue_turn(self, s: Session) -> None:
        """After a restart: a turn the crash cut off, or wakes that were waiting,
        continue once, through the gate, with no new wake. The wakes still pending
        go with that run (one follow-up carries them all); none is added, so
        nothing already handled counts as new work."""
        async with s.lock:
            idle = s.state in ("created", "sleeping", "ready") and s.run is None
            queued = s.name in self.ctx.scheduler.queue
            if idle and not queued and s.spec is not None and s.spec.run is not None:
                await self.proceed(s, None)

    async def _cool_down(self, s: Session, end: float) -> None:
        """Over its [limits]: sleep visibly until ``end``, then run the recorded wakes once."""
        if s.state not in ("sleeping", "created") or s.journal.state.until is not None:
            return  # running or already cooling: the wake waits as a pending one
        until = rfc3339(int(end * 1e9))
        limits = s.spec.limits if s.spec else None
        reason = (
            f"rate limit: more than {limits.burst} wakes in {limits.interval:g}s; cooling down"
            if limits
            else "rate limit"
        )
        await self.ctx.table.append(
            s,
            LifecycleChanged.model_validate(
                {"from": s.state, "to": "sleeping", "reason": reason, "until": until}
            ),
        )
        delay = max(end - self.ctx.store.clock() / 1e9, 0.0)

        def resume() -> None:
            self.ctx.spawn(self._after_cool_down(s))

        asyncio.get_running_loop().call_later(delay, resume)

    async def _after_cool_down(self, s: Session) -> None:
        async with s.lock:
            if s.state == "sleeping" and s.journal.state.until is not None:
                await self.ctx.table.append(
                    s,
                    LifecycleChanged.model_validate(
                        {"from": "sleeping", "to": "sleeping", "reason": "cool-down over"}
                    ),
                )
                if s.journal.state.pending_wakes and s.spec is not None and s.spec.run is not None:
                    await self.proceed(s, None)

    async def gate_now(
        self, s: Session, cause: Record | None, paths: frozenset[str]
    ) -> GateVerdict:
        """Evaluate the gate on the replayed state and record the result."""
        state = s.journal.state
        # The storage checks are made here, the verdict stays a pure function.
        damaged = self.ctx.store.artifacts(s.name).verify_many(state.live_artifacts())
        verdict = evaluate(
            state,
            self._run_spec(s),  # the budget under the session's runner profile
            now=self.ctx.now(),
            hash_file=workspace_hasher(s.spec),
            cause_paths=paths,
            log_error=s.journal.log.verify(),
            check_artifact=damaged.get,
        )
        await self.ctx.table.append(
            s,
            GateEvaluated(
                ok=verdict.ok,
                checks=tuple(
                    GateCheck(name=c.name, ok=c.ok, detail=c.detail) for c in verdict.checks
                ),
                options=verdict.options,
                outcome=verdict.outcome,
            ),
            causation=cause["id"] if cause else None,
            # A passing gate is followed by what it let through; whatever that
            # records durably covers this line too (see proceed).
            durable=not verdict.ok,
        )
        return verdict

    async def proceed(
        self, s: Session, cause: Record | None, paths: frozenset[str] = frozenset()
    ) -> bool:
        """Gate, then run (the caller holds s.lock). True if the program started."""
        if self.ctx.stopping:
            return False  # the daemon is shutting down: the wakes stay pending
        if not paths:
            # A follow-up carries the wakes recorded meanwhile: the paths whose change
            # woke the session are its cause, not something held against it.
            paths = frozenset(
                p
                for w in s.journal.state.pending_wakes
                if w["trigger"] in ("watch", "dependency")
                # (a watch's or a dependency's wake names its paths: a list of strings)
                for p in cast(list[str], w["details"].get("paths", []))
            )
        verdict = await self.gate_now(s, cause, paths)
        if verdict.outcome == "suspended":
            await self._suspend_for_budget(s, verdict)
            return False
        if verdict.outcome == "blocked":
            if s.state != "blocked":
                await self.ctx.transition(
                    s, "blocked", why="block", reason="gate: " + verdict.failing()
                )
            return False
        await self.recovery.apply(s, verdict)
        if s.spec is None or s.spec.run is None:
            if s.state == "blocked":
                await self.ctx.transition(s, "sleeping", why="unblock", reason="gate ok")
            await s.journal.flush()
            return False
        running = self._running()
        if not self.ctx.scheduler.admits(s, running):
            self.ctx.scheduler.enqueue(s)
            if s.state != "ready":
                limit = self.ctx.scheduler.limit
                await self.ctx.transition(
                    s, "ready", why="queue", reason=f"queued: {len(running)} of {limit} slots busy"
                )
            await s.journal.flush()
            return False
        self.ctx.scheduler.queue.pop(s.name, None)
        # Counted as running from now on, before anything is awaited, so that
        # simultaneous wakes cannot all pass the limit.
        self.ctx.scheduler.starting.add(s.name)
        try:
            await self.starter.start(s, cause)
        except Exception:
            # The steps written without a flush were to be covered by the start's
            # durable append, which did not come: flush them now (best effort).
            with contextlib.suppress(Exception):
                await s.journal.flush()
            raise
        finally:
            self.ctx.scheduler.starting.discard(s.name)
        return True

    def _running(self) -> list[Session]:
        return [
            r for r in self.ctx.table if r.run is not None or r.name in self.ctx.scheduler.starting
        ]

    async def dispatch(self) -> None:
        """A slot came free: start the best queued sessions that may run (gate again)."""
        for s in self.ctx.scheduler.order():
            if self.ctx.stopping:
                return
            if not self.ctx.scheduler.admits(s, self._running()):
                continue
            async with s.lock:
                self.ctx.scheduler.queue.pop(s.name, None)
                # (not one a cluster node handed over meanwhile, to a node with a free slot)
                here = self.ctx.table.sessions.get(s.name) is s
                if s.state == "ready" and s.run is None and here:
                    await self.proceed(s, None)

    def _run_spec(self, s: Session) -> SessionSpec | None:
        """The spec under the session's runner profile (which may change the budget)."""
        if s.spec is None:
            return None
        return under_profile(s.spec, s.journal.state.profile, self.ctx.config.profiles)

    async def _suspend_for_budget(self, s: Session, verdict: GateVerdict) -> None:
        spec = self._run_spec(s)
        assert spec is not None
        state = s.journal.state
        detail = next(c.detail for c in verdict.checks if c.name == "budget left")
        name = detail.split(":", 1)[0]
        limit = getattr(spec.budget, name, 0)
        used = (
            state.runs_by_day.get(self.ctx.now()[:10], 0)
            if name == "runs_per_day"
            else state.tokens_in + state.tokens_out
        )
        await self.ctx.table.append(s, BudgetExhausted(budget=name, limit=limit, used=used))
        if s.state != "suspended":
            await self.ctx.transition(s, "suspended", why="suspend", reason=f"budget: {detail}")
        if name == "runs_per_day":
            self.renew_at_midnight(s)

    def renew_at_midnight(self, s: Session) -> None:
        """A daily budget renews at 00:00 UTC: pending wakes run then."""
        now = self.ctx.store.clock() / 1e9
        delay = 86400 - (now % 86400) + 1

        def renew() -> None:
            self.ctx.spawn(self._after_renewal(s))

        self.ctx.retry_timers[s.name] = asyncio.get_running_loop().call_later(delay, renew)

    async def _after_renewal(self, s: Session) -> None:
        async with s.lock:
            if s.state == "suspended" and s.journal.state.reason.startswith("budget: runs_per_day"):
                await self.ctx.transition(s, "sleeping", why="renew", reason="daily budget renewed")
                if s.journal.state.pending_wakes:
                    await self.proceed(s, None)
