"""The storage interface: event logs, artifact stores and snapshots.

Everything above this module talks to storage through these abstract classes,
so that another backend (a shared PostgreSQL store holding the logs of several
daemons is planned, docs/design.md section 8) can be added without touching the
rest. ``tests/log/test_store_contract.py`` is the contract every implementation
must pass.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import orjson

from sessiond.codec import Clock, EventRecord, NodeStamp
from sessiond.errors import SessiondError
from sessiond.log.event_data import ArtifactRef, EventData

Durability = Literal["fsync", "os"]
Record = EventRecord  # an event as read from its line (log/event_records.py)


# Draft, LogPosition and Pending are NamedTuples rather than frozen dataclasses:
# one of each is made per append, and a tuple is several times cheaper to build.


class Draft(NamedTuple):
    """An event to append: the log assigns ``seq``, ``id``, ``ts`` and ``session``."""

    data: EventData
    causation: str | None = None
    correlation: str | None = None


class LogPosition(NamedTuple):
    """Where a reader stands: after event ``seq`` (whose id is ``last_id``).

    ``offset`` is the backend's cursor for the place right after that event (a
    byte offset for files). It is a hint: a backend verifies it against ``seq``
    and ``last_id`` and raises :class:`PositionMismatch` when they disagree.
    """

    seq: int
    offset: int
    last_id: str | None


START = LogPosition(seq=0, offset=0, last_id=None)


class Pending(NamedTuple):
    """Events written but possibly not yet durable; ``await log.sync(pending)`` makes them so."""

    records: list[Record]
    position: LogPosition


@dataclass(frozen=True, slots=True)
class Repair:
    """What opening a log cut off its end (a torn last write)."""

    dropped_bytes: int
    at_offset: int
    last_good_seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A folded state at a log position; an optimisation, never the only copy."""

    reducer: int
    session: str
    position: LogPosition
    state: dict[str, Any]  # State.to_dict(): its fields by name, checked by State.from_dict
    # The state as JSON when the taker has only that (sessiond.log.journal): ``state``
    # is then empty, and a backend that keeps dicts decodes it when it saves.
    encoded: bytes | None = None

    def decoded(self) -> Snapshot:
        """This snapshot with ``state`` filled in from ``encoded``."""
        if self.encoded is None:
            return self
        return Snapshot(self.reducer, self.session, self.position, orjson.loads(self.encoded))


class PositionMismatch(Exception):
    """A snapshot's position does not match the log; the log wins."""


class EventLog(abc.ABC):
    """One session's append-only log, opened by its single writer.

    Life of a log: open (takes the writer lock) → :meth:`recover` (reads to the
    end, verifying every line, cutting a torn tail) → appends → :meth:`close`.
    Appends before recovery ran to its end are refused.
    """

    session: str
    durability: Durability
    # Why this node closed it for good while others may still hold the session
    # (a cluster's hand-over): what an append after the close is told.
    closed_why: str | None = None
    # The epoch of this writer's ownership, a run's fencing token (SESSIOND_EPOCH):
    # a cluster's claim bumps it; on one machine nothing else ever writes the
    # session, so it is 0 there, below every cluster's.
    epoch: int = 0

    @property
    @abc.abstractmethod
    def position(self) -> LogPosition:
        """After the last event written (durable or not)."""

    @property
    @abc.abstractmethod
    def repair(self) -> Repair | None:
        """What recovery cut off, if anything. The caller records it as ``log.repaired``."""

    @abc.abstractmethod
    def recover(self, after: LogPosition = START) -> Iterator[Record]:
        """Yield every event after ``after``, verified, then make the log appendable.

        Raises :class:`~sessiond.errors.LogCorrupt` at a bad line that is not the
        last one, and :class:`PositionMismatch` when ``after`` does not match.
        """

    @abc.abstractmethod
    def write_many(self, drafts: Sequence[Draft]) -> Pending:
        """Assign seqs and write; durable only after :meth:`sync`.

        Writes happen before this returns, in call order, so concurrent callers in
        one event loop never interleave seqs.
        """

    @abc.abstractmethod
    async def sync(self, pending: Pending) -> None:
        """Return once ``pending`` is durable (group commit: one fsync for many writers)."""

    async def append_many(self, drafts: Sequence[Draft]) -> list[Record]:
        pending = self.write_many(drafts)
        await self.sync(pending)
        return pending.records

    async def append(
        self, data: EventData, *, causation: str | None = None, correlation: str | None = None
    ) -> Record:
        return (await self.append_many([Draft(data, causation, correlation)]))[0]

    @abc.abstractmethod
    async def close(self) -> None:
        """Wait for pending syncs, release the writer lock."""

    def verify(self) -> str | None:
        """What is wrong with the stored log compared with what this writer wrote
        (None: nothing), checking only what was written since the last call. The
        resume gate's "log intact". A backend nobody else can write to has nothing
        to check."""
        return None


