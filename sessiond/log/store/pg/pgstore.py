"""The sessions of a cluster, in one PostgreSQL database (docs/design.md section 10).

Two pools of connections, because the storage interface has two kinds of calls:

- the event loop's (creating and opening logs, appends, leases, claims): an
  ``AsyncConnectionPool`` opened in the running loop, by :meth:`PgStore.connect`
  (the daemon, for its whole life) or on demand while a log is open (tools and
  tests, which may run several loops one after another);
- the synchronous readers (``read``, artifacts, snapshots, specs, names), as the
  files backend reads files: a small thread-safe ``ConnectionPool``.

Prepared statements are on unless ``prepared=False`` (behind PgBouncer in
transaction mode, which cannot keep them; it cannot keep LISTEN or session
advisory locks either). The schema is checked, never made, at start: that is
``sessiond db migrate``'s job (schema.py).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from sessiond.codec import Clock, NodeStamp, decode_line
from sessiond.errors import AlreadyExists, Fenced, InvalidInput, LogLocked, NoSuchSession
from sessiond.log.pace import OffLoop
from sessiond.log.store.base import Durability, LogPosition, Record, Store
from sessiond.log.store.pg import schema
from sessiond.log.store.pg.committer import Committer
from sessiond.log.store.pg.nodes import Lease
from sessiond.log.store.pg.once import KeysOf, commit_once, no_keys
from sessiond.log.store.pg.pglog import PgEventLog, read_events
from sessiond.log.store.pg.pgparts import PUT, PgArtifacts, PgSnapshots
from sessiond.log.store.pg.placement import PLACE, PlacementFor, fits, unplaced
from sessiond.log.store.pg.reach import AsyncPool, Pool
from sessiond.names import check_name

CREATE = """
INSERT INTO sessions (name, owner, epoch, last_seq, last_id, spec, ended)
SELECT %(session)s, n.name, %(epoch)s, %(last)s, %(last_id)s, %(spec)s, %(ended)s
FROM nodes AS n
WHERE n.name = %(node)s AND n.incarnation = %(inc)s AND n.lease_until > now()
ON CONFLICT (name) DO NOTHING
RETURNING name
"""

COPY_EVENTS = """
INSERT INTO events (session, seq, id, line)
SELECT %(s)s, e.seq, e.id, e.line
FROM unnest(%(seqs)s::bigint[], %(ids)s::text[], %(lines)s::bytea[]) AS e(seq, id, line)
"""


class PgStore(Store):
    """Every session of the cluster; this node's lease; its open logs.

    ``placement_for``: what the row of a session records of the spec it is
    written with (the cluster floor's rules, sessiond.cluster.placement; none
    without them). ``keys_of``: what a batch of records commits once with its
    events (sessiond.cluster.once; nothing without it). What the nodes do about
    each other (take-overs, hand-overs, draining) is the cluster's coordination
    (sessiond.cluster.coordination)."""

    def __init__(
        self,
        dsn: str,
        *,
        node: str,
        lease_ttl: float = 10.0,
        labels: dict[str, str] | None = None,
        prepared: bool = True,
        clock: Clock = time.time_ns,
        snapshots_keep: int = 2,
        pool_size: int = 8,
        local_dir: Path | None = None,
        placement_for: PlacementFor = unplaced,
        keys_of: KeysOf = no_keys,
    ) -> None:
        self.dsn = dsn
        self.placement_for = placement_for
        self.keys_of = keys_of
        # the node's own caches (a parsed spec, a git cursor); not the sessions
        self.sessions_dir = local_dir if local_dir is not None else Path("/nonexistent")
        self.clock = clock
        self.snapshots_keep = snapshots_keep
        self.pool_size = pool_size
        self.lease = Lease(node, lease_ttl, json.dumps(labels or {}))
        # psycopg.connect's and its pool's **kwargs (Any in their signatures)
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": 5 if prepared else None,
        }
        # One plain connection first: a DSN that cannot work (no such database, a
        # typo, nothing listening) fails here at once with the database's reason,
        # where a pool retries for its whole timeout and then says only
        # "pool initialization incomplete".
        with psycopg.connect(dsn, **self._kwargs, **_connect_timeout(dsn)) as conn:
            schema.check(conn)
        self._sync = Pool(
            dsn, min_size=1, max_size=4, kwargs=self._kwargs, open=False, name="sessiond-read"
        )
        self._sync.open(wait=True, timeout=30)
        self._apool: AsyncConnectionPool | None = None
        self._apool_loop: asyncio.AbstractEventLoop | None = None
        self._held = False  # connect() was called: the async pool stays open
        self._open: set[str] = set()
        self._committer: Committer | None = None
        self._committer_pool: AsyncConnectionPool | None = None

    # --- connections --------------------------------------------------------------

    def _query(self, sql: str, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        with self._sync.connection() as conn:
            return conn.execute(sql.encode(), params).fetchall()

    def select(self, sql: str, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        """Rows of a read-only query (fsck's own checks)."""
        return self._query(sql, params)

    def _execute(self, statements: Sequence[tuple[str, Mapping[str, object]]]) -> None:
        with self._sync.connection() as conn, conn.transaction():
            for sql, params in statements:
                conn.execute(sql.encode(), params)

    async def connect(self) -> AsyncConnectionPool:
        """Open the async pool in this loop for good (the daemon) and register the
        node's lease (a new incarnation)."""
        self._held = True
        return await self._pool()

    async def _pool(self) -> AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        if self._apool is not None and self._apool_loop is not loop:
            raise RuntimeError("the store's connections belong to another event loop")
        if self._apool is None:
            pool = AsyncPool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                kwargs=self._kwargs,
                open=False,
                name="sessiond-write",
            )
            await pool.open(wait=True, timeout=30)
            self._apool, self._apool_loop = pool, loop
        if not self.lease.registered:
            await self.lease.register(self._apool)
        return self._apool

    def _committer_for(self, pool: AsyncConnectionPool) -> Committer:
        if self._committer is None or self._committer_pool is not pool:
            self._committer, self._committer_pool = Committer(pool, self.lease), pool
        return self._committer

    async def _release(self, name: str) -> None:
        self._open.discard(name)
        if not self._held and not self._open and self._apool is not None:
            await self._close_pool()

    async def _close_pool(self) -> None:
        pool, self._apool, self._apool_loop = self._apool, None, None
        committer, self._committer, self._committer_pool = self._committer, None, None
        if committer is not None:
            await committer.aclose()  # it holds connections of its own
        if pool is not None:
            await pool.close()

    async def aclose(self) -> None:
        """Close both pools (open logs must be closed first)."""
        self._held = False
        if self._apool is not None:
            await self._close_pool()
        self._sync.close()

    def close_sync(self) -> None:
        """Close the readers' pool (outside a loop; the async one must be closed)."""
        self._sync.close()

    # --- the Store interface -----------------------------------------------------

    def names(self) -> list[str]:
        return [r[0] for r in self._query("SELECT name FROM sessions ORDER BY name", {})]

    def names_to_load(self) -> list[str]:
        """The sessions this node may own: its own, nobody's, and those of nodes
        whose lease lapsed. The others run on their nodes."""
        rows = self._query(
            "SELECT s.name FROM sessions AS s LEFT JOIN nodes AS n ON n.name = s.owner "
            "WHERE s.owner = %(me)s OR ((s.owner IS NULL OR n.lease_until <= now()) "
            f"AND {fits('%(me)s', '%(labels)s::jsonb')}) ORDER BY s.name",
            {"me": self.lease.name, "labels": self.lease.labels},
        )
        return [r[0] for r in rows]

    def owner_of(self, name: str) -> str | None:
        rows = self._query("SELECT owner FROM sessions WHERE name = %(n)s", {"n": check_name(name)})
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    def exists(self, name: str) -> bool:
        rows = self._query("SELECT 1 FROM sessions WHERE name = %(n)s", {"n": check_name(name)})
        return bool(rows)

    def _must_exist(self, name: str) -> None:
        if not self.exists(name):
            raise NoSuchSession(f"no session {name!r} in the cluster's database")

    async def create(
        self,
        name: str,
        *,
        spec: str | None = None,
        lines: Iterable[bytes] = (),
        artifacts: Iterable[bytes] = (),
        durability: Durability = "fsync",
    ) -> PgEventLog:
        check_name(name)
        if name in self._open:
            raise AlreadyExists(f"session {name!r} exists already; pick another name")
        seqs: list[int] = []
        ids: list[str] = []
        raws: list[bytes] = []
        changes: list[Record] = []  # its lifecycle changes (what ``ended`` is made of)
        top = 1  # the epoch it starts at (below)
        for line in lines:
            raw = line.rstrip(b"\n")
            record = decode_line(raw)
            if record is None or record.get("seq") != len(seqs) + 1:
                raise InvalidInput(f"line {len(seqs) + 1} to copy into {name!r} is not whole")
            seqs.append(record["seq"])
            ids.append(record["id"])
            raws.append(raw)
            if record.get("type") == "lifecycle.changed":
                changes.append(record)
            if isinstance(got := record.get("epoch"), int):
                top = max(top, got)
        blobs = list(artifacts)
        # A copy (fork, import) starts at the highest epoch of what it copies, so
        # the epoch never decreases along its seqs (the next claim goes above).
        epoch = top
        self._open.add(name)  # held from here: nobody opens it while it is made
        try:
            pool = await self._pool()
            async with pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    CREATE,
                    {
                        "session": name,
                        "last": len(seqs),
                        "epoch": epoch,
                        "last_id": ids[-1] if ids else None,
                        "spec": spec,
                        "node": self.lease.name,
                        "inc": self.lease.incarnation,
                        # an import of a terminated session arrives terminated: its
                        # row says so, as a termination committed here does (once.py)
                        "ended": bool(self.keys_of(name, changes).ended),
                    },
                )
                if await cur.fetchone() is None:
                    taken = await conn.execute("SELECT 1 FROM sessions WHERE name = %s", (name,))
                    if await taken.fetchone() is not None:
                        raise AlreadyExists(f"session {name!r} exists already; pick another name")
                    raise Fenced(
                        f"node {self.lease.name!r} cannot create {name!r}: its lease lapsed"
                    )
                await conn.execute(PLACE, self.placement_for(spec).params(name))
                for start in range(0, len(seqs), 1000):
                    await conn.execute(
                        COPY_EVENTS,
                        {
                            "s": name,
                            "seqs": seqs[start : start + 1000],
                            "ids": ids[start : start + 1000],
                            "lines": raws[start : start + 1000],
                        },
                    )
                for blob in blobs:
                    params = {"s": name, "d": _sha256(blob), "data": bytes(blob)}
                    for sql in PUT:
                        await conn.execute(sql.encode(), params)
        except BaseException:
            await self._release(name)
            raise
        log = self._log(name, pool, epoch=epoch, durability=durability)
        log.adopt(LogPosition(len(seqs), len(seqs), ids[-1] if ids else None))
        return log

    def copy_stamp(self, lines: Sequence[bytes]) -> NodeStamp:
        return {"node": self.lease.name, "epoch": _first_epoch(lines)}

    def _log(
        self, name: str, pool: AsyncConnectionPool, *, epoch: int, durability: Durability
    ) -> PgEventLog:
        return PgEventLog(
            name,
            durability,
            self.clock,
            committer=self._committer_for(pool),
            lease=self.lease,
            epoch=epoch,
            query=self._query,
            on_close=lambda: self._release(name),
            once=functools.partial(commit_once, pool, self.lease),
            keys_of=self.keys_of,
        )

    async def open_log(self, name: str, *, durability: Durability = "fsync") -> PgEventLog:
        check_name(name)
        if name in self._open:
            raise LogLocked(f"the log of session {name!r} is open by another writer on this node")
        self._open.add(name)
        try:
            pool = await self._pool()
            epoch, _seq, _last_id = await self.lease.claim(pool, name)
        except BaseException:
            await self._release(name)
            raise
        return self._log(name, pool, epoch=epoch, durability=durability)

    def read(self, name: str, *, since: int = 1, upto: int | None = None) -> Iterator[Record]:
        # queries: read off the loop by those that can (sessiond.log.pace.OffLoop)
        return OffLoop(self._read(name, since, upto))

    def _read(self, name: str, since: int, upto: int | None) -> Iterator[Record]:
        check_name(name)
        self._must_exist(name)
        for record, _line in read_events(self._query, name, since, upto):
            yield record

    def read_lines(self, name: str, *, upto: int | None = None) -> Iterator[tuple[Record, bytes]]:
        return OffLoop(self._read_lines(name, upto))

    def _read_lines(self, name: str, upto: int | None) -> Iterator[tuple[Record, bytes]]:
        check_name(name)
        self._must_exist(name)
        for record, line in read_events(self._query, name, 1, upto):
            yield record, line + b"\n"

    def artifacts(self, name: str) -> PgArtifacts:
        return PgArtifacts(check_name(name), self._query, self._execute)

    def snapshots(self, name: str) -> PgSnapshots:
        return PgSnapshots(check_name(name), self._query, self._execute, keep=self.snapshots_keep)

    def read_spec(self, name: str) -> str | None:
        rows = self._query("SELECT spec FROM sessions WHERE name = %(n)s", {"n": check_name(name)})
        if not rows:
            raise NoSuchSession(f"no session {name!r} in the cluster's database")
        return rows[0][0]  # type: ignore[no-any-return]

    def write_spec(self, name: str, text: str) -> None:
        self._execute(
            [
                (
                    "UPDATE sessions SET spec = %(t)s WHERE name = %(n)s",
                    {"n": check_name(name), "t": text},
                ),
                (PLACE, self.placement_for(text).params(name)),
            ]
        )


def _connect_timeout(dsn: str) -> dict[str, Any]:  # psycopg.connect's **kwargs (Any there)
    """A bound on the first connection unless the DSN (or PGCONNECT_TIMEOUT) sets one:
    an address that drops packets would otherwise wait for the OS's TCP timeout."""
    if "connect_timeout" in conninfo_to_dict(dsn) or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": 10}


def _first_epoch(lines: Iterable[bytes]) -> int:
    """The epoch a session made of ``lines`` starts at: 1, or the highest they carry."""
    epochs = (r.get("epoch") for line in lines if (r := decode_line(line.rstrip(b"\n"))))
    return max([1, *(e for e in epochs if isinstance(e, int))])


def _sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()
