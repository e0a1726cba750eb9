"""The process table: every session the daemon knows, with its journal and spec.

Loading rebuilds the table from the logs (latest snapshot + tail). A session
whose log cannot be opened (corruption in the middle) stays in the table as
blocked with the reason, so an operator sees it; nothing is appended to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from sessiond.config import DaemonConfig
from sessiond.errors import (
    LogCorrupt,
    LogLocked,
    NoSuchSession,
    Refused,
    SessiondError,
)
from sessiond.log.event_data import EventData
from sessiond.log.journal import Journal
from sessiond.log.pace import Pacer
from sessiond.log.state import State
from sessiond.log.store.base import Draft, Record, Store
from sessiond.names import check_name
from sessiond.redaction import Redactor, redactor
from sessiond.replies import PsRow
from sessiond.table.spec import BadSpec, SessionSpec
from sessiond.table.speccache import stored_spec

log = structlog.get_logger(__name__)

OPEN_BATCH = 256  # sessions of the background load between two calls of its ``each``


class Stoppable(Protocol):
    """What the table needs of a running program (sessiond.runs.program.Program is
    one). A protocol, so that the table does not import the floor above it."""

    async def stop(self, reason: str) -> None: ...


@dataclass
class LiveRun:
    """A session program the daemon started (see sessiond.runs.program)."""

    run_id: str
    pid: int
    started: float
    program: Stoppable
    task: asyncio.Task[None] | None = None
    stop_requested: str | None = None  # why the daemon asked it to stop


@dataclass
class Session:
    name: str
    journal_or_none: Journal | None
    spec: SessionSpec | None = None
    spec_text: str | None = None
    broken: str | None = None  # why the log cannot be used
    # Why the session is blocked in memory only: its log refused the write that
    # would have recorded the block (a full disk). Nothing else is appended until
    # the daemon has recorded it (see Runs._record_hold).
    held: str | None = None
    run: LiveRun | None = None
    # A cancel, suspend or interrupt asked for while a run of this session is being
    # started (the start holds the lock): the start sees it and spawns no program;
    # the syscall records the state it asked for once it has the lock.
    stop_pending: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake_fn: Callable[[Session], str | None] | None = None  # what ps/show say of the next wake
    # Values masked wherever this session stores text, besides its spec's patterns:
    # its resolved [run] secrets and its run token. In memory only, never stored;
    # set at each start (sessiond.runs.start), kept until the next one.
    masked: frozenset[str] = frozenset()
    # the last redactor built, and the spec and values it was built for
    _redactor: tuple[SessionSpec | None, frozenset[str], Redactor | None] | None = field(
        default=None, repr=False
    )

    def redactor(self) -> Redactor | None:
        """What masks this session's stored text now; None when nothing is masked.
        Built again only when the spec or the masked values change."""
        spec, masked, cached = self._redactor or (None, None, None)
        if spec is self.spec and masked is self.masked:
            return cached
        patterns = self.spec.redact if self.spec is not None else ()
        built = redactor(patterns, self.masked) if patterns or self.masked else None
        self._redactor = (self.spec, self.masked, built)
        return built

    @property
    def journal(self) -> Journal:
        """The journal, or a refusal naming why there is none."""
        if self.journal_or_none is None:
            raise Refused(
                f"session {self.name!r} cannot be changed: {self.broken}; run 'sessiond fsck' "
                "and restore its log from a backup"
            )
        return self.journal_or_none

    @property
    def state(self) -> str:
        if self.journal_or_none is None or self.held is not None:
            return "blocked"
        return self.journal.state.state


Listener = Callable[[str, Record], None]


# What may be appended to an arriving session: the end of its hand-over.
SETTLES_ARRIVAL = frozenset({"migration.finished", "migration.discarded", "lifecycle.changed"})


class Table:
    def __init__(self, config: DaemonConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.sessions: dict[str, Session] = {}
        self._listeners: list[Listener] = []
        self.started = time.time()
        # set by the daemon to its triggers' view (next fire times); else the spec's
        self.next_wake_fn: Callable[[Session], str | None] = next_wake
        # The values of a spec's [run] secrets, where they can be read now (set by
        # the daemon: sessiond.runs.secrets): masked from the moment a session is
        # in the table, not only from its first run (a message may bring one).
        self.secret_values: Callable[[SessionSpec], frozenset[str]] | None = None
        # A start-up that serves before every session is open (the daemon, from the
        # table index: sessiond.table.index) sets ``loading`` until all are (also
        # after ``ready``: the recovery is done before the load is). Meanwhile
        # ``pending`` holds the ps rows of the sessions not opened yet; a request
        # naming one opens it first (``ensure``), one that reads every session waits
        # for all (``ensure_all``); ``opened`` is told of each one opened so (the
        # daemon arms its triggers and resumes what waits).
        self.loading = False
        self.pending: dict[str, PsRow] = {}
        # the program's workspace of a pending session, where its entry says (None:
        # it has no program); what a run of another session hides
        self.pending_workspaces: dict[str, str | None] = {}
        # what a pending session's model replies cost by day, where its entry says
        # (sessiond.table.index): its agent's daily budget counts it unopened
        self.pending_spend: dict[str, dict[str, list[float]]] = {}
        self.opened: Callable[[Session], None] | None = None
        self._opening: dict[str, asyncio.Future[None]] = {}
        # set once the sessions with work in flight are open and recovered (ps and a
        # request naming a session wait for it), once the whole start-up is done
        # (every session's state proven, every wake armed: ``daemon.ready``), and
        # once every session is open (``loaded``: nothing pending)
        self.recovered = asyncio.Event()
        self.ready = asyncio.Event()
        self.loaded = asyncio.Event()

    def __iter__(self) -> Iterator[Session]:
        return iter(self.sessions.values())

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, name: str) -> Session:
        check_name(name)
        try:
            return self.sessions[name]
        except KeyError:
            raise NoSuchSession(
                f"no session {name!r}; 'sessionctl ps' lists the sessions there are"
            ) from None

    # --- events ---------------------------------------------------------------------

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(session, record)`` for every event appended; returns an unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def append(
        self,
        session: Session,
        data: EventData,
        *,
        causation: str | None = None,
        correlation: str | None = None,
        durable: bool = True,
    ) -> Record:
        drafts = [Draft(data, causation, correlation)]
        return (await self.append_many(session, drafts, durable=durable))[0]

    async def append_many(
        self, session: Session, drafts: list[Draft], *, durable: bool = True
    ) -> list[Record]:
        if session.held is not None:
            raise Refused(
                f"session {session.name!r} is blocked: {session.held}; the daemon records "
                "the block as soon as the log takes writes again, then it can be resolved"
            )
        if session.state == "arriving" and any(
            d.data.EVENT_TYPE not in SETTLES_ARRIVAL for d in drafts
        ):
            # A copy another daemon is handing over: until the hand-over is settled
            # the source's copy may still be the session, and what is appended here
            # would be lost with a dropped copy (syscalls.handover).
            handover = session.journal.state.handover
            source = handover["peer"] if handover else "another daemon"
            raise Refused(
                f"session {session.name!r} is arriving from {source}: it is held, not "
                "runnable, until the source commits the hand-over, and nothing changes it "
                "before; if the source is gone for good, settle it with 'sessionctl "
                f"resolve {session.name} --accept' (make it live here) or '--discard'"
            )
        return await session.journal.append_many(drafts, durable=durable)

    def _broadcast(self, name: str, record: Record) -> None:
        for listener in list(self._listeners):
            listener(name, record)

    def adopt(self, session: Session) -> Session:
        """Put a session in the table; its journal's appends reach the listeners."""
        if session.journal_or_none is not None:
            name = session.name
            session.journal.listeners.append(lambda record: self._broadcast(name, record))
            session.journal.redaction = session.redactor
        session.wake_fn = self.next_wake_fn
        if self.secret_values is not None and session.spec is not None and not session.masked:
            session.masked = self.secret_values(session.spec)
        self.sessions[session.name] = session
        return session

    # --- loading --------------------------------------------------------------------

    async def open_session(self, name: str) -> Session:
        try:
            spec_text = self.store.read_spec(name)
        except SessiondError as exc:  # a planted symlink, a folder that is not one
            # Refused like a corrupt log (listed as blocked with the reason), so one
            # bad session never stops the daemon from serving the others.
            log.error("session.unusable", session=name, error=str(exc))
            return Session(name, None, broken=str(exc))
        spec = None
        if spec_text is not None:
            try:
                spec = self._parse_stored_spec(name, spec_text)
            except BadSpec as exc:
                log.error("spec.unreadable", session=name, error=str(exc))
        try:
            journal = await Journal.open(
                self.store,
                name,
                durability=self.config.durability,
                snapshot_every=self.config.snapshot_every,
            )
        except LogCorrupt as exc:
            log.error("log.corrupt", session=name, line=exc.line, error=str(exc))
            return Session(name, None, spec, spec_text, broken=f"corrupt log: {exc}")
        except LogLocked:
            raise  # another writer has it (a cluster's other node): not ours to list
        except SessiondError as exc:
            log.error("log.unusable", session=name, error=str(exc))
            return Session(name, None, spec, spec_text, broken=str(exc))
        return Session(name, journal, spec, spec_text)

    def _parse_stored_spec(self, name: str, text: str) -> SessionSpec:
        """A session's stored spec, through the cache beside it (sessiond.table.speccache)."""
        return stored_spec(f"{self.store.sessions_dir}/{name}", name, text)

    async def load(self, names: list[str] | None = None) -> None:
        """Open every session (or those ``names``), one after the other."""
        for name in self.store.names_to_load() if names is None else names:
            try:
                self.adopt(await self.open_session(name))
            except LogLocked as exc:  # a cluster node that claimed it first keeps it
                log.info("session.elsewhere", session=name, why=str(exc))

    async def ensure(self, name: str) -> None:
        """Open ``name`` now if it is listed and not opened yet; return once it is
        in the table (or cannot be: the syscall then says why). Each session is
        opened once, whoever asks first (a request, the background load)."""
        if name not in self.pending:
            return
        task = self._opening.get(name)
        if task is None:
            task = self._opening[name] = asyncio.ensure_future(self._open_pending(name))
        await asyncio.shield(task)

    async def _open_pending(self, name: str) -> None:
        try:
            session = await self.open_session(name)
        except LogLocked as exc:
            log.info("session.elsewhere", session=name, why=str(exc))
            self.pending.pop(name, None)
            if not self.pending:  # the last one: what waits for every session goes on
                self.all_open()
            return
        except Exception as exc:  # a bug: the session is listed, refused with the reason
            log.exception("session.unopened", session=name)
            session = Session(name, None, broken=f"cannot be opened: {exc}")
        finally:
            self._opening.pop(name, None)
        # in the table and off the pending list at once: ps never misses it
        self.pending.pop(name, None)
        self.adopt(session)
        if not self.pending:
            self.all_open()
        if self.opened is not None:
            self.opened(session)

    def all_open(self) -> None:
        """Nothing is pending any more: every session is in the table (the load is
        over once the start-up is done too: ``loading`` stays until both are)."""
        self.loaded.set()
        if self.ready.is_set():
            self.loading = False

    def set_ready(self) -> None:
        """The start-up is done (``daemon.ready``): sessions may still be pending."""
        self.ready.set()
        if not self.pending:
            self.all_open()

    async def ensure_all(self) -> None:
        """Return once every session is open: what reads every session's state (gc,
        the console's rows, a sandbox's view of the other workspaces, …) waits for
        the background load, as it would have before serving."""
        if self.pending:
            await self.loaded.wait()

    async def ensure_spent(self, agent: str) -> None:
        """Return once the spend of every session of ``agent`` can be read: the open
        ones' from their logs, a pending one's from its index entry; a pending one
        whose entry says none (an older index, no spec) is opened now. An agent's
        daily budget counts them all without waiting for the others' load."""
        for name in [
            n
            for n, row in self.pending.items()
            if row["agent"] == agent and n not in self.pending_spend
        ]:
            await self.ensure(name)

    async def open_pending(
        self, each: Callable[[int], None] | None = None, names: list[str] | None = None
    ) -> None:
        """Open every listed session (or those of ``names`` still listed), in the
        order listed (the background load), in this task: a task and a turn of the
        loop for each of 10,000 sessions cost more than opening most of them. The
        loop gets a turn between slices of 0.5 ms; a request naming a session opened
        here meanwhile waits for it as for any other opening. ``each(n)`` is told
        after every ``OPEN_BATCH`` sessions opened, ``n`` in all so far (the daemon
        moves them out of the cyclic collector's way)."""
        loop = asyncio.get_running_loop()
        pacer = Pacer()
        opened = 0
        todo = iter(names) if names is not None else None
        while self.pending:
            if todo is None:
                name = next(iter(self.pending))
            else:
                named = next(todo, None)
                if named is None:
                    return
                if named not in self.pending:
                    continue
                name = named
            other = self._opening.get(name)
            if other is not None:  # a request is opening it: wait for that one
                await asyncio.shield(other)
                continue
            done = self._opening[name] = loop.create_future()
            try:
                await self._open_pending(name)  # (which takes it off _opening)
            finally:
                done.set_result(None)
            opened += 1
            if each is not None and opened % OPEN_BATCH == 0:
                each(opened)
            if pacer.due():
                await pacer.pause()

    async def close(self) -> None:
        """Snapshot every session that moved since its last snapshot (so the next
        start-up replays nothing), then close every log."""
        journals = [
            s.journal_or_none for s in self.sessions.values() if s.journal_or_none is not None
        ]
        snapshots = [snap for j in journals if (snap := await j.take_snapshot()) is not None]
        await asyncio.get_running_loop().run_in_executor(None, self.store.save_snapshots, snapshots)
        for journal in journals:
            await journal.close()


