"""Settling a run: recording how it ended and deciding what the session does next.

A run ends in one of three ways: its program exits (supervised), it could not
start, or its start could not be recorded. All three settle here, once: the
command's ``tool.finished`` and observation, ``run.finished``, then the
lifecycle step its end calls for (a requested stop, the program's own exit
intent, a retry with backoff, sleep, completion, a block). When the log cannot
take the end (a full disk), the session is held blocked in memory until it can.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import structlog

from sessiond.log.event_data import (
    ArtifactRef,
    BudgetExhausted,
    ObservationProjected,
    RunFinished,
    ToolFinished,
)
from sessiond.log.store.base import Draft
from sessiond.redaction import Redactor
from sessiond.runs.context import Continues, RunContext
from sessiond.runs.program import Outcome
from sessiond.runs.tokens import Tokens
from sessiond.runs.workspace import read_in, text_diff, workspace_hasher
from sessiond.table import lifecycle
from sessiond.table.gate import rerun_refusal
from sessiond.table.recovery import RUN_FAILED
from sessiond.table.sessions import Session
from sessiond.table.spec import SessionSpec

log = structlog.get_logger(__name__)

RETRY_CAP = 300.0  # seconds: exponential backoff stops growing here


class Settler:
    """Finishing runs: their record, the freed slot and token, the session's next state."""

    def __init__(self, ctx: RunContext, tokens: Tokens, then: Continues) -> None:
        self.ctx = ctx
        self.tokens = tokens
        self.then = then

    async def settle(
        self,
        s: Session,
        *,
        run_id: str,
        call_id: str | None,
        outcome: Outcome,
        before: dict[str, bytes | None],
        wake_file: Path,
    ) -> None:
        """Record a run's end and free everything it held, whether it ran or never started."""
        ctx = self.ctx
        try:
            await self._finish(s, run_id, call_id, outcome, before)
        except Exception as exc:  # never leave a session `running` with no program
            log.exception("run.finish_failed", session=s.name, run=run_id)
            await self._record_broken_finish(s, run_id, exc)
        finally:
            s.run = None
            wake_file.unlink(missing_ok=True)
            self.tokens.end_run(s, run_id)  # its SDK token dies with it
            if ctx.triggers is not None:
                ctx.triggers.run_ended(s)
            if ctx.scheduler.queue:  # the slot is free: queued sessions may start
                ctx.spawn(self.then.dispatch())

    async def _finish(
        self,
        s: Session,
        run_id: str,
        call_id: str | None,
        outcome: Outcome,
        before: dict[str, bytes | None],
    ) -> None:
        ctx = self.ctx
        spec = s.spec
        assert spec is not None
        assert spec.run is not None
        artifacts = ctx.store.artifacts(s.name)
        loop = asyncio.get_running_loop()

        # The spec's patterns, the run's secrets and token, and any live run token
        # (a program may print another's SESSIOND_TOKEN): never in an artifact.
        redactor = Redactor(spec.redact, [*s.masked, *self.tokens.grants])

        async def put(data: bytes, name: str) -> ArtifactRef | None:
            if not data:
                return None
            clean = redactor.data(data)
            return await loop.run_in_executor(None, artifacts.put, clean, name, "text/plain")

        stdout = await put(outcome.stdout, "stdout")
        stderr = await put(outcome.stderr, "stderr")
        truncated = outcome.stdout_total > len(outcome.stdout)
        recorded = s.journal.state.calls.get(call_id) if call_id is not None else None
        if call_id is not None and recorded is not None and recorded["stage"] == "started":
            hasher = workspace_hasher(spec)
            diff = await put(text_diff(before, spec.workspace), "diff")
            status = {"ok": "ok", "interrupted": "interrupted", "killed": "interrupted"}.get(
                outcome.status, "error"
            )
            await ctx.table.append(
                s,
                ToolFinished(
                    call=call_id,
                    tool="command",
                    status=status,
                    exit_code=outcome.exit_code,
                    error_class=None
                    if status == "ok"
                    else ("lifecycle" if status == "interrupted" else "execution"),
                    hashes={p: hasher(p) for p in spec.run.writes},
                    output=stdout,
                    diff=diff,
                    truncated=truncated,
                    limit=len(outcome.stdout) if truncated else None,
                    duration_ms=outcome.duration_ms,
                ),
                correlation=call_id,
            )
            ctx.faults.point("after-finished")
            await ctx.table.append(
                s,
                ObservationProjected(
                    call=call_id, tool="command", text=_observation(outcome, before, spec, redactor)
                ),
                correlation=call_id,
            )
            ctx.faults.point("after-observation")  # test only: the call closed, the run not
        ends_turn = self._ends_turn(s, outcome)
        if ends_turn:
            await self._close_unstarted(s)
        elif outcome.status == "ok" and self._left_a_step(s):
            # Exit 0 in the middle of a step is no end: counted as a failure, so the
            # turn is retried with backoff and only ``retries`` times, never in a loop.
            outcome = replace(outcome, status="failed", error="exit 0 with a step unfinished")
        notes = []
        if truncated:
            notes.append(f"stdout cut at {len(outcome.stdout)} of {outcome.stdout_total} bytes")
        if outcome.stderr_total > len(outcome.stderr):
            notes.append(f"stderr cut at {len(outcome.stderr)} of {outcome.stderr_total} bytes")
        if outcome.error:
            notes.append(outcome.error)
        await ctx.table.append(
            s,
            RunFinished(
                run=run_id,
                status=outcome.status,
                exit_code=outcome.exit_code,
                signal=outcome.signal,
                duration_ms=outcome.duration_ms,
                stdout=stdout,
                stderr=stderr,
                error="; ".join(notes),
                ends_turn=ends_turn,
            ),
        )
        log.info("run.finished", session=s.name, run=run_id, status=outcome.status)
        ctx.faults.point("after-run-finished")  # the run's end on record, not what follows
        await self._after_finish(s, outcome)

    # --- the turn (docs/design.md section 8) ----------------------------------------------

    def _ends_turn(self, s: Session, outcome: Outcome) -> bool:
        """A run ends its turn only by ``run.sleep()`` / ``run.complete()``, or by exit 0
        with no stop requested, no approval pending and no step left started. Any
        other end (an approval to wait for, a crash, a stop at a stable point, a failure
        to retry) leaves the turn open: a later run continues it."""
        if outcome.status != "ok":
            return False
        if s.spec is not None and s.spec.run is not None and s.spec.run.kind == "command":
            # A command is its turn's one step: exit 0 finished it, whatever stop was
            # asked meanwhile (a shutdown racing its end). Left open, the turn's
            # follow-up would run the whole command again (found by the kill -9 campaign).
            return True
        grant = self.tokens.grant_of(s)
        if grant is not None and grant.exit_intent:
            stop = s.run.stop_requested if s.run else None
            # the program's own word wins over a question it chose not to wait for
            return stop is None or stop.startswith("approval pending")
        state = s.journal.state
        stop = s.run.stop_requested if s.run else None
        return stop is None and not state.pending_approvals() and not state.in_flight()

    def _left_a_step(self, s: Session) -> bool:
        """The program exited with a step started and not finished, of its own accord
        (no stop was asked, no approval waits)."""
        state = s.journal.state
        stop = s.run.stop_requested if s.run else None
        return stop is None and not state.pending_approvals() and bool(state.in_flight())

    async def _close_unstarted(self, s: Session) -> None:
        """A turn that ends leaves nothing half-asked: calls never started (and their
        questions) are closed, so no later turn runs them on an old approval."""
        drafts = [
            Draft(
                ObservationProjected(
                    call=k,
                    tool=c["tool"],
                    text=f"{c['tool']} was not run: the turn ended before it started",
                    source="discarded",
                ),
                correlation=k,
            )
            for k, c in sorted(s.journal.state.calls.items())
            if c["stage"] in ("intent", "decided", "approval", "approved")
        ]
        if drafts:
            await self.ctx.table.append_many(s, drafts, durable=False)

    # --- a run's end the log could not take -----------------------------------------

    async def _record_broken_finish(self, s: Session, run_id: str, exc: Exception) -> None:
        """Recording a run's end failed part way: record what can be, and block.

        When even that cannot be written (a full disk), the session is held blocked
        in memory, never left `running` with no program, and the block is recorded
        as soon as the log takes writes again. Until then nothing else is appended.
        """
        reason = f"the end of run {run_id} could not be recorded: {exc}"
        try:
            await self._block_recorded(s, run_id, reason)
        except Exception as again:
            s.held = _held(reason, again)
            log.error("session.held", session=s.name, run=run_id, reason=s.held)
            self.ctx.spawn(self._record_hold(s, run_id, reason))

    async def _block_recorded(self, s: Session, run_id: str, reason: str) -> None:
        journal = s.journal
        if journal.state.current_run is not None:
            await journal.append(
                RunFinished(run=run_id, status="failed", error=reason, ends_turn=False)
            )
        if journal.state.state in ("running", "ready"):
            change = lifecycle.change(
                s.name, journal.state.state, "blocked", why="block", reason=reason
            )
            await journal.append(change)
            self.ctx.scheduler.queue.pop(s.name, None)

    async def _record_hold(self, s: Session, run_id: str, reason: str) -> None:
        """Retry recording a held block, 1 s then up to every 30 s, until it is written."""
        delay = 1.0
        while s.held is not None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
            async with s.lock:
                try:
                    await self._block_recorded(s, run_id, reason)
                except Exception as exc:
                    s.held = _held(reason, exc)
                    continue
                s.held = None
                log.info("session.hold_recorded", session=s.name, run=run_id)

    # --- what the session does next -------------------------------------------------

    async def _after_finish(self, s: Session, outcome: Outcome) -> None:
        ctx = self.ctx
        transition = ctx.transition
        stop = s.run.stop_requested if s.run else None
        grant = self.tokens.grant_of(s)
        ended = s.journal.state.turn is None
        if grant is not None and grant.exit_intent and outcome.status == "ok" and ended:
            if grant.exit_intent == "complete":
                await transition(
                    s,
                    "terminated",
                    why="complete",
                    reason=f"completed: {grant.summary}" if grant.summary else "completed",
                    outcome="completed",
                )
            else:
                await transition(s, "sleeping", why="sleep", reason="the program chose to sleep")
            return
        if stop is not None and stop.startswith("approval pending") and stop != "cancel":
            if s.journal.state.pending_approvals():
                await transition(s, "blocked", why="ask", reason=stop)
            else:  # answered while the program was still finishing: the turn goes on
                await transition(s, "sleeping", why="sleep", reason="approval answered")
                ctx.spawn(self.then.wake(s, "approval", {"answered": "during the run"}))
            return
        if stop is not None and stop.startswith("divergence"):
            gate = s.journal.state.last_gate
            checks = gate["checks"] if gate else []
            detail = next((c["detail"] for c in checks if not c["ok"]), stop)
            await transition(s, "blocked", why="block", reason=f"gate: steps match: {detail}")
            return
        if stop == "cancel":
            await transition(s, "terminated", why="cancel", reason="cancelled", outcome="cancelled")
        elif stop == "suspend":
            await transition(s, "suspended", why="suspend", reason="suspended by request")
        elif stop in ("interrupt", "shutdown"):
            why = "interrupted" if stop == "interrupt" else "interrupted by daemon shutdown"
            await transition(s, "sleeping", why="interrupt", reason=why)
        elif stop in ("merge", "migrate"):
            # the caller terminates it; if that fails, it must not stay `running`
            await transition(s, "sleeping", why="stop", reason=f"stopped for {stop}")
        elif stop is not None and stop.startswith("budget"):
            await transition(s, "suspended", why="suspend", reason=stop)
        elif s.state == "running":
            await self.after_run(s, outcome)

    async def after_run(self, s: Session, outcome: Outcome) -> None:
        """A run ended on its own: sleep, complete, suspend for budget, retry or block."""
        ctx = self.ctx
        spec = s.spec
        assert spec is not None
        assert spec.run is not None
        code = outcome.exit_code
        text = (
            "exit 0"
            if outcome.status == "ok"
            else outcome.status + (f" (exit {code})" if code is not None else "")
        )
        if outcome.status != "ok" and outcome.error:
            text += f": {outcome.error}"  # why, where the daemon knows it
        if outcome.status == "ok":
            if spec.has_triggers or s.journal.state.pending_wakes:
                await ctx.transition(s, "sleeping", why="sleep", reason=f"last run: {text}")
            else:
                await ctx.transition(
                    s, "terminated", why="complete", reason=f"done: {text}", outcome="completed"
                )
            return
        if (
            outcome.status == "timeout"
            and spec.budget.seconds_per_run
            and outcome.duration_ms >= spec.budget.seconds_per_run * 1000
        ):
            await ctx.table.append(
                s,
                BudgetExhausted(
                    budget="seconds_per_run",
                    limit=spec.budget.seconds_per_run,
                    used=outcome.duration_ms // 1000,
                ),
            )
            await ctx.transition(
                s,
                "suspended",
                why="suspend",
                reason=f"budget: seconds_per_run {spec.budget.seconds_per_run}s used up",
            )
            return
        failures = s.journal.state.failures_in_a_row
        refusal = (
            rerun_refusal(
                {
                    "side_effect": spec.run.side_effect,
                    "idempotency": spec.run.idempotency,
                    "resume": spec.run.resume,
                },
                {},
                lambda _p: None,
                "the command failed",
            )
            if spec.run.kind == "command"
            else None
        )
        if refusal is not None:
            # A retry would run the command a second time: only a person may decide that.
            await ctx.transition(
                s,
                "blocked",
                why="block",
                reason=f"{RUN_FAILED} ({text}); not retried: {refusal}; "
                f"'sessionctl resolve {s.name} --rerun' runs it again, '--discard' drops it",
            )
            return
        if failures <= spec.run.retries:
            delay = min(2.0 ** (failures - 1), RETRY_CAP)
            await ctx.transition(
                s,
                "sleeping",
                why="retry",
                reason=f"run failed: {text}; retry {failures} of {spec.run.retries} in {delay:g}s",
            )
            self._schedule_retry(s, delay, failures)
            return
        await ctx.transition(
            s,
            "blocked",
            why="block",
            reason=f"{RUN_FAILED} {_times(failures)} (last: {text}); fix it, then "
            f"'sessionctl resolve {s.name} --rerun' (or '--discard' to give the turn up)",
        )

    def _schedule_retry(self, s: Session, delay: float, attempt: int) -> None:
        ctx = self.ctx

        def fire() -> None:
            ctx.retry_timers.pop(s.name, None)
            ctx.spawn(self.then.wake(s, "retry", {"attempt": attempt}))

        old = ctx.retry_timers.pop(s.name, None)
        if old is not None:
            old.cancel()
        ctx.retry_timers[s.name] = asyncio.get_running_loop().call_later(delay, fire)


def _observation(
    outcome: Outcome, before: dict[str, bytes | None], spec: SessionSpec, redactor: Redactor
) -> str:
    """What the messages view says about a command run (never its raw output)."""
    code = outcome.exit_code
    parts = [f"exit {code}" if code is not None else outcome.status]
    changed = [p for p, old in sorted(before.items()) if read_in(spec.workspace, p) != old]
    if changed:
        parts.append("changed " + ", ".join(changed))
    first = outcome.stdout.decode(errors="replace").strip().splitlines()[:1]
    if first:
        # masked whole, then cut: a secret cut in two would match nothing
        parts.append("stdout: " + redactor.text(first[0])[:200])
    return "; ".join(parts)


def _held(reason: str, exc: Exception) -> str:
    """The reason shown for a block the log could not take yet (once, not twice)."""
    why = "" if str(exc) in reason else f": {exc}"
    return f"{reason} (not recorded yet{why})"


def _times(failures: int) -> str:
    """ "once" (a spec with retries = 0), else "N times in a row"."""
    return "once" if failures == 1 else f"{failures} times in a row"
