"""Runs: every continuation goes wake → replay → resume gate → run.

The Kernel (sessiond.syscalls.kernel) mixes this in; it provides ``table``, ``config``,
``env``, ``store`` and ``_transition``.

A ``command`` run is one call of the tool ``command``, recorded the way any tool
call is: ``tool.intent`` (the spec's risk contract and ``writes``) →
``policy.decided`` → ``tool.started`` (hashes of ``writes``, git HEAD) → the
program → ``tool.finished`` (exit code, stdout as output, new hashes, a diff
where text changed) → ``observation.projected``, inside ``run.started`` …
``run.finished``. An ``sdk`` program records its own tool calls (sessiond.sdk).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from sessiond.codec import rfc3339
from sessiond.gitrefs import resolve
from sessiond.log.event_data import (
    ApprovalRequested,
    ArtifactRef,
    BindingObserved,
    BudgetExhausted,
    GateCheck,
    GateEvaluated,
    LifecycleChanged,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    RunFinished,
    RunStarted,
    ToolFinished,
    ToolIntent,
    ToolStarted,
    WakeRequested,
)
from sessiond.log.store.base import Draft, Record
from sessiond.runs.runner import Outcome, Program, proc_start_time, program_env
from sessiond.table import lifecycle
from sessiond.table.gate import (
    CLOSE_INTERRUPTED,
    DROP_UNSTARTED,
    REBUILD_OBSERVATION,
    Verdict,
    evaluate,
)
from sessiond.table.policy import Verdict as PolicyVerdict
from sessiond.table.policy import decide
from sessiond.table.scheduler import Scheduler
from sessiond.table.sessions import Run, Session, file_hash
from sessiond.table.spec import SessionSpec

if TYPE_CHECKING:
    from sessiond.config import DaemonConfig
    from sessiond.log.store.files import FileStore
    from sessiond.table.sessions import Table

log = structlog.get_logger(__name__)

DIFF_LIMIT = 1 << 20  # files larger than this get no text diff
RETRY_CAP = 300.0  # seconds: exponential backoff stops growing here


def workspace_hasher(spec: SessionSpec | None) -> Any:
    base = spec.workspace if spec is not None else Path("/")
    return lambda path: file_hash(base / path)


def git_head(path: Path) -> str | None:
    """The workspace's git HEAD commit, if it is in a repository (read from the files
    under ``.git`` where it can be: this runs before every command run)."""
    return resolve(path, "HEAD")


def close_cut_off(
    call_id: str, call: dict[str, Any], hasher: Callable[[str], str | None], text: str
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


def redact(data: bytes, patterns: list[str]) -> bytes:
    """Mask the spec's ``redact`` patterns before anything is stored."""
    if not patterns or not data:
        return data
    text = data.decode(errors="surrogateescape")
    for pattern in patterns:
        text = re.sub(pattern, "[REDACTED]", text)
    return text.encode(errors="surrogateescape")


def _read_small(path: Path) -> bytes | None:
    try:
        if path.stat().st_size > DIFF_LIMIT:
            return None
        return path.read_bytes()
    except OSError:
        return None


def text_diff(before: dict[str, bytes | None], after_root: Path) -> bytes:
    out: list[str] = []
    for rel, old in sorted(before.items()):
        new = _read_small(after_root / rel)
        if old == new:
            continue
        try:
            a = (old or b"").decode().splitlines(keepends=True)
            b = (new or b"").decode().splitlines(keepends=True)
        except UnicodeDecodeError:
            out.append(f"Binary file {rel} changed\n")
            continue
        out.extend(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}"))
    return "".join(out).encode()


