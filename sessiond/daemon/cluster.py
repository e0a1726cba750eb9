"""A daemon as a node of a cluster (DESIGN.md section 10): its store, its lease.

Wiring only, like the rest of daemon/: which store the config asks for, and the
task that keeps the node's lease. psycopg is imported only when ``[cluster] dsn``
is set, so a files-only install never needs it.

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
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from sessiond.codec import Clock
from sessiond.config import DaemonConfig
from sessiond.errors import InvalidInput, StorageError
from sessiond.log.store.base import Store
from sessiond.log.store.files import FileStore, IOHooks

if TYPE_CHECKING:
    from sessiond.log.store.pg.pgstore import PgStore

log = structlog.get_logger("sessiond.cluster")

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

        from sessiond.log.store.pg.pgstore import PgStore
        from sessiond.log.store.pg.schema import SchemaMismatch
    except ImportError as exc:
        raise InvalidInput(
            "[cluster] dsn is set but psycopg is not installed: install sessiond with the "
            "'cluster' extra (pip install 'sessiond[cluster]')"
        ) from exc
    try:
        store = PgStore(
            cluster.dsn,
            node=cluster.node,
            lease_ttl=cluster.lease_ttl,
            prepared=cluster.prepared,
            clock=clock,
            local_dir=Path(config.state_dir) / "sessions",
        )
    except SchemaMismatch as exc:
        raise InvalidInput(str(exc)) from exc
    except psycopg.Error as exc:
        raise StorageError(f"cannot use the cluster's database ([cluster] dsn): {exc}") from exc
    return store, LeaseKeeper(store)


def margin(ttl: float) -> float:
    """How long before its lease may lapse a node gives up: a fifth of it, at most 2 s."""
    return min(2.0, ttl / 5)


class LeaseKeeper:
    """Renews the node's lease every third of ``lease_ttl``; ends the node when it
    cannot."""

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.store.connect()  # registers: a new incarnation
        log.info(
            "cluster.joined",
            node=self.store.lease.name,
            incarnation=self.store.lease.incarnation,
            lease_ttl=self.store.lease.ttl,
        )
        self._task = asyncio.ensure_future(self._keep())

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
                renewed = None
            if renewed is False:
                self._lost("the lease had lapsed when it was renewed")
            if time.monotonic() >= lease.deadline(margin(lease.ttl)):
                self._lost("the lease could not be renewed before its deadline")

    def _lost(self, why: str) -> None:
        log.error("cluster.lease_lost", node=self.store.lease.name, why=why)
        # No graceful stop: every write would be refused anyway, and what matters
        # is that this node's programs stop before another node runs their sessions.
        os._exit(LEASE_LOST_EXIT)

    async def close(self) -> None:
        """At a clean stop: let go of the lease, so others may take over at once."""
        if self._task is not None:
            self._task.cancel()
        pool = await self.store.connect()
        async with pool.connection() as conn:
            await conn.execute(
                "UPDATE nodes SET lease_until = now(), state = 'stopped' "
                "WHERE name = %(name)s AND incarnation = %(inc)s",
                self.store.lease.params(),
            )
        await self.store.aclose()