class ArtifactStore(abc.ABC):
    """A session's content-addressed evidence (sha256). Reads verify the hash."""

    @abc.abstractmethod
    def put(
        self, data: bytes, name: str, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        """Store ``data`` durably (idempotent) and return its reference."""

    def put_many(self, items: Sequence[tuple[bytes, str, str]]) -> list[ArtifactRef]:
        """:meth:`put` each ``(data, name, media_type)``; durable when it returns. A
        backend may do it in fewer syncs (the chunks of a model context)."""
        return [self.put(data, name, media) for data, name, media in items]

    @abc.abstractmethod
    def get(self, ref: str) -> bytes:
        """The content of ``ref``; raises ArtifactMissing, ArtifactCorrupt, BadArtifactRef."""

    @abc.abstractmethod
    def has(self, ref: str) -> bool:
        """Whether ``ref`` is stored (without verifying its content)."""

    @abc.abstractmethod
    def digests(self) -> list[str]:
        """Hex digests of every stored artifact."""

    def stats(self) -> dict[str, tuple[int, float]]:
        """(size, when stored or last reused, in epoch seconds) of every stored
        artifact, by reference: what a gc plans by."""
        raise NotImplementedError(f"{type(self).__name__} keeps no times for a gc")

    def remove(self, refs: list[str]) -> None:
        """Delete ``refs`` (a gc, already recorded), durably."""
        raise NotImplementedError(f"{type(self).__name__} has no gc")

    def verify(self, ref: str) -> str | None:
        """What is wrong with stored artifact ``ref`` (None: it is there with its
        hash), in a few words for the gate's "artifacts intact". This default reads
        it whole; a backend may remember what it checked."""
        try:
            self.get(ref)
        except SessiondError as exc:
            return str(exc)
        return None

    def verify_many(self, refs: Iterable[str]) -> dict[str, str]:
        """What is wrong with each of ``refs`` that has a problem (see :meth:`verify`)."""
        return {ref: problem for ref in refs if (problem := self.verify(ref)) is not None}


class SnapshotStore(abc.ABC):
    """A session's snapshots, newest wins; unreadable ones are skipped."""

    @abc.abstractmethod
    def save(self, snapshot: Snapshot) -> None:
        """Store durably (write, sync, then publish) and prune old ones."""

    @abc.abstractmethod
    def latest(self, reducer: int) -> Snapshot | None:
        """The newest readable snapshot written by reducer version ``reducer``."""

    @abc.abstractmethod
    def seqs(self) -> list[int]:
        """Seqs of the snapshots present, ascending."""

    @abc.abstractmethod
    def load(self, seq: int) -> Snapshot | None:
        """The snapshot at ``seq`` if present and readable."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Delete every snapshot (they are only an optimisation)."""

    def sizes(self) -> dict[int, int]:
        """Bytes of each snapshot present, by seq (what a gc frees)."""
        raise NotImplementedError(f"{type(self).__name__} has no gc")

    def drop(self, seq: int) -> None:
        """Delete the snapshot at ``seq`` (a gc, already recorded)."""
        raise NotImplementedError(f"{type(self).__name__} has no gc")


class Store(abc.ABC):
    """The sessions of one state dir (or, for a cluster, of one database)."""

    clock: Clock
    # Node-local files beside each session's record (caches the daemon keeps:
    # a parsed spec, a git trigger's cursor): the sessions themselves for files.
    sessions_dir: Path
    # Whether opening a log makes what a crashed writer left durable first.
    sync_on_recover: bool = True

    def names_to_load(self) -> list[str]:
        """The sessions a starting daemon takes into its table: all of them, but on
        a cluster node only those it may own."""
        return self.names()

    def remove_leftovers(self) -> list[str]:
        """Remove what a crashed create left (nothing, where a create is one commit)."""
        return []

    def copy_stamp(self, lines: Sequence[bytes]) -> NodeStamp | None:  # noqa: ARG002
        """The envelope fields (node, epoch) of an event written by whoever creates a
        session from ``lines`` (an import's arrival): none on files."""
        return None

    def owner_of(self, name: str) -> str | None:  # noqa: ARG002
        """The node that owns session ``name`` (None: none, or not a cluster's store)."""
        return None

    def save_snapshots(self, snapshots: list[Snapshot]) -> None:
        """Save many snapshots (at shutdown); a backend may do it in fewer syncs."""
        for snap in snapshots:
            self.snapshots(snap.session).save(snap)

    @abc.abstractmethod
    def names(self) -> list[str]:
        """Names of all sessions, sorted."""

    @abc.abstractmethod
    def exists(self, name: str) -> bool: ...

    @abc.abstractmethod
    async def create(
        self,
        name: str,
        *,
        spec: str | None = None,
        lines: Iterable[bytes] = (),
        artifacts: Iterable[bytes] = (),
        durability: Durability = "fsync",
    ) -> EventLog:
        """Make a new session, all at once or not at all: an empty log, or one
        starting with ``lines`` (framed events copied verbatim by fork and import)
        and holding ``artifacts``. Raises AlreadyExists. The returned log is
        recovered and appendable."""

    @abc.abstractmethod
    async def open_log(self, name: str, *, durability: Durability = "fsync") -> EventLog:
        """Open a session's log for writing; raises NoSuchSession, LogLocked."""

    @abc.abstractmethod
    def read(self, name: str, *, since: int = 1, upto: int | None = None) -> Iterator[Record]:
        """Read events without the writer lock (a live log is fine): stops quietly at
        a torn or half-written end, raises LogCorrupt in the middle."""

    @abc.abstractmethod
    def read_lines(self, name: str, *, upto: int | None = None) -> Iterator[tuple[Record, bytes]]:
        """Like :meth:`read` from seq 1, with each event's exact line (newline included)."""

    @abc.abstractmethod
    def artifacts(self, name: str) -> ArtifactStore: ...

    @abc.abstractmethod
    def snapshots(self, name: str) -> SnapshotStore: ...

    @abc.abstractmethod
    def read_spec(self, name: str) -> str | None: ...

    @abc.abstractmethod
    def write_spec(self, name: str, text: str) -> None: ...
