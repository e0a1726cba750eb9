"""The daemon: the one place where the parts are wired together.

Start-up: configuration → state dir (writable, owner-only) → the lock (one
daemon per state dir) → the process table rebuilt from the logs → sessions cut
off by a crash recorded → specs from the spec folder → the socket. Then it
serves until SIGTERM (graceful stop) and re-reads configuration and specs on
SIGHUP or ``sessionctl reload``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import uvloop

from sessiond import __version__, logs
from sessiond.cluster.lease import LEASE_LOST_EXIT, make_store
from sessiond.config import BadConfig, DaemonConfig, load_config
from sessiond.daemon.early import agrees
from sessiond.daemon.faults import faults, io_hooks
from sessiond.daemon.opening import Opening, collected, opening_of
from sessiond.daemon.statedir import (
    StartupError,
    check_writable,
    mask_key,
    raise_file_limit,
    take_lock,
)
from sessiond.daemon.systemd import Notifier, activated_socket
from sessiond.errors import DatabaseUnavailable, Fenced, SessiondError
from sessiond.gateway.view import QueueView
from sessiond.ipc.server import Server
from sessiond.log.store.durable import write_durable
from sessiond.notify import Notices
from sessiond.otel import Traces
from sessiond.replies import Reloaded, Synced
from sessiond.runs.cgroups import BadCgroupConfig, run_prefix, sweep
from sessiond.runs.leftovers import kill_marked
from sessiond.runs.secrets import known as known_secrets
from sessiond.runs.subreaper import adopt_orphans
from sessiond.syscalls.kernel import Kernel
from sessiond.syscalls.seams import ONE_MACHINE
from sessiond.table.sessions import Session, Table
from sessiond.table.spec import BadSpec, load_spec_file, spec_to_toml
from sessiond.wake.triggers import Triggers, wall_clock
from sessiond.wire import leave_last_word

if TYPE_CHECKING:
    from sessiond.cluster.forward import Forward
    from sessiond.cluster.node import ClusterNode
    from sessiond.gateway.sched import Scheduler
    from sessiond.gateway.server import Gateway
    from sessiond.ipc.early import Early

log = structlog.get_logger(__name__)


CLEAN_MARKER = "clean-shutdown"
SWITCH_INTERVAL = 0.001  # seconds (see run)


def web_metrics() -> Any:
    """The console's metrics (prometheus-client is imported only when it is on)."""
    from sessiond.web.metrics import Metrics

    return Metrics()


