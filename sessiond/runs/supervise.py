"""Supervising a run: waiting on its program, and stopping it on request.

One task per run waits for the program's end, settles the run under the
session's lock, and, when wakes came while it ran, continues once for all of
them. A stop (interrupt, suspend, cancel, merge, migrate, shutdown) only asks:
the settle that follows reads why, and records the state it calls for.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sessiond.runs.context import Continues
from sessiond.runs.program import Program
from sessiond.runs.settle import Settler
from sessiond.table.sessions import Session


class Supervisor:
    """The running programs' watchers: each run's end is settled, then continued."""

    def __init__(self, settler: Settler, then: Continues) -> None:
        self.settler = settler
        self.then = then

    def watch(
        self,
        s: Session,
        program: Program,
        *,
        run_id: str,
        call_id: str | None,
        before: dict[str, bytes | None],
        wake_file: Path,
    ) -> None:
        """Supervise a started run (``s.run`` is set): its task is ``s.run.task``."""
        assert s.run is not None
        s.run.task = asyncio.create_task(
            self._supervise(
                s, program, run_id=run_id, call_id=call_id, before=before, wake_file=wake_file
            )
        )

    async def _supervise(
        self,
        s: Session,
        program: Program,
        *,
        run_id: str,
        call_id: str | None,
        before: dict[str, bytes | None],
        wake_file: Path,
    ) -> None:
        outcome = await program.wait()
        async with s.lock:
            stop = s.run.stop_requested if s.run else None
            await self.settler.settle(
                s,
                run_id=run_id,
                call_id=call_id,
                outcome=outcome,
                before=before,
                wake_file=wake_file,
            )
            if s.state == "sleeping" and s.journal.state.pending_wakes and stop is None:
                # Wakes that came while it ran: one follow-up run carries them all.
                await self.then.proceed(s, None)

    async def stop_run(self, s: Session, why: str) -> None:
        """Ask a running program to stop (SIGTERM, then SIGKILL after the grace) and
        wait until its run is recorded. The caller must not hold s.lock."""
        run = s.run
        if run is None or run.task is None:
            return
        run.stop_requested = why
        # SIGTERM now: an SDK program finishes its current tool block and stops at
        # the next stable point (its next answer says so too); SIGKILL after the grace.
        await run.program.stop(why)
        await asyncio.shield(run.task)