class Runs:
    """Waking, gating, starting, supervising and finishing session programs."""

    config: DaemonConfig
    table: Table
    store: FileStore
    env: dict[str, str]
    runtime_dir: Path
    retry_timers: dict[str, asyncio.TimerHandle]

    # provided by the Kernel: one lifecycle transition, checked and recorded
    _transition: Callable[..., Awaitable[Record]]
    # provided by SdkCalls: a run token for an sdk program, revoked when the run ends
    sdk_env: Callable[[Session, str], dict[str, str]]
    end_run: Callable[[Session, str], None]
    grant_of: Callable[[Session], Any]

    background: set[asyncio.Task[Any]]
    scheduler: Scheduler
    stopping: bool

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, keeping a reference until it is done."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def fault(self, point: str) -> None:
        """Test only (config key ``fault``): die here as a crash would."""
        if self.config.fault == point:
            log.warning("fault.injected", point=point)
            os.kill(os.getpid(), signal.SIGKILL)

    def now(self) -> str:
        return rfc3339(self.store.clock())

    # --- wakes and the gate ----------------------------------------------------------

    async def wake(
        self, s: Session, trigger: str, details: dict[str, Any], paths: frozenset[str] = frozenset()
    ) -> Record:
        """Record a wake; continue now if the session is idle and has a program.

        A session that runs, is suspended or blocked keeps the wake pending: it
        runs once when the session is free again (one follow-up carries them all).
        """
        async with s.lock:
            record = await self.table.append(s, WakeRequested(trigger=trigger, details=details))
            if trigger not in ("manual", "approval", "resolve", "restart"):
                end = self.scheduler.rate_limited(s, self.store.clock() / 1e9)
                if end is not None:
                    await self._cool_down(s, end)
                    return record
            idle = s.state in ("created", "sleeping", "ready") and s.run is None
            queued = s.name in self.scheduler.queue
            if idle and not queued and s.spec is not None and s.spec.run is not None:
                await self.proceed(s, record, paths)
        return record

    async def _cool_down(self, s: Session, end: float) -> None:
        """Over its [limits]: sleep visibly until ``end``, then run the recorded wakes once."""
        if s.state not in ("sleeping", "created") or s.j.state.until is not None:
            return  # running or already cooling: the wake waits as a pending one
        until = rfc3339(int(end * 1e9))
        limits = s.spec.limits if s.spec else None
        reason = (
            f"rate limit: more than {limits.burst} wakes in {limits.interval:g}s; cooling down"
            if limits
            else "rate limit"
        )
        await self.table.append(
            s,
            LifecycleChanged.model_validate(
                {"from": s.state, "to": "sleeping", "reason": reason, "until": until}
            ),
        )
        delay = max(end - self.store.clock() / 1e9, 0.0)

        def resume() -> None:
            self.spawn(self._after_cool_down(s))

        asyncio.get_running_loop().call_later(delay, resume)

    async def _after_cool_down(self, s: Session) -> None:
        async with s.lock:
            if s.state == "sleeping" and s.j.state.until is not None:
                await self.table.append(
                    s,
                    LifecycleChanged.model_validate(
                        {"from": "sleeping", "to": "sleeping", "reason": "cool-down over"}
                    ),
                )
                if s.j.state.pending_wakes and s.spec is not None and s.spec.run is not None:
                    await self.proceed(s, None)

    async def gate_now(self, s: Session, cause: Record | None, paths: frozenset[str]) -> Verdict:
        """Evaluate the gate on the replayed state and record the result."""
        verdict = evaluate(
            s.j.state,
            s.spec,
            now=self.now(),
            hash_file=workspace_hasher(s.spec),
            has_artifact=self.store.artifacts(s.name).has,
            cause_paths=paths,
        )
        await self.table.append(
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
        if self.stopping:
            return False  # the daemon is shutting down: the wakes stay pending
        if not paths:
            # A follow-up carries the wakes recorded meanwhile: the paths whose change
            # woke the session are its cause, not something held against it.
            paths = frozenset(
                p
                for w in s.j.state.pending_wakes
                if w["trigger"] in ("watch", "dependency")
                for p in w["details"].get("paths", [])
            )
        verdict = await self.gate_now(s, cause, paths)
        if verdict.outcome == "suspended":
            await self._suspend_for_budget(s, verdict)
            return False
        if verdict.outcome == "blocked":
            if s.state != "blocked":
                await self._transition(
                    s, "blocked", why="block", reason="gate: " + verdict.failing()
                )
            return False
        await self._apply(s, verdict)
        if s.spec is None or s.spec.run is None:
            if s.state == "blocked":
                await self._transition(s, "sleeping", why="unblock", reason="gate ok")
            await s.j.flush()
            return False
        running = self._running()
        if not self.scheduler.admits(s, running):
            self.scheduler.enqueue(s)
            if s.state != "ready":
                limit = self.scheduler.limit
                await self._transition(
                    s, "ready", why="queue", reason=f"queued: {len(running)} of {limit} slots busy"
                )
            await s.j.flush()
            return False
        self.scheduler.queue.pop(s.name, None)
        # Counted as running from now on, before anything is awaited, so that
        # simultaneous wakes cannot all pass the limit.
        self.scheduler.starting.add(s.name)
        try:
            await self._start(s, cause)
        except Exception:
            # The steps written without a flush were to be covered by the start's
            # durable append, which did not come: flush them now (best effort).
            with contextlib.suppress(Exception):
                await s.j.flush()
            raise
        finally:
            self.scheduler.starting.discard(s.name)
        return True

    def _running(self) -> list[Session]:
        return [r for r in self.table if r.run is not None or r.name in self.scheduler.starting]

    async def dispatch(self) -> None:
        """A slot came free: start the best queued sessions that may run (gate again)."""
        for s in self.scheduler.order():
            if self.stopping:
                return
            if not self.scheduler.admits(s, self._running()):
                continue
            async with s.lock:
                self.scheduler.queue.pop(s.name, None)
                if s.state == "ready" and s.run is None:
                    await self.proceed(s, None)

    async def _suspend_for_budget(self, s: Session, verdict: Verdict) -> None:
        spec = s.spec
        assert spec is not None
        state = s.j.state
        detail = next(c.detail for c in verdict.checks if c.name == "budget left")
        name = detail.split(":", 1)[0]
        limit = getattr(spec.budget, name, 0)
        used = (
            state.runs_by_day.get(self.now()[:10], 0)
            if name == "runs_per_day"
            else state.tokens_in + state.tokens_out
        )
        await self.table.append(s, BudgetExhausted(budget=name, limit=limit, used=used))
        if s.state != "suspended":
            await self._transition(s, "suspended", why="suspend", reason=f"budget: {detail}")
        if name == "runs_per_day":
            self._renew_at_midnight(s)

    def _renew_at_midnight(self, s: Session) -> None:
        """A daily budget renews at 00:00 UTC: pending wakes run then."""
        now = self.store.clock() / 1e9
        delay = 86400 - (now % 86400) + 1

        def renew() -> None:
            self.spawn(self._after_renewal(s))

        self.retry_timers[s.name] = asyncio.get_running_loop().call_later(delay, renew)

    async def _after_renewal(self, s: Session) -> None:
        async with s.lock:
            if s.state == "suspended" and s.j.state.reason.startswith("budget: runs_per_day"):
                await self._transition(s, "sleeping", why="renew", reason="daily budget renewed")
                if s.j.state.pending_wakes:
                    await self.proceed(s, None)

    async def _apply(self, s: Session, verdict: Verdict) -> None:
        """Make the state stable before continuing, as the gate prescribed."""
        state = s.j.state
        hasher = workspace_hasher(s.spec)
        drafts: list[Draft] = []
        for call_id, action in sorted(verdict.actions.items()):
            call = state.calls[call_id]
            tool = call["tool"]
            if action == CLOSE_INTERRUPTED:
                text = f"{tool} was interrupted before it finished; it is safe to run again"
                drafts += close_cut_off(call_id, call, hasher, text)
            elif action == REBUILD_OBSERVATION:
                drafts.append(Draft(self._rebuilt_observation(call_id, call), correlation=call_id))
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
            await self.table.append_many(s, drafts)

    @staticmethod
    def _rebuilt_observation(call_id: str, call: dict[str, Any]) -> ObservationProjected:
        tool = call["tool"]
        if call["stage"] == "denied":
            return ObservationProjected(
                call=call_id,
                tool=tool,
                text=f"{tool} was denied ({call.get('rule', 'by a person')})",
                source="denied",
            )
        finished = call.get("finished") or {}
        code = finished.get("exit_code")
        text = f"{tool} {finished.get('status', 'finished')}" + (
            f" (exit {code})" if code is not None else ""
        )
        return ObservationProjected(call=call_id, tool=tool, text=text, source="rebuilt")

    # --- starting a run ---------------------------------------------------------------

    def _command_policy(self, spec: SessionSpec) -> PolicyVerdict:
        assert spec.run is not None
        verdict = decide(spec.policy, "command", spec.run.side_effect)
        if verdict.rule.startswith("default:"):
            # A command run is the session's own program: allowed unless listed.
            return PolicyVerdict("allow", "default: a command run is allowed")
        return verdict

    async def _start(self, s: Session, cause: Record | None) -> None:
        """ready → running (the caller holds s.lock and passed the gate)."""
        pending_retry = self.retry_timers.pop(s.name, None)
        if pending_retry is not None:  # this run is the retry now
            pending_retry.cancel()
        spec = s.spec
        assert spec is not None
        assert spec.run is not None
        trigger = cause["data"]["trigger"] if cause else "follow-up"
        # Steps up to the program's start wait for no fsync of their own: every way
        # on from here (a denial, a question, tool.started before the program starts)
        # records durably, and that covers them.
        if s.state != "ready":
            await self._transition(
                s, "ready", why="start", reason=f"gate ok ({trigger})", durable=False
            )
        state = s.j.state
        # Never a number given out before, even to a run cut off before its
        # run.started: its program may have run, under that run and call id.
        run_id = f"r{max(state.runs, state.run_number) + 1}"
        call_id = f"{run_id}.command"
        command = spec.run.kind == "command"
        if command:
            approved = None
            used = set(state.calls)
            for k, c in list(state.calls.items()):
                if c["tool"] != "command" or c["stage"] != "approved":
                    continue
                if c["args"].get("exec") == list(spec.run.exec):
                    approved = k
                    continue
                # The spec changed since the approval: it approved another command.
                await self.table.append(
                    s,
                    ObservationProjected(
                        call=k,
                        tool="command",
                        text="approval not used: the spec's command changed since it was given",
                        source="discarded",
                    ),
                    correlation=k,
                )
            if approved is not None:
                call_id = approved
            elif call_id in used:  # a discarded approval had it: one id, one call
                call_id = f"{run_id}.command.{s.j.state.tool_calls + 1}"
            if approved is None:
                verdict = self._command_policy(spec)
                risk = RiskContract(
                    side_effect=spec.run.side_effect,
                    idempotency=spec.run.idempotency,
                    resume=spec.run.resume,
                )
                self.fault("before-intent")
                intent_draft = Draft(
                    ToolIntent(
                        call=call_id,
                        tool="command",
                        args={"exec": list(spec.run.exec)},
                        risk=risk,
                        writes=tuple(spec.run.writes),
                    ),
                    correlation=call_id,
                )
                policy_draft = Draft(
                    PolicyDecided(
                        call=call_id, tool="command", decision=verdict.decision, rule=verdict.rule
                    ),
                    correlation=call_id,
                )
                if self.config.fault == "after-intent":  # test only: two durable steps
                    await self.table.append_many(s, [intent_draft])
                    self.fault("after-intent")
                    decided = (await self.table.append_many(s, [policy_draft]))[0]
                else:  # one write; the next durable step makes it durable
                    drafts = [intent_draft, policy_draft]
                    decided = (await self.table.append_many(s, drafts, durable=False))[1]
                self.fault("after-policy")
                records = [decided]
                if verdict.decision == "deny":
                    await self.table.append(
                        s,
                        ObservationProjected(
                            call=call_id,
                            tool="command",
                            text=f"the command was denied ({verdict.rule})",
                            source="denied",
                        ),
                        correlation=call_id,
                    )
                    await self._transition(
                        s,
                        "blocked",
                        why="deny",
                        reason=f"policy denies the command ({verdict.rule})",
                    )
                    return
                if verdict.decision == "ask":
                    await self.table.append(
                        s,
                        ApprovalRequested(call=call_id, tool="command"),
                        correlation=call_id,
                        causation=records[-1]["id"],
                    )
                    await self._transition(
                        s, "blocked", why="ask", reason=f"approval pending for command [{call_id}]"
                    )
                    return
        await self._launch(s, cause, run_id, call_id if command else None)

    async def _launch(
        self, s: Session, cause: Record | None, run_id: str, call_id: str | None
    ) -> None:
        spec = s.spec
        assert spec is not None
        assert spec.run is not None
        state = s.j.state
        trigger = cause["data"]["trigger"] if cause else "follow-up"
        wakes = [
            {"trigger": w["trigger"], "details": w["details"], "seq": w["seq"], "ts": w["ts"]}
            for w in state.pending_wakes
        ] or [{"trigger": trigger, "details": cause["data"]["details"] if cause else {}}]
        workspace = spec.workspace
        # The gate let changed bound files through only as the cause of this wake:
        # the run consumes their new content, so it becomes the recorded one.
        bound_now = {p: file_hash(workspace / p) for p in spec.bind.files}
        if any(state.bound.get(p) != h for p, h in bound_now.items()):
            await self.table.append(s, BindingObserved(hashes=bound_now))
        before: dict[str, bytes | None] = {}
        pending_started: Draft | None = None
        if call_id is not None:
            hasher = workspace_hasher(spec)
            before = {p: _read_small(workspace / p) for p in spec.run.writes}
            started = Draft(
                ToolStarted(
                    call=call_id,
                    tool="command",
                    hashes={p: hasher(p) for p in spec.run.writes},
                    git_head=git_head(workspace),
                ),
                correlation=call_id,
            )
            if self.config.fault == "after-started":  # test only: stop between the two
                await self.table.append_many(s, [started])
                self.fault("after-started")
            else:
                pending_started = started
        self.runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        wake_file = self.runtime_dir / f"{s.name}.{run_id}.wake.json"
        profile = self.config.profiles.get(spec.run.profile) or self.config.profiles["default"]
        env = program_env(
            self.env, spec, profile.env, run_id=run_id, wakes=wakes, wake_file=wake_file
        )
        if call_id is not None:
            # The tool call this command run is: a key for the program's own
            # idempotency checks (a rerun after a crash is a new call, a new key).
            env["SESSIOND_CALL"] = call_id
        # Every program may talk to the daemon (sessionctl); an sdk one also gets its token.
        env["SESSIOND_SOCKET"] = str(self.config.socket)
        if spec.run.kind == "sdk":
            env.update(self.sdk_env(s, run_id))
        # the budget's seconds per run, where it has one (0: no limit), bound the timeout
        timeout = min(spec.run.timeout, float(spec.budget.seconds_per_run or spec.run.timeout))
        program = Program(
            spec,
            env=env,
            max_output=self.config.max_output_bytes,
            grace=self.config.stop_grace,
            timeout=timeout,
        )
        running = lifecycle.change(s.name, s.state, "running", why="run", reason=trigger)
        # tool.started and the lifecycle change in one durable write
        drafts = [pending_started] if pending_started is not None else []
        await self.table.append_many(s, [*drafts, Draft(running)])

        async def settle(outcome: Outcome) -> None:  # a run that ends before it is supervised
            await self._settle(
                s,
                run_id=run_id,
                call_id=call_id,
                outcome=outcome,
                before=before,
                wake_file=wake_file,
            )

        try:
            pid = await program.start()
        except (OSError, ValueError) as exc:  # ValueError: a NUL in an argument or env value
            why = f"could not start {spec.run.exec[0]!r}: {getattr(exc, 'strerror', None) or exc}"
            s.run = Run(run_id, 0, time.time(), program)
            await settle(Outcome("failed", None, None, 0, b"", why.encode(), 0, 0, error=why))
            return
        self.fault("after-spawn")  # test only: the program runs, run.started is not written
        # Known as running before anything is awaited: the program may call the
        # daemon (the SDK) at once.
        s.run = Run(run_id, pid, time.time(), program)
        if not await self._record_start(
            s, spec=spec, program=program, run_id=run_id, pid=pid, wakes=wakes, cause=cause
        ):
            await settle(await program.wait())
            return
        self.fault("during-work")
        s.run.task = asyncio.create_task(
            self._supervise(
                s, program, run_id=run_id, call_id=call_id, before=before, wake_file=wake_file
            )
        )
        log.info("run.started", session=s.name, run=run_id, pid=pid)

    async def _record_start(
        self,
        s: Session,
        *,
        spec: SessionSpec,
        program: Program,
        run_id: str,
        pid: int,
        wakes: list[dict[str, Any]],
        cause: Record | None,
    ) -> bool:
        """Record run.started. If that fails (a full disk between tool.started and
        here), a program whose run is not on record must not go on: it is stopped,
        and the caller settles the run like any other, which blocks the session
        (held until the log takes writes, if need be)."""
        assert spec.run is not None
        try:
            await self.table.append(
                s,
                RunStarted(
                    run=run_id,
                    kind=spec.run.kind,
                    pid=pid,
                    pgid=pid,
                    proc_start=proc_start_time(pid),
                    profile=spec.run.profile,
                    wakes=tuple(wakes),
                ),
                causation=cause["id"] if cause else None,
            )
        except Exception:
            log.exception("run.start_unrecorded", session=s.name, run=run_id, pid=pid)
            await program.stop("run.started could not be recorded")
            return False
        return True

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
            await self._settle(
                s,
                run_id=run_id,
                call_id=call_id,
                outcome=outcome,
                before=before,
                wake_file=wake_file,
            )
            if s.state == "sleeping" and s.j.state.pending_wakes and stop is None:
                # Wakes that came while it ran: one follow-up run carries them all.
                await self.proceed(s, None)

    async def _settle(
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
        try:
            await self._finish(s, run_id, call_id, outcome, before)
        except Exception as exc:  # never leave a session `running` with no program
            log.exception("run.finish_failed", session=s.name, run=run_id)
            await self._record_broken_finish(s, run_id, exc)
        finally:
            s.run = None
            wake_file.unlink(missing_ok=True)
            self.end_run(s, run_id)  # its SDK token dies with it
            triggers = getattr(self, "triggers", None)
            if triggers is not None:
                triggers.run_ended(s)
            if self.scheduler.queue:  # the slot is free: queued sessions may start
                self.spawn(self.dispatch())

    async def _finish(
        self,
        s: Session,
        run_id: str,
        call_id: str | None,
        outcome: Outcome,
        before: dict[str, bytes | None],
    ) -> None:
        spec = s.spec
        assert spec is not None
        assert spec.run is not None
        artifacts = self.store.artifacts(s.name)
        loop = asyncio.get_running_loop()

        async def put(data: bytes, name: str) -> ArtifactRef | None:
            if not data:
                return None
            clean = redact(data, spec.redact)
            return await loop.run_in_executor(None, artifacts.put, clean, name, "text/plain")

        stdout = await put(outcome.stdout, "stdout")
        stderr = await put(outcome.stderr, "stderr")
        truncated = outcome.stdout_total > len(outcome.stdout)
        if call_id is not None and s.j.state.calls.get(call_id, {}).get("stage") == "started":
            hasher = workspace_hasher(spec)
            diff = await put(text_diff(before, spec.workspace), "diff")
            status = {"ok": "ok", "interrupted": "interrupted", "killed": "interrupted"}.get(
                outcome.status, "error"
            )
            await self.table.append(
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
            self.fault("after-finished")
            await self.table.append(
                s,
                ObservationProjected(
                    call=call_id, tool="command", text=_observation(outcome, before, spec)
                ),
                correlation=call_id,
            )
        notes = []
        if truncated:
            notes.append(f"stdout cut at {len(outcome.stdout)} of {outcome.stdout_total} bytes")
        if outcome.stderr_total > len(outcome.stderr):
            notes.append(f"stderr cut at {len(outcome.stderr)} of {outcome.stderr_total} bytes")
        if outcome.error:
            notes.append(outcome.error)
        await self.table.append(
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
            ),
        )
        log.info("run.finished", session=s.name, run=run_id, status=outcome.status)
        await self._after_finish(s, outcome)

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
            self.spawn(self._record_hold(s, run_id, reason))

    async def _block_recorded(self, s: Session, run_id: str, reason: str) -> None:
        journal = s.j
        if journal.state.current_run is not None:
            await journal.append(RunFinished(run=run_id, status="failed", error=reason))
        if journal.state.state in ("running", "ready"):
            change = lifecycle.change(
                s.name, journal.state.state, "blocked", why="block", reason=reason
            )
            await journal.append(change)
            self.scheduler.queue.pop(s.name, None)

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

    async def _after_finish(self, s: Session, outcome: Outcome) -> None:
        stop = s.run.stop_requested if s.run else None
        grant = self.grant_of(s)
        if stop is not None and stop.startswith("approval pending"):
            if s.j.state.pending_approvals():
                await self._transition(s, "blocked", why="ask", reason=stop)
            else:  # answered while the program was still finishing: continue
                await self._transition(s, "sleeping", why="sleep", reason="approval answered")
                self.spawn(self.wake(s, "approval", {"answered": "during the run"}))
            return
        if grant is not None and grant.exit_intent and outcome.status == "ok" and stop is None:
            if grant.exit_intent == "complete":
                await self._transition(
                    s,
                    "terminated",
                    why="complete",
                    reason=f"completed: {grant.summary}" if grant.summary else "completed",
                    outcome="completed",
                )
            else:
                await self._transition(
                    s, "sleeping", why="sleep", reason="the program chose to sleep"
                )
            return
        if stop == "cancel":
            await self._transition(
                s, "terminated", why="cancel", reason="cancelled", outcome="cancelled"
            )
        elif stop == "suspend":
            await self._transition(s, "suspended", why="suspend", reason="suspended by request")
        elif stop in ("interrupt", "shutdown"):
            why = "interrupted" if stop == "interrupt" else "interrupted by daemon shutdown"
            await self._transition(s, "sleeping", why="interrupt", reason=why)
        elif stop in ("merge", "migrate"):
            # the caller terminates it; if that fails, it must not stay `running`
            await self._transition(s, "sleeping", why="stop", reason=f"stopped for {stop}")
        elif stop is not None and stop.startswith("budget"):
            await self._transition(s, "suspended", why="suspend", reason=stop)
        elif s.state == "running":
            await self._after_run(s, outcome)

    async def _after_run(self, s: Session, outcome: Outcome) -> None:
        spec = s.spec
        assert spec is not None
        assert spec.run is not None
        code = outcome.exit_code
        text = (
            "exit 0"
            if outcome.status == "ok"
            else outcome.status + (f" (exit {code})" if code is not None else "")
        )
        if outcome.status == "ok":
            if spec.has_triggers or s.j.state.pending_wakes:
                await self._transition(s, "sleeping", why="sleep", reason=f"last run: {text}")
            else:
                await self._transition(
                    s, "terminated", why="complete", reason=f"done: {text}", outcome="completed"
                )
            return
        if (
            outcome.status == "timeout"
            and spec.budget.seconds_per_run
            and outcome.duration_ms >= spec.budget.seconds_per_run * 1000
        ):
            await self.table.append(
                s,
                BudgetExhausted(
                    budget="seconds_per_run",
                    limit=spec.budget.seconds_per_run,
                    used=outcome.duration_ms // 1000,
                ),
            )
            await self._transition(
                s,
                "suspended",
                why="suspend",
                reason=f"budget: seconds_per_run {spec.budget.seconds_per_run}s used up",
            )
            return
        failures = s.j.state.failures_in_a_row
        if failures <= spec.run.retries:
            delay = min(2.0 ** (failures - 1), RETRY_CAP)
            await self._transition(
                s,
                "sleeping",
                why="retry",
                reason=f"run failed: {text}; retry {failures} of {spec.run.retries} in {delay:g}s",
            )
            self._schedule_retry(s, delay, failures)
            return
        await self._transition(
            s,
            "blocked",
            why="block",
            reason=f"run failed {failures} times in a row (last: {text}); fix it, then "
            f"'sessionctl resolve {s.name} --rerun'",
        )

    def _schedule_retry(self, s: Session, delay: float, attempt: int) -> None:
        def fire() -> None:
            self.retry_timers.pop(s.name, None)
            self.spawn(self.wake(s, "retry", {"attempt": attempt}))

        old = self.retry_timers.pop(s.name, None)
        if old is not None:
            old.cancel()
        self.retry_timers[s.name] = asyncio.get_running_loop().call_later(delay, fire)

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


def _observation(outcome: Outcome, before: dict[str, bytes | None], spec: SessionSpec) -> str:
    """What the messages view says about a command run (never its raw output)."""
    code = outcome.exit_code
    parts = [f"exit {code}" if code is not None else outcome.status]
    changed = [p for p, old in sorted(before.items()) if _read_small(spec.workspace / p) != old]
    if changed:
        parts.append("changed " + ", ".join(changed))
    first = outcome.stdout.decode(errors="replace").strip().splitlines()[:1]
    if first:
        parts.append(
            "stdout: " + redact(first[0][:200].encode(), spec.redact).decode(errors="replace")
        )
    return "; ".join(parts)


def _held(reason: str, exc: Exception) -> str:
    """The reason shown for a block the log could not take yet (once, not twice)."""
    why = "" if str(exc) in reason else f": {exc}"
    return f"{reason} (not recorded yet{why})"