class Daemon:
    def __init__(
        self, config: DaemonConfig, env: dict[str, str], early: Early | None = None
    ) -> None:
        self.config = config
        self.env = env
        # the early server (sessiond.daemon.early): its socket, once serving here
        self.early = early
        offset_ns = int(config.clock_offset * 1e9)
        hooks = io_hooks(config)
        # the web console and its /metrics (docs/design.md section 11): only when configured
        self.metrics = metrics = web_metrics() if config.web.listen is not None else None
        if metrics is not None:
            hooks = dataclasses.replace(hooks, fsync_seconds=metrics.fsync.observe)
        # plain files, or a cluster node's database and its lease ([cluster] dsn)
        self.store, self.lease = make_store(config, lambda: time.time_ns() + offset_ns, hooks)
        self.cluster: ClusterNode | None = None
        if self.lease is not None:
            from sessiond.cluster.node import ClusterNode  # psycopg: the cluster extra

            self.cluster = ClusterNode(self.lease)
        self.table = Table(config, self.store)
        self.table.secret_values = lambda spec: known_secrets(spec, env)
        self.notices = Notices(config, self.table, self.store)

        def triggers(kernel: Kernel) -> Triggers:
            clock = wall_clock(config.clock_offset)
            return Triggers(kernel, clock, config.watch_step_ms, self.faults.hold)

        # the model's queue (docs/design.md, "The model gateway"), when providers are
        # set: made first, so that `models`, ps and show read it from their start
        # (the gateway, and aiohttp with it, is imported only then: a daemon without
        # models answers sooner without them)
        queue: Scheduler | None = None
        if config.model.enabled:
            from sessiond.gateway.server import queue_of

            queue = queue_of(config)
        source = (
            QueueView(queue, lambda: self.kernel.ctx.config.model.provider)  # after a reload too
            if queue is not None
            else None
        )

        self.faults = faults(config)
        self.kernel = Kernel(
            config,
            self.table,
            env,
            self.cluster.seams if self.cluster is not None else ONE_MACHINE,
            notices=self.notices,
            triggers=triggers,
            faults=self.faults,
            model_source=source,
        )
        assert isinstance(self.kernel.triggers, Triggers)
        self.triggers: Triggers = self.kernel.triggers
        self.table.next_wake_fn = self.triggers.next_wake
        self.opening = opening_of(self.table, self.store, self.lease, self.triggers, self.resume)
        self.failure: BaseException | None = None  # what ended a start-up in the background
        # a cluster node's carried requests: any node's socket serves the whole cluster
        self.forward: Forward | None = None
        if self.cluster is not None:
            self.forward = self.cluster.forwarding(self)
        hints = self.forward.hints if self.forward is not None else None
        self.server = Server(config, self.kernel, self.reload, router=self.forward, follows=hints)
        # the programs' own socket (docs/design.md section 8): never the control socket
        self.program_server = Server(
            config, self.kernel, self.reload, endpoint="program", router=self.forward, follows=hints
        )
        self.web: Any = None
        if metrics is not None:
            from sessiond.web.server import WebServer

            metrics.watch(self.table)
            # on a cluster node its table, inbox and actions are the whole cluster's
            self.web = WebServer(config.web, self.kernel, metrics, self.forward, hints)
        self.gateway: Gateway | None = None
        if queue is not None:
            from sessiond.gateway.server import Gateway

            self.gateway = Gateway(self.kernel, queue)
        self.stopping = asyncio.Event()
        self.notifier = Notifier(env)
        self.traces = Traces(config, self.table)
        self._heartbeat: asyncio.Task[None] | None = None

    async def _start_web(self) -> None:
        if self.web is None:
            return
        try:
            await self.web.start()
        except OSError as exc:
            raise StartupError(
                f"the web console cannot listen on {self.config.web.listen}: "
                f"{exc.strerror or exc}; change [web] listen or free the port"
            ) from exc

    async def _start_gateway(self) -> None:
        if self.gateway is None:
            return
        try:
            await self.gateway.start()
        except OSError as exc:
            raise StartupError(
                f"the model gateway cannot listen on {self.config.model.listen}: "
                f"{exc.strerror or exc}; change [model] listen or free the port"
            ) from exc

    async def start(self) -> None:
        marker = self.config.state_dir / CLEAN_MARKER
        clean = marker.exists()
        marker.unlink(missing_ok=True)
        # What a crashed daemon left in the page cache must be durable before
        # anything acts on it. One sync of the file system does that for every
        # log at once; an fsync per log costs a journal commit each (seconds with
        # thousands of sessions). After a clean stop there is nothing to sync.
        if not clean:
            os.sync()
        mask_key(self.config)  # before anything is masked
        self.store.sync_on_recover = False
        # Loading makes millions of long-lived objects; the cyclic collector would
        # scan them again and again for nothing. Collect once after, then freeze
        # them out of its way (the process table lives as long as the daemon).
        gc.disable()
        opening = self.opening
        try:
            # A create, fork or import cut off by the crash left a folder that never
            # became a session (the rename is the commit): nothing to keep.
            for entry in self.store.remove_leftovers():
                log.warning("leftover.removed", folder=entry)
            if self.lease is not None:
                await self.lease.start()
            # from the index: only what it cannot vouch for now, the rest after serving
            # (read once, by the early server where it served: sessiond.table.indexfile.Read)
            read = self.early.take_read() if self.early is not None else None
            await self.table.load(opening.plan(read) if opening is not None else None)
        finally:
            if opening is None:
                collected()
        if opening is None:  # (from the index: once every session is open, _open_rest)
            self.store.sync_on_recover = True
            # before anything appends: what the logs hold since each target's cursor
            self.notices.start()  # is queued, then every append reaches the targets
        self.traces.start()
        await self._clear_leftovers()
        self.kernel.ctx.spawner.start()
        if self.lease is not None:  # its programs stop before its lease can lapse
            self.lease.fence_programs(self.kernel.ctx.spawner.fence)
        await self._start_gateway()  # before any run starts: runs get its address
        cut_off = await self.kernel.runs.recover_cut_off_runs()
        await self.kernel.handover.recover()  # hand-overs a crash left half recorded
        if opening is None:
            await self._sync_specs_logged()
        self.triggers.arm_all()
        self._resume_waiting(cut_off)
        if opening is None:  # before the socket: `sessionctl web` needs its port (which
            await self._start_web()  # waits, from the index, for the whole start-up)
        if self.cluster is not None and self.forward is not None:
            # from now on: take over what dead nodes leave, deliver messages, carry
            # requests (nothing awaits in between: no request comes before)
            self.cluster.start(self, self.forward, self.server.dispatch)
        await self.faults.hold("serve", "")  # tests: the early server alone answers
        await self.server.start(activated_socket(self.env), early=self.early)
        await self.program_server.start()
        self.kernel.handover.resume()  # tell the targets, ask the sources (both serve now)
        for sig, handler in (
            (signal.SIGTERM, self.stopping.set),
            (signal.SIGINT, self.stopping.set),
            (signal.SIGHUP, lambda: asyncio.ensure_future(self.reload())),
        ):
            asyncio.get_running_loop().add_signal_handler(sig, handler)
        self.table.recovered.set()
        if opening is None:
            self._ready()
            return
        log.info("daemon.serving", sessions=len(self.table), opening=len(self.table.pending))
        opening.begin(self._open_rest(opening), self.stopping)

    async def _open_rest(self, opening: Opening) -> None:
        """The start-up's rest, from the index, then the background load: a failure
        ends it as it ended before."""
        try:
            await opening.open_to_recover(
                self.faults, lambda: self.notices.behind(opening.pending_ends())
            )
            # every log read since each cursor (a session not opened yet: up to its
            # entry's end, which no target is behind), then it listens
            self.notices.start(opening.pending_ends())
            await self._sync_specs_logged()
            await self._start_web()  # a page that needs every session waits for them
            self._ready()
            await opening.open_rest(self.faults)
            log.info("daemon.loaded", sessions=len(self.table))  # every session open
        except Exception as exc:
            log.exception("daemon.start_failed")
            self.failure = exc
            self.stopping.set()

    async def _sync_specs_logged(self) -> None:
        if self.config.specs is not None:
            for error in (await self.sync_specs())["errors"]:
                log.error("spec.refused", error=error)

    def _ready(self) -> None:
        self.table.set_ready()
        states = self._states()
        log.info(
            "daemon.ready",
            version=__version__,
            sessions=sum(states.values()),
            unopened=len(self.table.pending),  # proven by the index, opened after
            **states,
        )
        self.notifier.ready(self.status_line())
        self._heartbeat = asyncio.ensure_future(self._beat())
        self.kernel.retention.start()  # a gc every [retention] interval, if set

    async def _clear_leftovers(self) -> None:
        """What a dead daemon's runs left goes before any new run starts."""
        # A dead daemon's spawner kills its runs itself; what is left carries the
        # run marker because that spawner died too. Nothing of it may go on.
        run_user = self.config.run.identity()
        run_uid = run_user[0] if run_user is not None else None
        for pid, mark in kill_marked(self.config.state_dir, run_uid).items():
            log.warning("leftover.killed", pid=pid, run=mark)
        # The run cgroups a dead daemon left (whatever is in them, marked or not) go
        # too. Before the spawner starts: a daemon in its own delegated group moves
        # into a leaf of it, and must take only itself there.
        await self._sweep_cgroups()
        adopt_orphans()  # a run that kills its holder and spawner leaves nothing outside

    async def _sweep_cgroups(self) -> None:
        try:
            support, note = self.kernel.ctx.cgroups()
        except BadCgroupConfig as exc:  # refused again, with the reason, where it matters
            log.error("cgroups.unusable", error=str(exc))
            return
        if support is None:
            log.info("cgroups.none", why=note)
            return
        prefix = run_prefix(self.config.state_dir)
        try:
            swept = await asyncio.to_thread(sweep, support, prefix)
        except (SessiondError, OSError) as exc:
            log.error("cgroups.sweep_failed", error=str(exc))
            return
        for name in swept:
            log.warning("leftover.cgroup_removed", cgroup=name)
        log.info("cgroups.used", cgroup2=str(support.cgroup2), pids=support.pids)

    def _resume_waiting(self, cut_off: list[Session]) -> None:
        """Timers live in memory: after a restart, re-derive them from each state.

        A session whose run the crash cut off, and a sleeping one with recorded
        wakes (a retry, a cool-down, wakes that came while it ran), continue once
        through the gate, with no new wake: a wake added here would count as work
        not yet done and run the program once more after the turn. A session
        suspended for its daily budget waits for 00:00 UTC again.
        """
        names = {s.name for s in cut_off}
        for s in self.table:
            self.resume(s, cut_off=s.name in names)

    def resume(self, s: Session, *, cut_off: bool) -> None:
        """One session of :meth:`_resume_waiting` (also one a cluster node took over)."""
        if s.journal_or_none is None:
            return
        state = s.journal.state
        if cut_off or (
            s.state == "sleeping"
            and (
                state.pending_wakes
                or state.until
                or "retry" in state.reason
                or state.turn is not None  # an unfinished turn continues once
            )
        ):
            self.kernel.spawn(self.kernel.runs.continue_turn(s))
        elif s.state == "suspended" and state.reason.startswith("budget: runs_per_day"):
            self.kernel.runs.renew_at_midnight(s)

    def _states(self) -> dict[str, int]:
        """Sessions by state: the open ones', and the rows of those not opened yet."""
        states: dict[str, int] = {}
        for s in self.table:
            states[s.state] = states.get(s.state, 0) + 1
        for row in self.table.pending.values():
            states[row["state"]] = states.get(row["state"], 0) + 1
        return states

    def status_line(self) -> str:
        """One line for systemd's STATUS=: sessions by state."""
        states = self._states()
        parts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        return f"{sum(states.values())} sessions" + (f": {parts}" if parts else "")

    async def _beat(self) -> None:
        """WATCHDOG=1 at half of WatchdogSec (and a fresh STATUS= with it)."""
        interval = self.notifier.watchdog_interval or 10.0
        while True:
            await asyncio.sleep(interval)
            if self.notifier.watchdog_interval is not None:
                self.notifier.watchdog()
            self.notifier.status(self.status_line())

    async def sync_specs(self) -> Synced:
        """Create sessions for new spec files, update changed ones, never drop one."""
        folder = self.config.specs
        result: Synced = {"created": [], "updated": [], "unchanged": 0, "errors": []}
        if folder is None or not folder.is_dir():
            if folder is not None:
                result["errors"].append(f"spec folder {folder} does not exist")
            return result
        for path in sorted(folder.glob("*.toml")):
            try:
                spec, _ = load_spec_file(path)
            except BadSpec as exc:
                result["errors"].append(str(exc))
                continue
            text = spec_to_toml(spec)
            if spec.name in self.table.pending and self._stored_spec(spec.name) == text:
                result["unchanged"] += 1  # compared with its stored spec: left unopened
                continue
            await self.table.ensure(spec.name)  # one not opened yet: opened to change it
            existing = self.table.sessions.get(spec.name)
            if existing is None:
                try:
                    await self.kernel.create_spec(spec)
                except SessiondError as exc:
                    result["errors"].append(f"{path}: {exc}")
                    continue
                result["created"].append(spec.name)
                continue
            if existing.spec_text == text:
                result["unchanged"] += 1
                continue
            try:  # refused as create would refuse it; the session keeps the spec it has
                self.kernel.check_spec(spec)
            except SessiondError as exc:
                result["errors"].append(f"{path}: {exc} (the session keeps its current spec)")
                continue
            self.store.write_spec(spec.name, text)
            existing.spec, existing.spec_text = spec, text
            if existing.journal_or_none is not None:
                self.triggers.rearm(existing)
            result["updated"].append(spec.name)
            log.info("spec.updated", session=spec.name, source=str(path))
        return result

    def _stored_spec(self, name: str) -> str | None:
        """The spec a session not opened yet keeps (what opening it would read as
        its ``spec_text``); None when it cannot be read (it is opened, and says why)."""
        try:
            return self.store.read_spec(name)
        except SessiondError:
            return None

    async def reload(self) -> Reloaded:
        """SIGHUP / `sessionctl reload`: re-read configuration and specs."""
        await self.table.ready.wait()  # (a SIGHUP during the background load: after it)
        self.notifier.reloading()
        try:
            return await self._reload()
        finally:
            self.notifier.reloaded(self.status_line())

    async def _reload(self) -> Reloaded:
        notes: list[str] = []
        source = self.config.source
        if source is not None:
            try:
                fresh = load_config(source, env=self.env)
            except BadConfig as exc:
                log.error("config.refused", error=str(exc))
                raise
            # the open logs have theirs; the web console keeps its listener; the
            # fault points were built at start-up (daemon/faults.py)
            kept = ("state_dir", "socket", "sync_interval", "web", "fault", "fault_hold",
                    "fault_hold_until")  # fmt: skip
            for key in kept:
                if getattr(fresh, key) != getattr(self.config, key):
                    notes.append(f"{key} changes take effect at the next start")
            fresh = fresh.model_copy(update={k: getattr(self.config, k) for k in kept})
            old_run = self.config.run
            if (fresh.run.user, fresh.run.group) != (old_run.user, old_run.group):
                # the sockets' ACLs name the user: it changes with them, at the next start
                notes.append("[run] user and group changes take effect at the next start")
                run = fresh.run.model_copy(update={"user": old_run.user, "group": old_run.group})
                fresh = fresh.model_copy(update={"run": run})
            if fresh.notify != self.config.notify:
                notes.append("[[notify]] changes take effect at the next start")
            self.server.reconfigure(fresh)
            self.program_server.reconfigure(fresh)
            self.config = fresh
            self.table.config = fresh
            self.kernel.reconfigure(fresh)
            scheduler = self.kernel.scheduler
            scheduler.max_running = fresh.max_running
            scheduler.per_agent = fresh.max_running_per_agent
            scheduler.aging = fresh.aging
        self.kernel.retention.start()  # the interval may have changed
        synced = await self.sync_specs()
        log.info("daemon.reloaded", created=synced["created"], updated=synced["updated"])
        return {**synced, "notes": notes}

    async def stop(self) -> None:
        """Stop accepting, ask running programs to stop, record, close the logs."""
        if self.lease is not None:
            # A node that was paused past its lease (SIGSTOP, then SIGTERM) may write
            # nothing more: it ends as a lost lease does (exit 75), not through a
            # graceful stop whose every append the fence refuses.
            self.lease.end_if_lapsed()
        self.notifier.stopping()
        self.kernel.shut()  # nothing new starts from here on
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self.kernel.retention.aclose()
        await self.server.stop_accepting()
        await self.program_server.stop_accepting()
        if self.web is not None:
            await self.web.close()
        running = [s for s in self.table if s.run is not None]
        log.info("daemon.stopping", running=len(running))

        async def stop_one(s: Session) -> None:
            try:
                await asyncio.wait_for(
                    self.kernel.stop_run(s, "shutdown"), self.config.shutdown_grace + 5
                )
            except Exception:  # record what we can for the others
                log.exception("stop.failed", session=s.name)

        await asyncio.gather(*(stop_one(s) for s in running))
        # Whatever did not stop in time goes with the spawner: it kills all it
        # started when its socket closes, and exits. Before the clean marker.
        await self.kernel.ctx.spawner.close(self.config.shutdown_grace + 5)
        if self.gateway is not None:  # after the runs: their last calls are recorded
            await self.gateway.close()
        if self.opening is not None:  # after the runs, before the timers: the index
            await self.opening.close()
        await self.triggers.close()  # after the runs: their ends re-arm `every` timers
        await self.notices.close()  # after the runs; what is undelivered goes at the next start
        await self.traces.close()
        await self.server.close()
        await self.program_server.close()
        await self.table.close()
        if self.cluster is not None:
            await self.cluster.close(self.forward)
        write_durable(self.config.state_dir / CLEAN_MARKER, b"clean\n")
        self.notifier.close()
        log.info("daemon.stopped")


