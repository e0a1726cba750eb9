"""What every part of the runs floor shares, and the one lifecycle transition.

The parts of ``runs/`` (continuation, start, supervise, settle, recover) and the
syscalls above them act on the same process table, scheduler, timers and
background tasks. They hold one ``RunContext`` for that instead of reaching into
each other's attributes. The configuration lives here too because a reload
replaces it: every part reads the current one.

``transition`` is the one way a session changes lifecycle state outside the log
floor's own folding: checked against the transition table, recorded as one
event, and the scheduler and the triggers told.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import structlog

from sessiond.codec import rfc3339
from sessiond.config import DaemonConfig, RunConfig
from sessiond.log.event_records import JsonObject
from sessiond.log.store.base import Record, Store
from sessiond.paths import gateway_socket
from sessiond.runs.cgroups import CgroupSupport, pids_refusal, probe
from sessiond.runs.faults import NO_FAULTS, Faults
from sessiond.runs.sandbox import Boundary, MountPlan
from sessiond.runs.spawner_client import SpawnerClient
from sessiond.table import lifecycle
from sessiond.table.scheduler import Scheduler
from sessiond.table.sessions import Session, Table
from sessiond.table.spec import SessionSpec

log = structlog.get_logger(__name__)


class TriggerHooks(Protocol):
    """What the runs floor and the syscalls tell the triggers (sessiond.wake)."""

    def rearm(self, s: Session) -> None: ...

    def disarm(self, name: str, *, restart: bool = True) -> None: ...

    def run_ended(self, s: Session) -> None: ...


class Continues(Protocol):
    """What the parts that end a run need of the continuation (runs.continuation):
    a new wake, a follow-up run, a free slot filled. Bound late: the continuation
    starts runs, and a run's end continues."""

    async def wake(
        self,
        s: Session,
        trigger: str,
        details: JsonObject,
        paths: frozenset[str] = frozenset(),
    ) -> Record: ...

    async def proceed(
        self, s: Session, cause: Record | None, paths: frozenset[str] = frozenset()
    ) -> bool: ...

    async def dispatch(self) -> None: ...


class RunContext:
    """The shared state of the runs floor: configuration, table, scheduler, timers."""

    def __init__(
        self, config: DaemonConfig, table: Table, env: dict[str, str], faults: Faults = NO_FAULTS
    ) -> None:
        self.config = config  # replaced on reload
        self.faults = faults  # where a crash test stops the daemon (none in production)
        self.table = table
        self.store: Store = table.store
        self.env = env
        self.runtime_dir: Path = config.state_dir / "runtime"
        # a retry's backoff, or a daily budget's renewal, per session
        self.retry_timers: dict[str, asyncio.TimerHandle] = {}
        self.background: set[asyncio.Task[Any]] = set()
        # the model gateway's address (http://127.0.0.1:port), once it listens
        # (gateway_listens): the runs started from then on get it
        self.gateway: str | None = None
        self.triggers: TriggerHooks | None = None  # sessiond.wake, made by the Kernel
        self.stopping = False  # set at shutdown: nothing new starts
        self.scheduler = Scheduler(config.max_running, config.max_running_per_agent, config.aging)
        self._cgroups: tuple[RunConfig, CgroupSupport | None, str] | None = None
        # every run's processes are started, held and reaped by it (runs/spawner.py)
        self.spawner = SpawnerClient()
        self.boundary = Boundary(config.state_dir)  # runs/sandbox.py

    async def confinement(
        self, s: Session, spec: SessionSpec, wake_file: Path | None = None
    ) -> MountPlan | None:
        """The sandbox every process started on ``s``'s behalf runs in (its program,
        and any other command for it: wrap it with ``runs.sandbox.confine`` and spawn
        it through the spawner); None when the operator turned the sandbox off.
        SandboxUnavailable (an OSError): the process must not start."""
        # every other workspace is hidden: a session not opened yet has one too, as
        # its index entry says (an entry of an older daemon says none: opened now)
        table = self.table
        for name in [n for n in table.pending if n not in table.pending_workspaces]:
            await table.ensure(name)
        others = [
            o.spec.workspace
            for o in table
            if o is not s and o.spec is not None and o.spec.run is not None
        ]
        others += [
            Path(w)
            for name, w in table.pending_workspaces.items()
            if w is not None and name in table.pending
        ]
        plan = await self.boundary.plan(
            self.config, spec, s.name, others=others, wake_file=wake_file
        )
        if (
            plan is not None
            and plan.network == "none"
            and self.gateway is not None
            and spec.model.allow  # a run that may call no model has no use for it
        ):
            # its own loopback: the gateway through a relay in the sandbox (runs.gwrelay)
            port = int(self.gateway.rpartition(":")[2])
            plan = replace(plan, relay=(str(gateway_socket(self.config.socket)), port))
        return plan

    def cgroups(self) -> tuple[CgroupSupport | None, str]:
        """The cgroups runs may use (sessiond.runs.cgroups) and, without any, why;
        probed once per configuration (a reload may point ``[run]`` elsewhere).
        Raises BadCgroupConfig when a configured folder cannot be used."""
        if self._cgroups is None or self._cgroups[0] is not self.config.run:
            support, note = probe(self.config)
            self._cgroups = (self.config.run, support, note)
        return self._cgroups[1], self._cgroups[2]

    def pids_refusal(self) -> str | None:
        """Why a spec's ``max_processes`` cannot be bounded here (None: it can)."""
        return pids_refusal(*self.cgroups())

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, keeping a reference until it is done."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def gateway_listens(self, address: str) -> None:
        """The model gateway listens at ``address`` (its port is known only once it
        is bound): every run started from now on gets it in its environment."""
        self.gateway = address

    def now(self) -> str:
        return rfc3339(self.store.clock())

    async def transition(
        self,
        s: Session,
        to: str,
        *,
        why: str,
        reason: str = "",
        outcome: str | None = None,
        causation: str | None = None,
        durable: bool = True,
    ) -> Record:
        """One lifecycle transition, checked and recorded."""
        event = lifecycle.change(s.name, s.state, to, why=why, reason=reason, outcome=outcome)
        record = await self.table.append(s, event, causation=causation, durable=durable)
        # the reason as recorded: masked like everything stored for the session
        log.info("lifecycle", session=s.name, to=to, reason=record["data"]["reason"])
        if to != "ready":
            self.scheduler.queue.pop(s.name, None)
        if to == "terminated" and self.triggers is not None:
            self.triggers.disarm(s.name)
        return record
