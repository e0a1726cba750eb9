"""The runs floor, wired: one object the syscalls and the daemon talk to.

The parts depend on each other in a circle that is the point of the design: the
continuation starts runs, and a run's end continues (a follow-up for the wakes
that came meanwhile, a retry, a free slot). The circle is closed here, once:
each part that ends a run is given this facade as its ``Continues``.
"""

from __future__ import annotations

from sessiond.log.event_records import JsonObject
from sessiond.log.store.base import Record
from sessiond.runs.context import RunContext
from sessiond.runs.continuation import Continuation
from sessiond.runs.recover import Recovery
from sessiond.runs.settle import Settler
from sessiond.runs.start import Starter
from sessiond.runs.supervise import Supervisor
from sessiond.runs.tokens import Tokens
from sessiond.table.sessions import Session


class Runs:
    """Waking, gating, starting, supervising, settling and recovering session runs."""

    def __init__(self, ctx: RunContext, tokens: Tokens) -> None:
        self.ctx = ctx
        self.settler = Settler(ctx, tokens, self)
        self.supervisor = Supervisor(self.settler, self)
        self.recovery = Recovery(ctx, self.settler, self)
        self.starter = Starter(ctx, tokens, self.settler, self.supervisor)
        self.continuation = Continuation(ctx, self.recovery, self.starter)

    async def wake(
        self,
        s: Session,
        trigger: str,
        details: JsonObject,
        paths: frozenset[str] = frozenset(),
        *,
        durable: bool = True,
    ) -> Record:
        """Record a wake; continue now if the session is idle and has a program."""
        return await self.continuation.wake(s, trigger, details, paths, durable=durable)

    async def proceed(
        self, s: Session, cause: Record | None, paths: frozenset[str] = frozenset()
    ) -> bool:
        """Gate, then run (the caller holds s.lock). True if the program started."""
        return await self.continuation.proceed(s, cause, paths)

    async def dispatch(self) -> None:
        """A slot came free: start the best queued sessions that may run."""
        await self.continuation.dispatch()

    async def stop_run(self, s: Session, why: str) -> None:
        """Ask a running program to stop and wait until its run is recorded."""
        await self.supervisor.stop_run(s, why)

    def renew_at_midnight(self, s: Session) -> None:
        """A session suspended for its daily budget continues at 00:00 UTC."""
        self.continuation.renew_at_midnight(s)

    async def recover_cut_off_runs(self) -> list[Session]:
        """At start-up: record the runs a crash cut off; the sessions to continue."""
        return await self.recovery.cut_off_runs()

    async def continue_turn(self, s: Session) -> None:
        """At start-up: continue once, through the gate, with no new wake."""
        await self.continuation.continue_turn(s)
