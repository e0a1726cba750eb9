"""A start-up that serves at once: the table index read, the sessions opened after.

``Daemon.start`` opens first the sessions the index cannot vouch for (no entry,
a log or spec that moved past its entry, work in flight), recovers them, starts
the socket, then opens what the recovery needs open: the sessions whose spec has
triggers (the watcher, git and ``[bind]`` arm from an open session; an index
entry written before it said so counts as having some) and those a notify
target has not looked at to their log's end. Then the start-up is done
(``daemon.ready``): every session's state is proven, by its recovery or by its
entry (a log exactly as its entry describes it: nothing appended since, no torn
tail), and every wake is armed (a timed wake of a session not opened yet from
its entry's ``wake_at``). The rest are opened after, in the background, soonest
timed wake first, or when a request needs one (sessiond.table.index says how
entries are checked; sessiond.ipc.opening what a request waits for meanwhile).
This module wires the index to the table and the triggers: where an entry comes
from, and what the daemon keeps of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeGuard

import structlog

from sessiond.log.store.base import Store
from sessiond.log.store.files import FileStore
from sessiond.runs.faults import Faults
from sessiond.table.index import INDEX_NAME, Entry, IndexKeeper, entry_for, plan, read_index
from sessiond.table.indexfile import Read
from sessiond.table.sessions import OPEN_BATCH, Session, Table
from sessiond.wake.triggers import Triggers

log = structlog.get_logger(__name__)

WAKE_LEAD = 1.0  # seconds: a session is opened this long before its next timed wake


class Opening:
    """The table index of one daemon: read at start-up, kept up to date after."""

    def __init__(self, table: Table, store: FileStore, triggers: Triggers, resume: Resume) -> None:
        self.table = table
        self.store = store
        self.triggers = triggers
        self.resume = resume
        self.sessions_dir = store.sessions_dir
        self._loader: asyncio.Task[None] | None = None
        self._halter: asyncio.Task[None] | None = None
        self.incomplete = False  # the index lacked entries (or had stale ones) at start
        self._watch_restart: asyncio.Handle | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._wakes: set[asyncio.Future[None]] = set()
        self._marked = False  # the index's rows hold the early server's ``boundary``
        self.to_arm: list[str] = []  # listed, opened before the start-up is done
        self.upgrade = False  # entries without ``triggers``: the index is rewritten
        self.keeper = IndexKeeper(
            store.root / INDEX_NAME,
            self.sessions_dir,
            self.entry_of,
            lambda: [*table.sessions, *table.pending],
        )
        # every durable append marks its session; before anything appends
        table.listen(self.keeper.note)
        table.opened = self.opened

    def entry_of(self, name: str) -> Entry | None:
        s = self.table.sessions.get(name)
        if s is None:
            return None
        return entry_for(s, self.sessions_dir, self.table.next_wake_fn, self.wake_at(name))

    def wake_at(self, name: str) -> float | None:
        """The session's next timed wake (cron, every), seconds since the epoch."""
        armed = self.triggers.armed.get(name)
        if armed is None or not armed.next_fires:
            return None
        return min(armed.next_fires.values()).timestamp()

    def plan(self, read: Read | None = None) -> list[str]:
        """Read the index and check it against the logs: the sessions the index
        vouches for are listed in the table as pending; return the others, the
        ones to open (and recover) before serving. ``read``: the early server's
        read and check of the same files (sessiond.table.indexfile.Read), used
        instead of reading them again."""
        if read is not None and (read.path, read.sessions_dir) == (
            self.keeper.path,
            self.sessions_dir,
        ):
            entries, lines, planned = read.entries, read.lines, read.planned
            for event, fields in read.warnings:
                log.warning(event, **fields)
            self._marked = True  # its rows carry the early server's boundary
        else:
            read = None
            entries, lines = read_index(self.keeper.path)
            planned = plan(self.sessions_dir, entries)
        rest = planned["rest"]
        self.keeper.kept = {name: entries[name] for name in rest}
        self.keeper.lines = lines
        self.incomplete = len(planned["first"]) > 0  # rewritten whole at ready
        self.table.pending = {name: e["row"] for name, e in rest.items()}
        # each listed log ends at its entry's seq (checked above): its snapshot there
        self.store.snapshot_hints = {name: e["seq"] for name, e in rest.items()}
        # and was durable before this start: no fsync of its own when opened
        self.store.durable_logs = set(rest)
        # armed from the open session (a terminated one is not armed at all)
        self.to_arm = [
            name
            for name, e in rest.items()
            if e.get("triggers", True) and e["row"]["state"] != "terminated"
        ]
        self.table.pending_workspaces = {
            name: e["workspace"] for name, e in rest.items() if "workspace" in e
        }
        self.table.pending_spend = {
            name: spend for name, e in rest.items() if _is_spend(spend := e.get("spend"))
        }
        self.upgrade = any("triggers" not in e or "workspace" not in e for e in rest.values())
        self.table.loading = True
        log.info(
            "index.read",
            entries=len(entries),
            listed=len(rest),
            opened_first=len(planned["first"]),
            to_arm=len(self.to_arm),  # opened before ready: their specs have triggers
            early=read is not None,  # read and checked by the early server
        )
        return planned["first"]

    def pending_ends(self) -> dict[str, int]:
        """Each session not opened yet, and the seq its log ends at (its entry's)."""
        kept = self.keeper.kept
        return {name: kept[name]["seq"] for name in self.table.pending if name in kept}

    def begin(self, rest: Coroutine[Any, Any, None], stopping: asyncio.Event) -> None:
        """Serving now: keep the index from here on, and finish the start-up
        (``rest``: the daemon's, which calls :meth:`open_to_recover`, is ready, then
        calls :meth:`open_rest`), until the daemon stops (``stopping``: the load
        ends there, not later)."""
        if self._marked:  # the early server is done with them (the full server serves):
            for entry in self.keeper.kept.values():  # they go back to the index as read
                entry["row"].pop("boundary", None)
            self._marked = False
        self.keeper.start()
        self._loader = asyncio.ensure_future(rest)
        self._halter = asyncio.ensure_future(self._halt_on(stopping))
        # A timed wake due before the load reaches its session opens it in time (it
        # is armed when opened, from its log; a cron missed by then is caught up).
        loop = asyncio.get_running_loop()
        now = self.triggers.timers.clock()  # the daemon's clock, as the timers'
        for name, entry in self.keeper.kept.items():
            wake_at = entry["wake_at"]
            if wake_at is not None and name in self.table.pending:
                delay = max(0.0, wake_at - now - WAKE_LEAD)
                self._timers.append(loop.call_later(delay, self._open_for_wake, name))

    async def _halt_on(self, stopping: asyncio.Event) -> None:
        await stopping.wait()
        self._halt()

    def _halt(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()

    def _open_for_wake(self, name: str) -> None:
        if name in self.table.pending:
            self._wakes.add(task := asyncio.ensure_future(self.table.ensure(name)))
            task.add_done_callback(self._wakes.discard)

    async def open_to_recover(self, faults: Faults, behind: Callable[[], list[str]]) -> None:
        """Open what the start-up needs open (the sessions to arm, and ``behind()``:
        those a notify target has not looked at to their end), then make what was
        appended meanwhile durable (a notify target reads each log up to its end
        before it listens), and write the index whole if it lacked entries."""
        await faults.hold("open-rest", "")
        await self.table.open_pending(young_frozen, self.to_arm)
        await self.table.open_pending(young_frozen, behind())
        # from here on, a log opened (an import's) is synced first again; the ones
        # listed were durable before the start (FileStore.durable_logs)
        self.store.sync_on_recover = True
        for s in list(self.table):
            if s.journal_or_none is not None:
                await s.journal.flush()
        if self.incomplete or self.upgrade:  # before ready: a kill -9 after it finds
            try:  # every session vouched for that can be
                await self.keeper.rewrite()
            except OSError as exc:  # a cache: the next start opens those sessions first
                log.warning("index.unwritten", path=str(self.keeper.path), why=str(exc))

    async def open_rest(self, faults: Faults) -> None:
        """After the start-up: open every session still pending, in the background
        (a request that needs one opens it first, one that needs all waits)."""
        try:
            await faults.hold("open-late", "")
            if faults.armed("open-midway"):  # a crash test's: never in production (NoFaults)
                names = list(self.table.pending)  # half of them opened, then held there
                await self.table.open_pending(young_frozen, names[: len(names) // 2])
                await faults.hold("open-midway", "")
            await self.table.open_pending(young_frozen)
        finally:
            collected()

    def opened(self, s: Session) -> None:
        """A session opened after the socket started: armed and resumed as the ones
        opened before it were (one watcher restart for a batch of them)."""
        self.triggers.arm(s)
        if self._watch_restart is None:
            self._watch_restart = asyncio.get_running_loop().call_soon(self._restart_watcher)
        self.resume(s)

    def _restart_watcher(self) -> None:
        self._watch_restart = None
        self.triggers.watcher.restart()

    async def close(self) -> None:
        """At a stop: the load ends where it is (what is not opened keeps its entry),
        and every session's entry is written, durably: what the next start reads."""
        self._halt()
        if self._halter is not None:
            self._halter.cancel()
        if self._loader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loader
        await self.keeper.close()
        try:
            self.keeper.write_whole(durable=True)
        except OSError as exc:  # a cache: the next start opens every session from its log
            log.warning("index.unwritten", path=str(self.keeper.path), why=str(exc))


Resume = Callable[[Session], None]


def _is_spend(value: object) -> TypeGuard[dict[str, list[float]]]:
    """Whether an entry's ``spend`` is one (by day: [tokens, cost]); else its
    session is opened before its agent's budget counts it (fail closed)."""
    return type(value) is dict and all(
        type(day) is str
        and type(used) is list
        and len(used) == 2
        and all(type(x) in (int, float) and x >= 0 for x in used)
        for day, used in value.items()
    )


def opening_of(
    table: Table, store: Store, lease: object, triggers: Triggers, resume: Callable[..., None]
) -> Opening | None:
    """The daemon's table index: on one machine's files (a cluster node opens what
    its lease gives it, and has no index)."""
    if not isinstance(store, FileStore) or lease is not None:
        return None
    return Opening(table, store, triggers, lambda s: resume(s, cut_off=False))


def young_frozen(opened: int) -> None:
    """During the background load (the collector is off), every few hundred
    sessions: freeze what was made since, out of the cyclic collector's way. One
    collection of everything at the end walked every loaded object once more, cold
    in the cache (0.4 s for 10,000 sessions), and held the loop meanwhile. Opening a
    session makes no cyclic garbage (tests/table/test_open_path.py keeps that
    true), so what is frozen here is not collected first, but for the first call:
    it collects what start-up made before the load. (What a request served during
    the load leaves in a cycle stays, once: bounded by the load, never growing.)"""
    if opened <= OPEN_BATCH:
        gc.collect()
    gc.freeze()


def collected() -> None:
    """After a load: collect once, then freeze what was loaded out of the cyclic
    collector's way (the process table lives as long as the daemon)."""
    gc.enable()
    gc.collect()
    gc.freeze()
