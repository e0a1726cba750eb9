"""The lifecycle syscalls: create, activate, suspend, resume, interrupt, cancel.

Each moves one session through the transition table; the ones that act on a
running session ask its program to stop (runs.supervise) and let the run's
settle record the state, and activate and resume continue through the gate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from sessiond.errors import AlreadyExists, Refused
from sessiond.log.event_data import BindingObserved, SessionCreated, WakeRequested
from sessiond.replies import SessionDetail
from sessiond.runs.context import RunContext
from sessiond.runs.continuation import covered
from sessiond.runs.floor import Runs
from sessiond.runs.sandbox import spec_refusal
from sessiond.runs.workspace import workspace_hasher
from sessiond.syscalls.seams import Placement
from sessiond.syscalls.views import detail
from sessiond.table import lifecycle
from sessiond.table.sessions import Session
from sessiond.table.spec import BadSpec, SessionSpec, parse_spec, spec_to_toml

log = structlog.get_logger(__name__)


class Control:
    """Creating sessions and moving them through their lifecycle on request."""

    def __init__(self, ctx: RunContext, runs: Runs, placement: Placement | None = None) -> None:
        self.ctx = ctx
        self.runs = runs
        # a cluster node's: a session made here that may not run here goes on
        self.placement = placement

    def _usable(self, name: str) -> Session:
        """The session, refused with the reason when its log cannot be used (corrupt,
        a symlink planted in the state dir): its state reads "blocked", and "approve or
        resolve it" would send the operator the wrong way."""
        s = self.ctx.table.get(name)
        _ = s.journal  # raises Refused naming why there is no log
        return s

    async def _bind_hashes(self, s: Session) -> None:
        spec = s.spec
        if spec is None or not spec.bind.files:
            return
        hasher = workspace_hasher(spec)  # not through a link out of the workspace
        hashes = {f: hasher(f) for f in spec.bind.files}
        await self.ctx.table.append(s, BindingObserved(hashes=hashes))

    async def create(self, spec: str, base: str, source: str = "spec") -> SessionDetail:
        parsed = parse_spec(spec, base=Path(base), source=source)
        # the session itself, not the table's: on a cluster node it may be handed
        # to another node as soon as it is made (sessiond.cluster.placement)
        answer = detail(await self._create_here(parsed))
        moved = await self.placement.place(parsed.name) if self.placement else None
        return answer if moved is None else {**answer, "handed_to": moved}

    def check_spec(self, spec: SessionSpec) -> None:
        """What this daemon can run: ``check_environment`` with its own pids
        controller (a new spec at ``create``, and a changed one at ``reload``)."""
        needs_pids = spec.run is not None and spec.run.max_processes is not None
        check_environment(spec, pids_refusal=self.ctx.pids_refusal() if needs_pids else None)
        refusal = spec_refusal(self.ctx.config, spec)
        if refusal is not None:
            raise BadSpec(f"{spec.name}: {refusal}")

    async def create_spec(self, spec: SessionSpec) -> Session:
        """A new session from a parsed spec (the daemon's spec folder); on a cluster
        node, handed on when it may not run here."""
        s = await self._create_here(spec)
        if self.placement is not None:
            await self.placement.place(s.name)
        return s

    async def _create_here(self, spec: SessionSpec) -> Session:
        """A new session from a parsed spec, made on this node."""
        self.check_spec(spec)
        await self.ctx.table.ensure(spec.name)  # a session not opened yet exists too
        if spec.name in self.ctx.table.sessions:
            raise AlreadyExists(
                f"session {spec.name!r} exists already (a session's log keeps its name, "
                "also once it has terminated); give the spec another name"
            )
        text = spec_to_toml(spec)
        new_log = await self.ctx.store.create(
            spec.name, spec=text, durability=self.ctx.config.durability
        )
        await new_log.close()
        s = await self.ctx.table.open_session(spec.name)
        # Held until it is made and armed: once in the table, a cluster node's
        # placement may hand it over (at a stable point, under this lock), and a
        # hand-over that closed its log in the middle failed the create.
        async with s.lock:
            self.ctx.table.adopt(s)
            await self.ctx.table.append(
                s,
                SessionCreated(
                    name=spec.name,
                    goal=spec.goal,
                    description=spec.description,
                    agent=spec.agent,
                    priority=spec.priority,
                    labels=spec.labels,
                    profile=spec.run.profile if spec.run else "default",
                    spec=spec.model_dump(mode="json"),
                ),
            )
            await self._bind_hashes(s)
            if spec.has_triggers:
                await self.ctx.transition(
                    s, "sleeping", why="arm", reason="armed: waits for its triggers"
                )
            log.info("session.created", session=spec.name)
            if self.ctx.triggers is not None:
                self.ctx.triggers.rearm(s)
        return s

    # --- running ----------------------------------------------------------------------

    async def activate(self, name: str) -> SessionDetail:
        s = self._usable(name)
        async with s.lock:
            state = s.state
            if state == "running":
                raise Refused(f"session {name!r} is running already (pid {s.run and s.run.pid})")
            if state in ("suspended", "blocked"):
                lifecycle.check(name, state, "ready", "activate")
                hint = "resume it" if state == "suspended" else "approve or resolve it"
                raise Refused(f"cannot activate session {name!r}: it is {state}; {hint} first")
            lifecycle.check(name, state, "ready", "activate")
            if s.spec is None or s.spec.run is None:
                raise Refused(
                    f"session {name!r} has no [run] program to start; it can still be sent "
                    "messages, forked, merged and compacted"
                )
            # The wake goes to disk with the start's first commit (or the flush at
            # the block's end): activate answers only after either.
            async with covered(s, durable=False):
                wake = await self.ctx.table.append(
                    s, WakeRequested(trigger="manual"), durable=False
                )
                await self.runs.proceed(s, wake)
        return detail(s)

    # --- lifecycle syscalls -----------------------------------------------------------------

    async def suspend(self, name: str) -> SessionDetail:
        s = self.ctx.table.get(name)

        async def suspend_now() -> None:
            await self.ctx.transition(s, "suspended", why="suspend", reason="suspended by request")

        await self._stop(s, "suspend", suspend_now)
        return detail(s)

    async def resume(self, name: str) -> SessionDetail:
        s = self._usable(name)
        async with s.lock:
            if s.state != "suspended":
                raise Refused(f"cannot resume session {name!r}: it is {s.state}, not suspended")
            pending = s.journal.state.pending_wakes
            await self.ctx.transition(s, "sleeping", why="resume", reason="resumed")
            if pending and s.spec is not None and s.spec.run is not None:
                await self.runs.proceed(s, None)
        return detail(s)

    async def interrupt(self, name: str) -> SessionDetail:
        s = self.ctx.table.get(name)
        starting = s.name in self.ctx.scheduler.starting
        if not starting and (s.state != "running" or s.run is None):
            raise Refused(
                f"cannot interrupt session {name!r}: it is {s.state}, and only a running "
                "session can be interrupted"
            )

        async def interrupt_now() -> None:
            # Its start was under way and spawned nothing: it sleeps, its wakes pending.
            # (A start that ended otherwise, blocked or denied, has nothing to stop.)
            if s.state == "ready":
                await self.ctx.transition(
                    s, "sleeping", why="interrupt", reason="interrupted before its program started"
                )

        await self._stop(s, "interrupt", interrupt_now)
        return detail(s)

    async def cancel(self, name: str) -> SessionDetail:
        s = self.ctx.table.get(name)

        async def cancel_now() -> None:
            await self.ctx.transition(
                s, "terminated", why="cancel", reason="cancelled", outcome="cancelled"
            )

        await self._stop(s, "cancel", cancel_now)
        return detail(s)

    async def _stop(self, s: Session, why: str, change: Callable[[], Awaitable[None]]) -> None:
        """Stop the session's run, a starting one included, or, with no run, ``change``.

        A start holds the session's lock from the gate to the program's supervision.
        A stop asked for meanwhile is left where the start sees it (it then spawns
        nothing); once the lock is ours, the start is over: a program it spawned is
        supervised (``s.run``) and is stopped like any run, its settle recording the
        state asked for. Deciding on the state before taking the lock would let a
        start finish under a session already terminated: an orphan program whose
        events follow ``terminated``, holding a scheduler slot.
        """
        if s.name in self.ctx.scheduler.starting:
            s.stop_pending = why
            log.info("stop.pending", session=s.name, stop=why)
        async with s.lock:
            s.stop_pending = None
            run = s.run
            if run is None:
                await change()
                if self.ctx.scheduler.queue:  # a start that spawned nothing freed its slot
                    self.ctx.spawn(self.runs.dispatch())
                return
            # Read by the run's settle, which waits for this lock: it records the
            # state asked for even if the program ends before it is signalled.
            run.stop_requested = why
        await self.runs.stop_run(s, why)


def check_environment(spec: SessionSpec, *, pids_refusal: str | None = None) -> None:
    """What a spec names outside itself must exist: the workspace, and every git
    trigger's repository. (Watch paths may appear later: the workspace is watched,
    and a watch starts matching once its path exists.) ``pids_refusal`` says why
    the daemon cannot bound ``run.max_processes`` (None: it can)."""
    from sessiond.gitrefs import git
    from sessiond.table.spec import BadSpec, GitTriggerSpec

    if spec.run is not None and not Path(spec.run.cwd).is_dir():
        raise BadSpec(f"{spec.name}: run.cwd: {spec.run.cwd!r} is not a folder")
    if spec.run is not None and spec.run.max_processes is not None and pids_refusal:
        raise BadSpec(f"{spec.name}: run.max_processes: {pids_refusal}")
    for index, trig in enumerate(spec.trigger):
        if (
            isinstance(trig, GitTriggerSpec)
            and git(Path(trig.repo), "rev-parse", "--git-dir") is None
        ):
            raise BadSpec(
                f"{spec.name}: trigger[{index}].repo: {trig.repo!r} is not a git repository "
                "(create it with 'git init', or point repo at one)"
            )
