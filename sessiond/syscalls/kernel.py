"""The Kernel: every syscall, the one object the RPC server and the daemon talk to.

Every syscall is one of docs/design.md section 3. Each appends its events and has
the visible effect the design names. The RPC server (sessiond.ipc.server) only
decodes requests and calls these; tests may call them directly.

The syscalls live by family (syscalls.inspection, .control, .lineage,
.approvals) and the run machinery below them (sessiond.runs); the Kernel wires
them and binds each syscall to its own name here, so that its callers see one
object whatever the split.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from sessiond.config import DaemonConfig
from sessiond.errors import Refused
from sessiond.listing import Listing
from sessiond.log.store.base import Record, Store
from sessiond.notify import Notices
from sessiond.replies import Draining, NodeMove, SessionDetail, WaitingSession, WebLogin, Who
from sessiond.runs.context import RunContext, TriggerHooks
from sessiond.runs.faults import NO_FAULTS, Faults
from sessiond.runs.floor import Runs
from sessiond.runs.sdk_calls import SdkCalls
from sessiond.runs.tokens import Tokens
from sessiond.syscalls.approvals import Approvals
from sessiond.syscalls.control import Control
from sessiond.syscalls.handover import Handovers
from sessiond.syscalls.inspection import Inspection
from sessiond.syscalls.lineage import Lineage
from sessiond.syscalls.logins import Logins
from sessiond.syscalls.models import Models, ModelsSource
from sessiond.syscalls.observe import Observe
from sessiond.syscalls.output import RunOutput
from sessiond.syscalls.retention import Retention
from sessiond.syscalls.seams import ONE_MACHINE, Seams
from sessiond.table.scheduler import Scheduler
from sessiond.table.sessions import Session, Table


class Kernel:
    """``seams``: what a cluster node changes (sessiond.syscalls.seams), given here
    and never swapped later; ``notices``: the notification targets, if any;
    ``triggers``: makes the wake sources of this kernel (the daemon's), if any."""

    def __init__(  # noqa: PLR0915 - one attribute per syscall family
        self,
        config: DaemonConfig,
        table: Table,
        env: dict[str, str],
        seams: Seams = ONE_MACHINE,
        *,
        notices: Notices | None = None,
        triggers: Callable[[Kernel], TriggerHooks] | None = None,
        faults: Faults = NO_FAULTS,
        model_source: ModelsSource | None = None,
    ) -> None:
        self.ctx = ctx = RunContext(config, table, env, faults)
        self.table: Table = table
        self.store: Store = table.store
        self.tokens = Tokens(table)
        self.runs = runs = Runs(ctx, self.tokens)
        self.models_view = Models(ctx, model_source)  # the model gateway's queue, if any
        self.inspection = Inspection(ctx, seams.placement, self.models_view)
        self.control = Control(ctx, runs, seams.placement)
        self.handover = Handovers(ctx)
        self.lineage = Lineage(ctx, runs, self.handover, seams.mail)
        self.approvals = Approvals(ctx, runs)
        self.retention = Retention(ctx)
        elsewhere = seams.mail.exists if seams.mail is not None else None
        self.sdk = sdk = SdkCalls(ctx, self.tokens, self.lineage.send, elsewhere)
        self.logins = Logins(config.state_dir)  # the web console's (docs/design.md section 11)

        # inspection
        self.ping = self.inspection.ping
        self.ps = self.inspection.ps
        # a cluster node's (sessiond.cluster.lease); refused on one machine
        nodes = seams.nodes
        self.nodes: Callable[..., Awaitable[Any]] = (
            nodes.nodes if nodes is not None else _not_a_node
        )
        self.migrate_node: Callable[..., Awaitable[NodeMove]] = (
            nodes.migrate_node if nodes is not None else _not_a_node
        )
        self.drain: Callable[..., Awaitable[Draining]] = (
            nodes.drain if nodes is not None else _not_a_node
        )
        self.show: Callable[[str], Awaitable[SessionDetail | WaitingSession]]
        self.show = self.inspection.show
        self.log_ = self.inspection.log_
        self.replay = self.inspection.replay
        self.gate = self.inspection.gate
        self.models = self.models_view.models
        # the lifecycle
        self.create = self.control.create
        self.create_spec = self.control.create_spec
        self.check_spec = self.control.check_spec
        self.activate = self.control.activate
        self.suspend = self.control.suspend
        self.resume = self.control.resume
        self.interrupt = self.control.interrupt
        self.cancel = self.control.cancel
        # lineage, context, bundles
        self.fork = self.lineage.fork
        self.merge = self.lineage.merge
        self.send = self.lineage.send
        self.migrate = self.lineage.migrate
        self.compact = self.lineage.compact
        self.export = self.lineage.export
        self.import_ = self.lineage.import_
        # the hand-over between daemons (migrate --to)
        self.handover_finish = self.handover.finish
        self.handover_abort = self.handover.discard
        self.handover_status = self.handover.status
        # answers
        self.approve = self.approvals.approve
        self.deny = self.approvals.deny
        self.resolve = self.handover.resolving(self.approvals.resolve)  # arriving: there
        self.apply = self.approvals.apply
        # notifications, traces, the stored spec (section 11)
        self.observe = Observe(ctx, notices)
        self.output = RunOutput(ctx, self.tokens).output  # a run's stdout/stderr
        self.gc = self.retention.gc  # [retention] (docs/design.md section 6)
        # the SDK (a running program's calls)
        self.check_token = self.tokens.check
        self.sdk_context = sdk.sdk_context
        self.sdk_step = sdk.sdk_step
        self.sdk_step_done = sdk.sdk_step_done
        self.sdk_verify = sdk.sdk_verify
        self.sdk_send = sdk.sdk_send
        self.sdk_end = sdk.sdk_end
        # the run machinery (the triggers and the daemon)
        self.stop_run = runs.stop_run
        self.spawn = ctx.spawn
        # the wake sources last: they read the syscalls above
        ctx.triggers = triggers(self) if triggers is not None else None

    async def wake(
        self,
        s: Session,
        trigger: str,
        # a wake's details: each trigger kind's own (recorded in session.woken)
        details: dict[str, Any],
        paths: frozenset[str] = frozenset(),
    ) -> Record:
        """Record a wake; continue now if the session is idle and has a program."""
        return await self.runs.wake(s, trigger, details, paths)

    async def ps_listed(
        self,
        listing: Listing,
        footer: bool = False,
    ) -> Any:
        """``ps``: the rows ``listing`` asks for, in its order (filtered here, not by
        the client: a table of thousands is not sent to be dropped). ``self.ps`` is
        the inspection's: a cluster node's placement adds the sessions no live node
        runs. With ``footer``: how many terminated rows hid, and every name seen."""
        rows = await self.ps()
        kept, hidden = listing.apply(rows, self.store.clock() / 1e9)
        if not footer:
            return kept
        return {"rows": kept, "hidden": hidden, "known": [r["name"] for r in rows]}

    async def web_login(self, who: Who | None) -> WebLogin:
        """`sessionctl web`: a login for the calling user, and the URL that uses it."""
        if who is None:  # a request carried from another node without its asker
            raise Refused("a console login is made for the user who asks; this request names none")
        return self.logins.login(self.config.web, self.logins.port, who)

    # The parts read these from the shared context; they change by what happens
    # (a reload, a shutdown), never by rewiring.

    @property
    def config(self) -> DaemonConfig:
        return self.ctx.config

    def reconfigure(self, config: DaemonConfig) -> None:
        """A reload: the parts read the new configuration from here on."""
        self.ctx.config = config

    @property
    def triggers(self) -> TriggerHooks | None:
        return self.ctx.triggers

    @property
    def stopping(self) -> bool:
        return self.ctx.stopping

    def shut(self) -> None:
        """Shutdown: nothing new starts from here on."""
        self.ctx.stopping = True

    @property
    def model_source(self) -> ModelsSource | None:
        return self.models_view.source

    @property
    def scheduler(self) -> Scheduler:
        return self.ctx.scheduler


async def _not_a_node(*_args: object, **_kwargs: object) -> NoReturn:
    raise Refused(
        "this sessiond is not a cluster node: it keeps its sessions in files; "
        "set [cluster] dsn in its configuration to make it one"
    )