async def serve(config: DaemonConfig, env: dict[str, str], early: Early | None = None) -> None:
    daemon = Daemon(config, env, early)
    await daemon.start()
    await daemon.stopping.wait()
    await daemon.stop()
    if daemon.failure is not None:
        raise daemon.failure


def run(
    config_path: Path | None,
    state_dir: Path | None,
    socket: Path | None,
    *,
    early: Early | None = None,
) -> int:
    """``early``: the early server the command started (it holds the state dir's
    lock and serves the socket until the full server takes it over)."""
    env = dict(os.environ)
    try:
        config = load_config(config_path, env=env, state_dir=state_dir, socket=socket)
    except BadConfig as exc:
        if early is not None:
            early.close(str(exc))
        print(f"sessiond: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_format, config.log_level)
    if early is not None and not agrees(early, config):  # a bug: start as without it
        log.error("early.disagrees", socket=str(early.config.socket))
        early.close(None)
        early = None
    try:
        check_writable(config)
        lock = early.lock if early is not None else take_lock(config.state_dir)
    except StartupError as exc:
        if early is not None:
            early.close(str(exc))
        print(f"sessiond: {exc}", file=sys.stderr)
        return 1
    raise_file_limit()
    # A worker thread (an export's compression, a snapshot's write) holds the GIL
    # at most this long while the loop waits for it (the default is 5 ms). (The
    # early server sets it back to this when the full server takes over.)
    if early is None:
        sys.setswitchinterval(SWITCH_INTERVAL)
    failed = "the daemon stopped before it served"
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(config, env, early))
    except Fenced as exc:  # the lease lapsed while stopping: as a lost lease ends
        print(f"sessiond: {exc}", file=sys.stderr)
        return LEASE_LOST_EXIT
    except DatabaseUnavailable as exc:  # a temporary failure (75): start it again later
        print(f"sessiond: {exc}", file=sys.stderr)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        leave_last_word(config.socket, f"at {stamp} the node could not start: {exc}")
        return LEASE_LOST_EXIT
    except SessiondError as exc:
        failed = str(exc)
        print(f"sessiond: {exc}", file=sys.stderr)
        return 1
    finally:
        if early is not None:  # not taken over (a failed start): its clients are told
            early.close(failed, keep_lock=True)
        os.close(lock)
    return 0
