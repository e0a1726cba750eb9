"""An in-memory backend: the second implementation of the storage contract.

Useful for unit tests of logic above storage, and a check that the interface
does not leak file-system ideas (it stores records, not bytes; a write is
durable at once, so nothing is ever torn).
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from sessiond.codec import Clock, decode_line
from sessiond.errors import (
    AlreadyExists,
    ArtifactCorrupt,
    ArtifactMissing,
    BadArtifactRef,
    LogFailed,
    LogLocked,
    NoSuchSession,
)
from sessiond.log.event_data import SHA256_REF, ArtifactRef
from sessiond.log.store.base import (
    START,
    ArtifactStore,
    Draft,
    Durability,
    EventLog,
    LogPosition,
    Pending,
    PositionMismatch,
    Record,
    Repair,
    Snapshot,
    SnapshotStore,
    Store,
)
from sessiond.log.store.lines import RecordBuilder
from sessiond.names import check_name


@dataclass
class _Session:
    lines: list[bytes] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    artifacts: dict[str, bytes] = field(default_factory=dict)
    snapshots: dict[int, Snapshot] = field(default_factory=dict)
    spec: str | None = None
    locked: bool = False


class MemoryEventLog(EventLog):
    def __init__(self, session: str, data: _Session, durability: Durability, clock: Clock) -> None:
        self.session = session
        self.durability = durability
        self._data = data
        self._builder = RecordBuilder(session, clock)
        self._pos = START
        self._recovered = False
        self._closed = False

    @property
    def position(self) -> LogPosition:
        return self._pos

    @property
    def repair(self) -> Repair | None:
        return None

    def recover(self, after: LogPosition = START) -> Iterator[Record]:
        records = self._data.records
        if after.seq and (
            after.seq > len(records) or records[after.seq - 1]["id"] != after.last_id
        ):
            raise PositionMismatch(f"seq {after.seq} is not in the log with that id")
        for record in records[after.seq :]:
            yield copy.deepcopy(record)
        self._pos = self._position(len(records))
        self._recovered = True

    def _position(self, seq: int) -> LogPosition:
        last = self._data.records[seq - 1]["id"] if seq else None
        return LogPosition(seq, seq, last)

    def write_many(self, drafts: Sequence[Draft]) -> Pending:
        if not self._recovered:
            raise RuntimeError("recover() the log before appending to it")
        if self._closed:
            raise LogFailed(f"the log of session {self.session!r} is closed")
        records, buf = self._builder.build(self._pos.seq, drafts)
        self._data.records.extend(copy.deepcopy(records))
        self._data.lines.extend(line + b"\n" for line in buf.split(b"\n")[:-1])
        self._pos = self._position(len(self._data.records))
        return Pending(records, self._pos)

    async def sync(self, pending: Pending) -> None:  # noqa: ARG002 - durable at write
        return None

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._data.locked = False


class MemoryArtifacts(ArtifactStore):
    def __init__(self, blobs: dict[str, bytes]) -> None:
        self._blobs = blobs

    def _digest(self, ref: str) -> str:
        if not isinstance(ref, str) or not SHA256_REF.fullmatch(ref):
            raise BadArtifactRef(f"artifact reference {ref!r} is not 'sha256:<64 hex>'")
        return ref[7:]

    def put(
        self, data: bytes, name: str, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        self._blobs[digest] = bytes(data)
        return ArtifactRef(ref=f"sha256:{digest}", name=name, size=len(data), media_type=media_type)

    def get(self, ref: str) -> bytes:
        digest = self._digest(ref)
        if digest not in self._blobs:
            raise ArtifactMissing(f"artifact {ref} is missing")
        data = self._blobs[digest]
        if hashlib.sha256(data).hexdigest() != digest:
            raise ArtifactCorrupt(f"artifact {ref} does not match its hash")
        return data

    def has(self, ref: str) -> bool:
        return self._digest(ref) in self._blobs

    def digests(self) -> list[str]:
        return sorted(self._blobs)


class MemorySnapshots(SnapshotStore):
    def __init__(self, snaps: dict[int, Snapshot], keep: int = 2) -> None:
        self._snaps = snaps
        self.keep = keep

    def save(self, snapshot: Snapshot) -> None:
        self._snaps[snapshot.position.seq] = copy.deepcopy(snapshot.decoded())
        for old in self.seqs()[: -self.keep]:
            del self._snaps[old]

    def latest(self, reducer: int) -> Snapshot | None:
        for seq in reversed(self.seqs()):
            if self._snaps[seq].reducer == reducer:
                return copy.deepcopy(self._snaps[seq])
        return None

    def seqs(self) -> list[int]:
        return sorted(self._snaps)

    def load(self, seq: int) -> Snapshot | None:
        snap = self._snaps.get(seq)
        return copy.deepcopy(snap) if snap else None

    def clear(self) -> None:
        self._snaps.clear()


class MemoryStore(Store):
    def __init__(self, *, clock: Clock = time.time_ns, snapshots_keep: int = 2) -> None:
        self._sessions: dict[str, _Session] = {}
        self.clock = clock
        self.snapshots_keep = snapshots_keep

    def _get(self, name: str) -> _Session:
        check_name(name)
        try:
            return self._sessions[name]
        except KeyError:
            raise NoSuchSession(f"no session {name!r}") from None

    def names(self) -> list[str]:
        return sorted(self._sessions)

    def exists(self, name: str) -> bool:
        return check_name(name) in self._sessions

    async def create(
        self,
        name: str,
        *,
        spec: str | None = None,
        lines: Iterable[bytes] = (),
        artifacts: Iterable[bytes] = (),
        durability: Durability = "fsync",
    ) -> EventLog:
        if self.exists(name):
            raise AlreadyExists(f"session {name!r} exists already; pick another name")
        data = _Session(spec=spec)
        for line in lines:
            record = decode_line(line.rstrip(b"\n"))
            if record is None:
                raise ValueError("create() was given a line that fails its checksum")
            data.lines.append(line)
            data.records.append(record)
        for blob in artifacts:
            data.artifacts[hashlib.sha256(blob).hexdigest()] = bytes(blob)
        self._sessions[name] = data
        log = await self.open_log(name, durability=durability)
        for _ in log.recover():
            pass
        return log

    async def open_log(self, name: str, *, durability: Durability = "fsync") -> EventLog:
        data = self._get(name)
        if data.locked:
            raise LogLocked(f"the log of session {name!r} is open by another writer")
        data.locked = True
        return MemoryEventLog(name, data, durability, self.clock)

    def read(self, name: str, *, since: int = 1, upto: int | None = None) -> Iterator[Record]:
        records = self._get(name).records
        stop = len(records) if upto is None else min(upto, len(records))
        for record in records[max(since, 1) - 1 : stop]:
            yield copy.deepcopy(record)

    def read_lines(self, name: str, *, upto: int | None = None) -> Iterator[tuple[Record, bytes]]:
        data = self._get(name)
        stop = len(data.records) if upto is None else min(upto, len(data.records))
        for i in range(stop):
            yield copy.deepcopy(data.records[i]), data.lines[i]

    def artifacts(self, name: str) -> ArtifactStore:
        return MemoryArtifacts(self._get(name).artifacts)

    def snapshots(self, name: str) -> SnapshotStore:
        return MemorySnapshots(self._get(name).snapshots, keep=self.snapshots_keep)

    def read_spec(self, name: str) -> str | None:
        return self._get(name).spec

    def write_spec(self, name: str, text: str) -> None:
        self._get(name).spec = text
