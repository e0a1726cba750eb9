"""A daemon as a node of a cluster (docs/design.md section 10): its store, its lease.

Which store the config asks for; the task that keeps the node's lease; taking
over what dead nodes leave; and the ``migrate --node`` and ``drain`` syscalls
(the kernel's :class:`~sessiond.syscalls.seams.Nodes` seam). psycopg is
imported only when ``[cluster] dsn`` is set, so a files-only install never
needs it.

A node that cannot renew its lease before last renewal + ``lease_ttl`` - a margin
(measured on the monotonic clock, whatever the database says meanwhile) ends at
once: its spawner then kills every run it started (its pipe to the daemon
closes), so no program of a node that may have lost its sessions goes on working
while another node takes them over. A supervisor (systemd) starts it again, as a
new incarnation that claims its sessions anew, through replay and the gate.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from sessiond.cluster.balance import Balancer
from sessiond.cluster.channels import Channels
from sessiond.cluster.coordination import Coordination
from sessiond.cluster.host import Node
from sessiond.cluster.placement import Placer, placement_for, refused
from sessiond.codec import Clock
from sessiond.config import DaemonConfig
from sessiond.errors import (
    InvalidInput,
    LogLocked,
    Refused,
    SessiondError,
    StorageError,
    recognise,
)
from sessiond.log.store.base import Store
from sessiond.log.store.files import FileStore, IOHooks
from sessiond.replies import Draining, NodeMove, NodeRow
from sessiond.table.sessions import Session
from sessiond.wire import leave_last_word

if TYPE_CHECKING:
    from sessiond.log.store.pg.pgstore import PgStore


log = structlog.get_logger("sessiond.cluster")

# Sessions a draining node hands over per step of its take-over loop (~1 s).
DRAIN_PER_STEP = 5

# What [cluster] node accepts (config.py).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# What a node whose lease is lost exits with (EX_TEMPFAIL: start it again).
LEASE_LOST_EXIT = 75


def make_store(
    config: DaemonConfig, clock: Clock, hooks: IOHooks
) -> tuple[Store, LeaseKeeper | None]:
    """Plain files, or the cluster's database and the node's lease when
    ``[cluster] dsn`` is set."""
    cluster = config.cluster
    if cluster.dsn is None:
        files = FileStore(
            config.state_dir, clock=clock, hooks=hooks, sync_interval=config.sync_interval
        )
        return files, None
    try:
        import psycopg

        from sessiond.cluster.once import keys_of
        from sessiond.cluster.pg.channels import pg_channels
        from sessiond.cluster.pg.coordination import PgCoordination
        from sessiond.log.store.pg.pgstore import PgStore
        from sessiond.log.store.pg.schema import SchemaMismatch
    except ImportError as exc:
        raise InvalidInput(
            "[cluster] dsn is set but psycopg is not installed: install sessiond with the "
            "'cluster' extra (pip install 'sessiond[cluster]')"
        ) from exc
    from sessiond.log.store.pg.reach import is_gone, recogniser, unavailable, where

    recognise(recogniser(cluster.dsn, cluster.node))  # its errors, said as such
    try:
        store = PgStore(
            cluster.dsn,
            node=cluster.node,
            lease_ttl=cluster.lease_ttl,
            prepared=cluster.prepared,
            labels=cluster.labels,
            clock=clock,
            local_dir=Path(config.state_dir) / "sessions",
            placement_for=placement_for(cluster.node, cluster.shared_paths),
            keys_of=keys_of,
        )
    except SchemaMismatch as exc:
        raise InvalidInput(str(exc)) from exc
    except psycopg.Error as exc:
        if is_gone(exc):  # a temporary failure: the node exits 75, to be started again
            raise unavailable(cluster.dsn, cluster.node, exc) from exc
        why = " ".join(str(exc).split())  # one line: libpq's reasons span several
        raise StorageError(f"cannot use the cluster's database ([cluster] dsn): {why}") from exc
    keeper = LeaseKeeper(
        store,
        PgCoordination(store),
        channels=pg_channels(store, prepared=cluster.prepared),
        socket=config.socket,
        database=where(cluster.dsn),
        placement_interval=cluster.placement_interval,
        moves_per_interval=cluster.moves_per_interval,
    )
    return store, keeper


def _check_node(name: str) -> None:
    """A node name as ``[cluster] node`` takes it, or a refusal that says so (not a
    search of the nodes for a name that cannot be one)."""
    if not NODE_NAME.fullmatch(name):
        shown = name if len(name) <= 64 else name[:64] + "…"
        raise InvalidInput(
            f"{shown!r} is not a node name (1-64 letters, digits, '.', '_' or '-'); "
            "`sessionctl nodes` lists them"
        )


def _at_stable_point(s: Session, queued: bool = False) -> None:
    """Refuse to hand ``s`` over while a run is on or about to start; with
    ``queued``, one waiting ``ready`` for a slot may go (placement by load: it holds
    nothing yet, and the next node's gate decides again)."""
    if s.run is not None or s.state == "running" or (s.state == "ready" and not queued):
        raise Refused(
            f"session {s.name!r} is {s.state}: it is handed over at a stable point; "
            "interrupt it, or try again when it sleeps"
        )


def margin(ttl: float) -> float:
    """How long before its lease may lapse a node gives up: a fifth of it, at most 2 s."""
    return min(2.0, ttl / 5)


class LeaseKeeper:
    """Renews the node's lease every third of ``lease_ttl``; ends the node when it
    cannot."""

    def __init__(
        self,
        store: PgStore,
        coordination: Coordination,
        *,
        channels: Channels,
        socket: Path | None = None,
        database: str = "",
        placement_interval: float = 2.0,
        moves_per_interval: int = 0,
    ) -> None:
        self.store = store
        self.coordination = coordination  # what the nodes agree on beside the store
        self.channels = channels  # how they reach each other (the node's parts use them)
        self.socket = socket  # beside it, the last word when the lease is lost
        self.database = database  # named in that last word
        self.last_error = ""  # why the last renewal failed, if it did
        self._task: asyncio.Task[None] | None = None
        self._takeover: asyncio.Task[None] | None = None
        self._fence: Callable[[float], None] | None = None
        self._node: Node | None = None
        # placement by load (cluster/balance.py): started with the take-over
        self.balancer = Balancer(
            coordination,
            lambda s, to, queued: self._hand_over(s, to, queued=queued),
            interval=placement_interval,
            moves=moves_per_interval,
        )
        # the kernel's placement seam: it acts once take_over has started it
        self.placer = Placer(
            coordination,
            store,
            lambda s, to: self._hand_over(s, to, release=True),
            self.balancer,
        )
        self._closing = threading.Event()  # a clean stop lets go of the lease itself
        self._watchdog: threading.Thread | None = None

    async def start(self) -> None:
        await self.store.connect()  # registers: a new incarnation
        log.info(
            "cluster.joined",
            node=self.store.lease.name,
            incarnation=self.store.lease.incarnation,
            lease_ttl=self.store.lease.ttl,
        )
        self._task = asyncio.ensure_future(self._keep())
        # The deadline is kept by a thread too: the loop may be stuck in a query the
        # database never answers (a synchronous read of a log, on a connection a
        # partition left open), and then _keep never runs to see it.
        self._watchdog = threading.Thread(target=self._watch, name="lease-deadline", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        lease = self.store.lease
        while not self._closing.is_set():
            left = lease.deadline(margin(lease.ttl)) - time.monotonic()
            if left <= 0:
                self._lost("the lease could not be renewed before its deadline (watchdog)")
            self._closing.wait(min(left, 0.1))

    async def _keep(self) -> None:
        lease = self.store.lease
        step = lease.ttl / 3
        pool = await self.store.connect()
        while True:
            await asyncio.sleep(
                min(step, max(lease.deadline(margin(lease.ttl)) - time.monotonic(), 0))
            )
            try:
                renewed = await asyncio.wait_for(lease.renew(pool), timeout=step)
            except Exception as exc:  # unreachable, slow: try again until the deadline
                log.warning("cluster.renew_failed", error=repr(exc))
                self.last_error = " ".join(str(exc).split()) or type(exc).__name__
                renewed = None
            if renewed:
                self._tell_fence()
            if renewed is False:
                self._lost("the lease had lapsed when it was renewed")
            if time.monotonic() >= lease.deadline(margin(lease.ttl)):
                self._lost("the lease could not be renewed before its deadline")

    def fence_programs(self, fence: Callable[[float], None]) -> None:
        """Tell ``fence`` (the spawner's) the deadline of this node's programs now
        and after every renewal: last renewal + lease_ttl - the margin."""
        self._fence = fence
        self._tell_fence()

    def _tell_fence(self) -> None:
        if self._fence is not None:
            self._fence(self.store.lease.deadline(margin(self.store.lease.ttl)))

    def take_over(self, node: Node) -> None:
        """From now on, look for sessions dead nodes left, and take them; serve
        ``migrate --node`` and ``drain``."""
        self._node = node
        self.placer.start(node)
        self._takeover = asyncio.ensure_future(self._take_over(node))
        self.balancer.start(node)

    async def nodes(self) -> list[NodeRow]:
        """``sessionctl nodes``: the cluster's nodes (docs/design.md section 10)."""
        return await asyncio.to_thread(self.coordination.nodes)

    async def migrate_node(
        self,
        name: str,
        to: str,
        profile: str | None = None,
        socket: str | None = None,
        *,
        force: bool = False,
    ) -> NodeMove:
        """``sessionctl migrate S --node N``: hand a sleeping session to node N;
        with ``force``, re-home one whose node is down (cluster/placement.py)."""
        if profile is not None or socket is not None:
            raise InvalidInput("say one of --profile P, --to SOCKET or --node N")
        _check_node(to)
        assert self._node is not None
        if to == self.store.lease.name and name in self._node.table.sessions:
            raise Refused(f"session {name!r} runs on node {to!r} already; nothing to move")
        if force:
            return await self.placer.rehome(name, to)
        s = self._node.table.sessions.get(name)
        if s is None:
            self._node.table.get(name)  # NoSuchSession, named as on one machine
        assert s is not None
        why = await self.placer.refusal(name, to)
        if why is not None:
            raise refused(name, to, why)
        moved = await self._hand_over(s, to)
        if moved is None:
            raise Refused(
                f"node {to!r} is not a live node that takes sessions (up, not draining); "
                "`sessionctl nodes` lists them"
            )
        return {"session": name, "node": moved}

    async def _hand_over(
        self, s: Session, to: str | None, *, release: bool = False, queued: bool = False
    ) -> str | None:
        """Give ``s`` away at a stable point: not while a run is on; its triggers
        disarmed and its log closed here first, then the owner changed (the epoch
        with it) to a node it may run on (placement.py). None: nobody took it, and
        it stays here; or, with ``release`` (it may not run here), it is let go
        for the node it fits to claim when that one is up. With ``queued``, a
        session waiting ``ready`` for a slot may go too."""
        assert self._node is not None
        node = self._node
        _at_stable_point(s, queued)
        target = await asyncio.to_thread(self.coordination.target_for, s.name, to)
        if target is None and not release:
            return None  # no node it may run on is up: it stays as it is
        async with s.lock:
            if node.table.sessions.get(s.name) is not s:
                # handed over meanwhile (placement's sweep and a create's own
                # placement may both try): not again, and never claimed back here
                return await asyncio.to_thread(self.store.owner_of, s.name)
            # Again under the lock: a wake that held or queued for it before us may
            # have started a run meanwhile, and its program must not run on here
            # while the next owner runs the same turn.
            _at_stable_point(s, queued)
            if s.name in node.kernel.ctx.scheduler.starting:
                raise Refused(f"session {s.name!r} is starting: it is handed over when it sleeps")
            node.kernel.ctx.scheduler.queue.pop(s.name, None)  # not started here any more
            node.triggers.disarm(s.name)
            node.table.sessions.pop(s.name, None)
            if s.journal_or_none is not None:
                # requests queued on the lock behind us are told where it went
                s.journal.log.closed_why = (
                    f"was handed over to node {target!r}"
                    if target is not None
                    else "was let go for a node it may run on"
                )
                await s.journal.close()
        moved = (
            None
            if target is None
            else await asyncio.to_thread(self.coordination.hand_over, s.name, target)
        )
        if moved is None and release and await asyncio.to_thread(self.coordination.release, s.name):
            log.warning("cluster.released", session=s.name, why="it may not run on this node")
        elif moved is None:  # nobody took it: it stays, claimed again, as after a restart
            await self._take(node, s.name)
        else:
            log.info("cluster.handed_over", session=s.name, to=moved)
        return moved

    async def drain(self, name: str) -> Draining:
        """``sessionctl drain N``: node N hands all its sessions to the others."""
        _check_node(name)
        count = await asyncio.to_thread(self.coordination.drain, name)
        if count is None:
            raise Refused(f"no live node {name!r}; `sessionctl nodes` lists them")
        # pinned there, or their workspace is only there: they stay (placement.py)
        staying = await asyncio.to_thread(self.coordination.homed_on, name)
        return {"node": name, "state": "draining", "sessions": count, "staying": staying}

    async def _drain_some(self, node: Node, at_most: int) -> None:
        """A draining node moves a few sleeping sessions a tick (rate-limited);
        those that may run only here stay."""
        movable = await asyncio.to_thread(self.coordination.movable)
        sessions = [s for name in movable if (s := node.table.sessions.get(name)) is not None]
        for s in sessions[: at_most * 4]:
            if at_most <= 0:
                return
            if s.run is not None or s.state in ("running", "ready"):
                continue  # at its next stable point
            try:
                if await self._hand_over(s, None) is None:
                    continue  # no node it may run on is up now
            except SessiondError as exc:
                log.warning("cluster.drain_skipped", session=s.name, error=str(exc))
                continue
            at_most -= 1

    async def _take_over(self, node: Node) -> None:
        # A third of a second, or less with a short lease: failover within
        # lease_ttl + about a second (docs/design.md section 10: + 3 s at p50).
        step = min(1.0, self.store.lease.ttl / 3)
        while True:
            await asyncio.sleep(step)
            try:
                names = await asyncio.to_thread(self.coordination.orphans)
            except Exception as exc:  # the database is away: the lease keeper decides
                log.warning("cluster.orphans_failed", error=repr(exc))
                continue
            if self.store.lease.state == "draining":
                await self._drain_some(node, DRAIN_PER_STEP)
                continue  # a draining node takes nothing
            for name in names:
                if node.kernel.stopping:
                    return
                if name not in node.table.sessions:
                    await self._take(node, name)
            try:
                await self.placer.sweep()
            except Exception as exc:  # the database is away: the lease keeper decides
                log.warning("cluster.placement_failed", error=repr(exc))

    async def _take(self, node: Node, name: str) -> None:
        """Claim a dead node's session and continue it as after a crash here:
        replay, the cut-off run recorded, the gate, then a run."""
        try:
            s = await node.table.open_session(name)
        except LogLocked as exc:  # another node was quicker
            log.info("cluster.not_taken", session=name, why=str(exc))
            return
        node.table.adopt(s)
        if s.journal_or_none is None:  # its log is unusable: listed blocked, with the reason
            log.error("cluster.taken_unusable", session=name, why=s.broken)
            return
        continues = await node.kernel.runs.recovery.cut_off(s, local=False)
        node.triggers.arm(s)
        node.resume(s, cut_off=continues)
        log.warning("cluster.taken_over", session=name, node=self.store.lease.name)

    def end_if_lapsed(self) -> None:
        """End the node now (exit 75) if its lease may have lapsed: past its last
        renewal + ``lease_ttl`` - the margin, on the monotonic clock."""
        lease = self.store.lease
        if time.monotonic() >= lease.deadline(margin(lease.ttl)):
            self._lost("the lease could not be renewed before its deadline")

    def _lost(self, why: str) -> None:
        log.error("cluster.lease_lost", node=self.store.lease.name, why=why)
        if self.socket is not None:  # what sessionctl says while the node is down
            said = f"; the last renewal failed: {self.last_error}" if self.last_error else ""
            leave_last_word(
                self.socket,
                f"at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} node "
                f"{self.store.lease.name!r} ended (exit {LEASE_LOST_EXIT}): {why}{said}. Is "
                f"the cluster's database ({self.database}) up? Its supervisor (systemd, "
                "make cluster) starts the node again; it answers once the database does",
            )
        # No graceful stop: every write would be refused anyway, and what matters
        # is that this node's programs stop before another node runs their sessions.
        os._exit(LEASE_LOST_EXIT)

    async def close(self) -> None:
        """At a clean stop: let go of the lease, so others may take over at once."""
        self._closing.set()
        self.balancer.stop()
        for task in (self._task, self._takeover):
            if task is not None:
                task.cancel()
        pool = await self.store.connect()
        async with pool.connection() as conn:
            await conn.execute(
                "UPDATE nodes SET lease_until = now(), state = 'stopped' "
                "WHERE name = %(name)s AND incarnation = %(inc)s",
                self.store.lease.params(),
            )
        await self.store.aclose()