def file_hash(path: Path) -> str | None:
    """sha256 of a regular file's content, or None when it does not exist or is
    not a regular file. Opened without waiting (a FIFO a run made in its
    workspace would hold the open until a writer came) and checked before a
    byte is read (a device such as /dev/zero never ends)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return hashlib.file_digest(f, "sha256").hexdigest()


def summary(session: Session, wake_fn: Callable[[Session], str | None] | None = None) -> PsRow:
    """A `ps` row."""
    wake_fn = wake_fn or next_wake
    spec = session.spec
    if session.journal_or_none is None:
        return {
            "name": session.name,
            "state": "blocked",
            "reason": session.broken,
            "agent": spec.agent if spec else "",
            "priority": spec.priority if spec else 0,
            "runs": 0,
            "last_active": None,
            "next_wake": None,
            "pid": None,
            "parent": None,
            "outcome": None,
            "labels": dict(spec.labels) if spec else {},
        }
    s = session.journal.state
    return {
        "name": session.name,
        "state": session.state,
        "reason": session.held or s.reason,
        "agent": spec.agent if spec else s.agent,
        "priority": spec.priority if spec else s.priority,
        "runs": s.runs,
        "last_active": last_active(s),
        "next_wake": wake_fn(session),
        "pid": session.run.pid if session.run else None,
        "parent": s.parent,
        "outcome": s.outcome,
        "labels": dict(spec.labels) if spec else {},
    }


def last_active(s: State) -> str | None:
    """When the session last did something (a state change, a run's start or end),
    else when it was created: the one "last active" of ``ps``, ``show`` and the
    console."""
    return s.last_active or s.created_at


def next_wake(session: Session) -> str | None:
    """What will wake the session next, as people read it."""
    spec = session.spec
    if spec is None or not spec.has_triggers or session.state in ("terminated", "arriving"):
        return None
    return "on " + "; ".join(spec.trigger_summary())
