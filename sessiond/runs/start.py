"""Starting a run: a ``command`` run is one call of the tool ``command``.

It is recorded the way any tool call is: ``tool.intent`` (the spec's risk
contract and ``writes``) → ``policy.decided`` → ``tool.started`` (hashes of
``writes``, git HEAD) → the program, inside ``run.started``. The policy may deny
the command or ask a person first; an approval given for another command (the
spec changed) is not used. An ``sdk`` program records its own tool calls
(sessiond.sdk); it gets a run token to do so.

The program is spawned held (sessiond/runs/spawner.py): its holder's pid is
recorded in ``run.started`` before the program may exec anything, so a crash at
any instant of the start leaves either a program that never ran or one whose
run is on record (and that the spawner stops when the daemon dies).

The fault points here (``before-intent`` … ``after-spawn``, ``after-record``)
are the crash points the recovery tests stop the daemon at.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import structlog

from sessiond.log.event_data import (
    ApprovalRequested,
    BindingObserved,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    RunStarted,
    ToolIntent,
    ToolStarted,
)
from sessiond.log.event_records import RunWake
from sessiond.log.state import State
from sessiond.log.store.base import Draft, Record
from sessiond.paths import program_socket
from sessiond.runs.agents import agent_env
from sessiond.runs.cgroups import BadCgroupConfig, CgroupError, RunCgroup, run_prefix
from sessiond.runs.context import RunContext
from sessiond.runs.leftovers import MARK, mark
from sessiond.runs.modelenv import model_env, provider_keys
from sessiond.runs.program import Outcome, Program, program_env
from sessiond.runs.secrets import SecretMissing
from sessiond.runs.secrets import resolve as resolve_secrets
from sessiond.runs.settle import Settler
from sessiond.runs.supervise import Supervisor
from sessiond.runs.tokens import Tokens
from sessiond.runs.workspace import git_head, read_in, workspace_hasher
from sessiond.table import lifecycle
from sessiond.table.policy_rules import PolicyVerdict, decide
from sessiond.table.recovery import POLICY_DENIES
from sessiond.table.sessions import LiveRun, Session
from sessiond.table.spec import SessionSpec, under_profile

log = structlog.get_logger(__name__)


class Starter:
    """ready → running: the command's policy, its tool call's steps, the program's launch."""

    def __init__(
        self, ctx: RunContext, tokens: Tokens, settler: Settler, supervisor: Supervisor
    ) -> None:
        self.ctx = ctx
        self.tokens = tokens
        self.settler = settler
        self.supervisor = supervisor
        self.unrecorded: dict[str, str] = {}  # run id -> why its run.started was not

    def _spec(self, s: Session) -> SessionSpec:
        """The spec as this run sees it: under the session's runner profile (its own
        since created, or the one ``migrate --profile`` chose), which may replace
        ``run.exec`` and budget keys."""
        assert s.spec is not None
        return under_profile(s.spec, s.journal.state.profile, self.ctx.config.profiles)

    def _command_policy(self, spec: SessionSpec) -> PolicyVerdict:
        assert spec.run is not None
        verdict = decide(spec.policy, "command", spec.run.side_effect)
        if verdict.rule.startswith("default:"):
            # A command run is the session's own program: allowed unless listed.
            return PolicyVerdict("allow", "default: a command run is allowed")
        return verdict

    async def start(self, s: Session, cause: Record | None) -> None:
        """ready → running (the caller holds s.lock and passed the gate)."""
        pending_retry = self.ctx.retry_timers.pop(s.name, None)
        if pending_retry is not None:  # this run is the retry now
            pending_retry.cancel()
        spec = self._spec(s)
        assert spec.run is not None
        trigger = cause["data"]["trigger"] if cause else "follow-up"
        # Steps up to the program's start wait for no fsync of their own: every way
        # on from here (a denial, a question, tool.started before the program starts)
        # records durably, and that covers them.
        if s.state != "ready":
            await self.ctx.transition(
                s, "ready", why="start", reason=f"gate ok ({trigger})", durable=False
            )
        state = s.journal.state
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
                await self.ctx.table.append(
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
                call_id = f"{run_id}.command.{s.journal.state.tool_calls + 1}"
            if approved is None:
                verdict = self._command_policy(spec)
                risk = RiskContract(
                    side_effect=spec.run.side_effect,
                    idempotency=spec.run.idempotency,
                    resume=spec.run.resume,
                )
                self.ctx.faults.point("before-intent")
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
                if self.ctx.faults.armed("after-intent"):  # a crash test: two durable steps
                    await self.ctx.table.append_many(s, [intent_draft])
                    self.ctx.faults.point("after-intent")
                    decided = (await self.ctx.table.append_many(s, [policy_draft]))[0]
                else:  # one write; the next durable step makes it durable
                    drafts = [intent_draft, policy_draft]
                    decided = (await self.ctx.table.append_many(s, drafts, durable=False))[1]
                self.ctx.faults.point("after-policy")
                records = [decided]
                if verdict.decision == "deny":
                    await self.ctx.table.append(
                        s,
                        ObservationProjected(
                            call=call_id,
                            tool="command",
                            text=f"the command was denied ({verdict.rule})",
                            source="denied",
                        ),
                        correlation=call_id,
                    )
                    await self.ctx.transition(
                        s,
                        "blocked",
                        why="deny",
                        reason=f"{POLICY_DENIES} ({verdict.rule})",
                    )
                    return
                if verdict.decision == "ask":
                    await self.ctx.table.append(
                        s,
                        ApprovalRequested(call=call_id, tool="command"),
                        correlation=call_id,
                        causation=records[-1]["id"],
                    )
                    await self.ctx.transition(
                        s, "blocked", why="ask", reason=f"approval pending for command [{call_id}]"
                    )
                    return
        if await self._stop_pending(s, run_id):
            return
        await self._launch(s, cause, run_id, call_id if command else None)

    async def _stop_pending(self, s: Session, run_id: str) -> bool:
        """True if a cancel, suspend or interrupt came while this run was starting:
        its program is never started (its wakes stay pending), and the syscall
        records the state it asked for once it has the lock (syscalls.control)."""
        await self.ctx.faults.hold("before-spawn", s.name)  # test only: a start under way
        if s.stop_pending is None:
            return False
        log.info("run.not_started", session=s.name, run=run_id, stop=s.stop_pending)
        await s.journal.flush()  # what the start recorded so far (a decided call) stays
        return True

    async def _launch(
        self, s: Session, cause: Record | None, run_id: str, call_id: str | None
    ) -> None:
        spec = self._spec(s)
        assert spec.run is not None
        state = s.journal.state
        trigger = cause["data"]["trigger"] if cause else "follow-up"
        turn, wakes = _turn_and_wakes(state, cause)
        workspace = spec.workspace
        # The gate let changed bound files through only as the cause of this wake:
        # the run consumes their new content, so it becomes the recorded one.
        # read as the daemon (root, often): never through a link the run made out of
        # its workspace (a key's hash, say, in its log)
        bound_hash = workspace_hasher(spec)
        bound_now = {p: bound_hash(p) for p in spec.bind.files}
        if any(state.bound.get(p) != h for p, h in bound_now.items()):
            await self.ctx.table.append(s, BindingObserved(hashes=bound_now))
        before: dict[str, bytes | None] = {}
        pending_started: Draft | None = None
        if call_id is not None:
            hasher = workspace_hasher(spec)
            before = {p: read_in(workspace, p) for p in spec.run.writes}
            started = Draft(
                ToolStarted(
                    call=call_id,
                    tool="command",
                    hashes={p: hasher(p) for p in spec.run.writes},
                    git_head=git_head(workspace),
                ),
                correlation=call_id,
            )
            if self.ctx.faults.armed("after-started"):  # a crash test: stop between the two
                await self.ctx.table.append_many(s, [started])
                self.ctx.faults.point("after-started")
            else:
                pending_started = started
        self.ctx.runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        wake_file = self.ctx.runtime_dir / f"{s.name}.{run_id}.wake.json"
        env, unresolved = self._env(s, run_id, call_id, wakes, wake_file, turn=turn)
        # the budget's seconds per run, where it has one (0: no limit), bound the timeout
        timeout = min(spec.run.timeout, float(spec.budget.seconds_per_run or spec.run.timeout))
        program = self.session_program(spec, env=env, timeout=timeout)
        running = lifecycle.change(s.name, s.state, "running", why="run", reason=trigger)
        # tool.started and the lifecycle change in one write, made durable by the
        # next one: run.started (or the end of a program that could not start). The
        # program is held until then, so nothing has run that is not on record.
        drafts = [pending_started] if pending_started is not None else []
        await self.ctx.table.append_many(s, [*drafts, Draft(running)], durable=False)

        async def settle(outcome: Outcome) -> None:  # a run that ends before it is supervised
            await self.settler.settle(
                s,
                run_id=run_id,
                call_id=call_id,
                outcome=outcome,
                before=before,
                wake_file=wake_file,
            )

        record = functools.partial(
            self._record_start,
            s,
            spec=spec,
            program=program,
            run_id=run_id,
            wakes=wakes,
            cause=cause,
            turn=turn,
        )
        try:
            if unresolved is not None:
                raise unresolved
            # Confined by the kernel (runs/sandbox.py); SandboxUnavailable (an
            # OSError) says why it cannot be, and the run does not start.
            program.plan = await self.ctx.confinement(s, spec, wake_file)
            pid = await self._spawn_and_record(s, program, run_id, record)
        except (OSError, ValueError, CgroupError) as exc:  # ValueError: a NUL in an argument
            why = f"could not start {spec.run.exec[0]!r}: {getattr(exc, 'strerror', None) or exc}"
            s.run = LiveRun(run_id, 0, time.time(), program)
            await settle(Outcome("failed", None, None, 0, b"", why.encode(), 0, 0, error=why))
            return
        if pid is None:
            await settle(await self._unrecorded(program, run_id))
            return
        self.ctx.faults.point("after-record")  # test only: on record, never let go
        program.go()
        if self.ctx.faults.armed("during-work"):  # a crash test: once it has done some
            await program.output_seen(10.0)
            self.ctx.faults.point("during-work")
        self.supervisor.watch(
            s, program, run_id=run_id, call_id=call_id, before=before, wake_file=wake_file
        )
        log.info("run.started", session=s.name, run=run_id, pid=pid)

    def session_program(
        self,
        spec: SessionSpec,
        *,
        env: dict[str, str],
        timeout: float,
        max_output: int | None = None,
        argv: list[str] | None = None,
        cwd: str | None = None,
        stdin: int | None = None,
    ) -> Program:
        """The one way a process is started on a session's behalf: its run's program
        (``argv`` and ``cwd`` None: the spec's ``[run]``) or any other command for it
        (a ``[compact] exec``, sessiond.runs.commands). Through the spawner, held,
        as ``[run] user``; the caller gives it its cgroup (``cgroup_for``) and an
        environment with the run mark. Whatever confines a run is set here."""
        return Program(
            spec,
            env=env,
            max_output=self.ctx.config.max_output_bytes if max_output is None else max_output,
            grace=self.ctx.config.stop_grace,
            spawner=self.ctx.spawner,
            timeout=timeout,
            user=self.ctx.config.run.identity(),  # [run] user, where there is one
            argv=argv,
            cwd=cwd,
            stdin=stdin,
        )

    async def _spawn_and_record(
        self,
        s: Session,
        program: Program,
        run_id: str,
        record: Callable[..., Awaitable[bool]],
    ) -> int | None:
        """Spawn the program held and record run.started: its pid once on record
        (it may go), None if the record failed (it is stopped, never went).
        OSError, ValueError or CgroupError: it could not start (after run.started,
        if that was written meanwhile)."""
        recording: asyncio.Future[bool] | None = None
        try:
            program.cgroup = self.cgroup_for(s, run_id, sandboxed=program.plan is not None)
            holder = program.send()
            # Told the holder ahead: run.started (the start's one fsync) is written
            # while the spawner hands it the request. Not when a test stops or holds
            # the start right after the spawn, which wants the two steps apart.
            if holder is not None and not self.ctx.faults.armed("after-spawn"):
                program.proc_start = holder[1]
                s.run = LiveRun(run_id, holder[0], time.time(), program)
                recording = asyncio.ensure_future(record(pid=holder[0]))
            pid = await program.start()
        except BaseException:
            if recording is not None:
                await recording  # on record or not, the run ends after it
            raise
        if recording is None:
            # test only: the program is spawned held (it has run nothing), run.started
            # is not written (a crash there, or a hold while a stop races the start)
            await self.ctx.faults.hold("after-spawn", s.name)
            # Known as running before anything is awaited: the program may call the
            # daemon (the SDK) at once.
            s.run = LiveRun(run_id, pid, time.time(), program)
            recording = asyncio.ensure_future(record(pid=pid))
        if not await recording:
            await program.stop("run.started could not be recorded")  # held: never goes
            return None
        return pid

    def cgroup_for(self, s: Session, run_id: str, *, sandboxed: bool) -> RunCgroup | None:
        """The run's own cgroup, made empty (None where the daemon has no cgroups:
        the spawner's subreapers alone stop the run). Its ``pids.max`` bounds
        ``max_processes``, plus one for the holder, which is not the program's,
        and two for bubblewrap's (its own and its pid namespace's init).
        CgroupError: a run that needs a bound cannot have one here. ``run_id`` may
        name another process of the session (a compaction command's)."""
        assert s.spec is not None
        limit = s.spec.run.max_processes if s.spec.run is not None else None
        try:
            support, note = self.ctx.cgroups()
        except BadCgroupConfig as exc:
            if limit is not None:
                raise CgroupError(f"max_processes needs a pids controller: {exc}") from None
            return None
        if support is None:
            if limit is not None:
                raise CgroupError(f"max_processes needs a pids controller: {note}")
            return None
        name = f"{run_prefix(self.ctx.config.state_dir)}{s.name}.{run_id}"
        try:
            extra = 3 if sandboxed else 1
            return RunCgroup.create(support, name, None if limit is None else limit + extra)
        except CgroupError as exc:
            if limit is not None:
                raise
            # The subreapers still stop the run; only the kernel's help is missing.
            log.warning("run.no_cgroup", session=s.name, run=run_id, error=str(exc))
            return None

    def _env(
        self,
        s: Session,
        run_id: str,
        call_id: str | None,
        wakes: list[RunWake],
        wake_file: Path,
        *,
        turn: int,
    ) -> tuple[dict[str, str], SecretMissing | None]:
        """The program's environment: the daemon's, the profile's, the spec's, its
        secrets, ours; and why a secret could not be read (the start then fails).
        The secrets' values and the run token become values the session masks
        wherever it stores text, until its next start."""
        spec = self._spec(s)
        assert spec.run is not None
        try:  # read now, at every start, never stored
            secrets, unresolved = resolve_secrets(spec, self.ctx.env), None
        except SecretMissing as exc:
            secrets, unresolved = {}, exc
        profile = self.ctx.config.profiles[spec.run.profile]  # _spec() made it one we have
        env = program_env(
            self.ctx.env, spec, profile.env, run_id=run_id, wakes=wakes, wake_file=wake_file,
            epoch=s.journal.log.epoch,
        )  # fmt: skip
        env["SESSIOND_PROFILE"] = spec.run.profile
        env["SESSIOND_MODEL"] = profile.model
        env.update(secrets)
        env["SESSIOND_TURN"] = str(turn)  # the same in every run of the turn
        if self.ctx.config.cluster.dsn is not None:  # a cluster: which node runs it
            env["SESSIOND_NODE"] = self.ctx.config.cluster.node
        env.update(agent_env(spec, self.ctx.config.state_dir, s.name))
        masked = set(secrets.values())
        user = self.ctx.config.run.identity()
        if user is not None:  # [run] user: its program reads its wake file
            os.chmod(self.ctx.runtime_dir, 0o711)  # searchable; each file is its run's
            os.chmod(wake_file, 0o600)
            os.chown(wake_file, *user)
        if call_id is not None:
            # The tool call this command run is: a key for the program's own
            # idempotency checks (a rerun after a crash is a new call, a new key).
            env["SESSIOND_CALL"] = call_id
        # Every program may talk to the daemon (sessionctl, the SDK), through the
        # program endpoint and with its run's token: never the control socket, whose
        # path is not given to it (docs/design.md section 8, "Who may approve").
        env["SESSIOND_SOCKET"] = str(program_socket(self.ctx.config.socket))
        env["SESSIOND_TOKEN"] = self.tokens.issue(s, run_id)
        # the model gateway's address and the token as the API key; no provider key
        model_env(
            env,
            self.ctx.config.model,
            self.ctx.gateway,
            self.ctx.env,
            session=s.name,
            run=run_id,
            token=env["SESSIOND_TOKEN"],
        )
        # Inherited by every process of the run: what a restart looks for when
        # neither this daemon nor its spawner is left to stop them (runs/leftovers.py).
        env[MARK] = mark(self.ctx.config.state_dir, s.name, run_id)
        masked.add(env["SESSIOND_TOKEN"])
        # a provider's key is never stored nor shown, even where an upstream echoes it
        # back in an answer (a proxy's error, a model told it): such an answer is
        # refused when it is recorded, as any answer holding a secret
        masked |= provider_keys(self.ctx.config.model, self.ctx.env)
        s.masked = frozenset(masked)
        return env, unresolved

    async def _record_start(
        self,
        s: Session,
        *,
        spec: SessionSpec,
        program: Program,
        run_id: str,
        pid: int,
        wakes: list[RunWake],
        cause: Record | None,
        turn: int,
    ) -> bool:
        """Record run.started. If that fails (a full disk between tool.started and
        here), a program whose run is not on record must not go on: it is stopped,
        and the caller settles the run like any other, which blocks the session
        (held until the log takes writes, if need be)."""
        assert spec.run is not None
        try:
            await self.ctx.table.append(
                s,
                RunStarted(
                    run=run_id,
                    kind=spec.run.kind,
                    pid=pid,
                    pgid=pid,
                    proc_start=program.proc_start,
                    profile=spec.run.profile,
                    wakes=tuple(wakes),
                    turn=turn,
                ),
                causation=cause["id"] if cause else None,
            )
        except Exception as exc:  # a full disk; an event that fails validation
            log.exception("run.start_unrecorded", session=s.name, run=run_id, pid=pid)
            why = " ".join(str(exc).split())
            self.unrecorded[run_id] = f"run.started could not be recorded: {why[:500]}"
            await program.stop("run.started could not be recorded")
            return False
        return True

    async def _unrecorded(self, program: Program, run_id: str) -> Outcome:
        """How a run whose run.started could not be recorded ended: failed, with
        why. Its program was stopped by us, which reads as ``interrupted``: a stop
        someone asked for, retried at once and counted against no retry, so an
        event that always fails validation retried the session every 0.5 s forever
        ("retry 0 of 0"). A failure follows ``retries``, then blocks."""
        outcome = await program.wait()
        why = self.unrecorded.pop(run_id, "run.started could not be recorded")
        return replace(outcome, status="failed", error=why)


def _turn_and_wakes(state: State, cause: Record | None) -> tuple[int, list[RunWake]]:
    """The turn a run does and the wakes it sees (docs/design.md section 8). A later run of
    the open turn sees the turn's own wake cause, not what continued it (an approval,
    a retry): the same path every run. A new turn takes the wakes recorded until now."""
    if state.turn is not None:
        return state.turn["n"], list(state.turn["wakes"])
    trigger = cause["data"]["trigger"] if cause else "follow-up"
    wakes: list[RunWake] = [
        {"trigger": w["trigger"], "details": w["details"], "seq": w["seq"], "ts": w["ts"]}
        for w in state.pending_wakes
    ] or [{"trigger": trigger, "details": cause["data"]["details"] if cause else {}}]
    return state.turn_number + 1, wakes
