"""Recovery: making a session's state stable again after a crash or a cut-off call.

Two moments need it. At start-up, a session the log says is ``running`` was cut
off by the crash: its run is recorded as ended (or, when its command had
finished, as finished) and it continues through the gate like any wake. And
before any run, the gate may prescribe actions for calls an interruption left
open (close it as interrupted, rebuild its observation, drop it unstarted).
Both write the same events for a cut-off call, so they live together, apart
from the normal path of a run.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from sessiond.log.event_data import ObservationProjected, RunFinished, ToolFinished
from sessiond.log.records import CallRecord, TurnRecord
from sessiond.log.store.base import Draft
from sessiond.runs.context import Continues, RunContext
from sessiond.runs.program import Outcome, proc_start_time, signal_group
from sessiond.runs.settle import Settler
from sessiond.runs.workspace import workspace_hasher
from sessiond.table.gate import CLOSE_INTERRUPTED, DROP_UNSTARTED, REBUILD_OBSERVATION, GateVerdict
from sessiond.table.sessions import Session

log = structlog.get_logger(__name__)


def close_cut_off(
    call_id: str, call: CallRecord, hasher: Callable[[str], str | None], text: str
) -> list[Draft]:
    """The events that close a call cut off before it finished: ``tool.finished``
    (interrupted, with the written paths' hashes now) and its observation."""
    tool = call["tool"]
    return [
        Draft(
            ToolFinished(
                call=call_id,
                tool=tool,
                status="interrupted",
                error_class="lifecycle",
                hashes={p: hasher(p) for p in call.get("writes") or []},
            ),
            correlation=call_id,
        ),
        Draft(
            ObservationProjected(call=call_id, tool=tool, text=text, source="rebuilt"),
            correlation=call_id,
        ),
    ]


def rebuilt_observation(call_id: str, call: CallRecord) -> ObservationProjected:
    """The observation of a call that ended without one on record (denied, or finished)."""
    tool = call["tool"]
    if call["stage"] == "denied":
        return ObservationProjected(
            call=call_id,
            tool=tool,
            text=f"{tool} was denied ({call.get('rule', 'by a person')})",
            source="denied",
        )
    finished = call.get("finished")
    code = finished.get("exit_code") if finished else None
    text = f"{tool} {finished['status'] if finished else 'finished'}" + (
        f" (exit {code})" if code is not None else ""
    )
    return ObservationProjected(call=call_id, tool=tool, text=text, source="rebuilt")


class Recovery:
    """Recording what a crash or an interruption cut off, so the session can go on."""

    def __init__(self, ctx: RunContext, settler: Settler, then: Continues) -> None:
        self.ctx = ctx
        self.settler = settler
        self.then = then

    async def apply(self, s: Session, verdict: GateVerdict) -> None:
        """Make the state stable before continuing, as the gate prescribed."""
        state = s.journal.state
        hasher = workspace_hasher(s.spec)
        drafts: list[Draft] = []
        for call_id, action in sorted(verdict.actions.items()):
            call = state.calls[call_id]
            tool = call["tool"]
            if action == CLOSE_INTERRUPTED:
                text = f"{tool} was interrupted before it finished; it is safe to run again"
                if state.fork_seq is not None and call.get("started_seq", 0) <= state.fork_seq:
                    # The parent's call, open at the fork (its own run may well finish
                    # it): nothing interrupted it here; the fork goes on with the turn.
                    text = (
                        f"{tool} had not finished in {state.parent} when this session was "
                        f"forked from it at seq {state.fork_seq}; this session goes on with "
                        "that turn, and it is safe to run again"
                    )
                drafts += close_cut_off(call_id, call, hasher, text)
            elif action == REBUILD_OBSERVATION:
                drafts.append(Draft(rebuilt_observation(call_id, call), correlation=call_id))
            elif action == DROP_UNSTARTED:
                text = f"{tool} was not started before the interruption; decide again"
                drafts.append(
                    Draft(
                        ObservationProjected(
                            call=call_id, tool=tool, text=text, source="discarded"
                        ),
                        correlation=call_id,
                    )
                )
        if drafts:
            await self.ctx.table.append_many(s, drafts)

    async def cut_off_runs(self) -> list[Session]:
        """A session found running was cut off by a crash: record it, stop leftovers.

        Returns the sessions whose turn continues: those cut off while running or
        between their gate and their start. Each continues once, after the gate,
        with no new wake (docs/design.md section 8); the caller continues them once the
        daemon is up. A ``restart`` wake here would be new work to the log: after
        the turn it would start the program again (or, on a blocked session, make
        ``resolve --discard`` run what it discarded).
        """
        return [s for s in list(self.ctx.table) if await self.cut_off(s)]

    async def cut_off(self, s: Session, *, local: bool = True) -> bool:
        """One session as :meth:`cut_off_runs` finds it (also a session a cluster
        node takes over from a dead one: ``local`` False, its program ran on
        another machine): whether its turn continues."""
        ctx = self.ctx
        if s.journal_or_none is not None and s.state == "ready":
            # It passed a gate but never started: start over, through the gate.
            return True
        if s.journal_or_none is None or s.state != "running":
            return False
        current = s.journal.state.current_run
        note = "daemon restarted during run"
        pid, started = (current["pid"], current["proc_start"]) if current else (None, None)
        if local and pid and started and proc_start_time(pid) == started:
            # Its program outlived the daemon; with nobody to record its result it
            # must not go on unsupervised.
            signal_group(pid, signal.SIGKILL)
            note += f"; its program (pid {pid}) was still running and was stopped"
        finished = [
            (k, c)
            for k, c in s.journal.state.calls.items()
            if c["tool"] == "command" and c["stage"] == "finished"
        ]
        observed = _observed_ok(s.journal.state.turn, s.journal.state.calls) if current else None
        if finished or observed is not None:
            # The command ran to its end before the crash: its work is done.
            # Record the observation (unless it is on record: the crash came between
            # it and run.finished) and the run's end; running it again would do it
            # twice, in the same turn (found by the kill -9 campaign with a power cut).
            if finished:
                call_id, call = finished[0]
                # what the end said (a tool.finished's data), or an ok exit
                result: Mapping[str, Any] = call.get("finished") or {}
                await ctx.table.append(
                    s,
                    ObservationProjected(
                        call=call_id,
                        tool="command",
                        source="rebuilt",
                        text=f"exit {result.get('exit_code')} (recorded before a daemon restart)",
                    ),
                    correlation=call_id,
                )
            else:  # tool.finished said ok, which only exit 0 is
                result = {"status": "ok", "exit_code": 0}
            status = "ok" if result.get("status") == "ok" else "failed"
            await ctx.table.append(
                s,
                RunFinished(
                    run=current["run"] if current else "?",
                    status=status,
                    exit_code=result.get("exit_code"),
                    error=note,
                    ends_turn=status == "ok",
                ),
            )
            await self.settler.after_run(
                s, Outcome(status, result.get("exit_code"), None, 0, b"", b"", 0, 0)
            )
            log.warning("session.cut_off", session=s.name, reason=note, rerun=False)
            return False
        last = s.journal.state.last_run
        if not current and s.journal.state.turn is None and last and last.get("ends_turn"):
            # Its run.finished ended the turn; only the session's next state is
            # missing. Going on through the gate would start a turn nobody asked
            # for: a one-shot command would run twice. A command's end calls for
            # what after_run decides; an sdk program's own word (sleep or complete)
            # died with the daemon, so it sleeps: nothing runs until a wake.
            spec = s.spec
            if spec is not None and spec.run is not None and spec.run.kind == "command":
                outcome = Outcome(last["status"], last.get("exit_code"), None, 0, b"", b"", 0, 0)
                await self.settler.after_run(s, outcome)
            else:
                await ctx.transition(s, "sleeping", why="recover", reason=f"{note}; turn ended")
            log.warning("session.cut_off", session=s.name, reason="after run.finished")
            return False
        if current:
            await ctx.table.append(
                s, RunFinished(run=current["run"], status="lost", error=note, ends_turn=False)
            )
        await ctx.transition(s, "sleeping", why="recover", reason=note)
        log.warning("session.cut_off", session=s.name, reason=note)
        # A restart is a continuation like any other: replay, gate, then run.
        return True


def _observed_ok(turn: TurnRecord | None, calls: Mapping[str, CallRecord]) -> str | None:
    """The call of the open turn's command step if it finished ``ok`` and its
    observation is on record (which closes the call: it is no longer in ``calls``):
    the run's own command, whose run.finished the crash cut off. A command run's
    call is started in the same write as its ``running``, which makes it the
    turn's command step, so an ``ok`` step here is this run's, never an older one."""
    step = turn["steps"].get("command") if turn else None
    if step is None or step["status"] != "ok" or step["call"] in calls:
        return None
    return str(step["call"])
