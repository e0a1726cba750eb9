"""A session's artifacts and snapshots in PostgreSQL.

Artifacts are content-addressed once for the whole database (``artifacts``) and
belong to sessions through ``session_artifacts``: a reference resolves inside the
session's own store (docs/design.md section 4) even though the bytes are shared.
Every read checks the hash, as the files backend does.

Snapshots are an optimisation, as on files: the newest ``keep`` are kept, and one
that does not decode reads as none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
import psycopg

from sessiond.errors import ArtifactCorrupt, ArtifactMissing, BadArtifactRef
from sessiond.log.event_data import SHA256_REF, ArtifactRef
from sessiond.log.store.base import ArtifactStore, LogPosition, Snapshot, SnapshotStore

Query = Callable[[str, Mapping[str, object]], list[tuple[Any, ...]]]
Execute = Callable[[Sequence[tuple[str, Mapping[str, object]]]], None]

PUT = [
    "INSERT INTO artifacts (digest, data) VALUES (%(d)s, %(data)s) ON CONFLICT DO NOTHING",
    # reused: a gc leaves an artifact this fresh alone (sessiond.log.retention), as
    # the event naming it again is on its way (the files backend touches the file)
    "INSERT INTO session_artifacts (session, digest) VALUES (%(s)s, %(d)s) "
    "ON CONFLICT (session, digest) DO UPDATE SET stored_at = now() "
    "WHERE session_artifacts.stored_at < now() - interval '1 minute'",
]
# gc: the session lets go of them; the bytes go once no session holds them
REMOVE = [
    "DELETE FROM session_artifacts WHERE session = %(s)s AND digest = ANY(%(d)s)",
    "DELETE FROM artifacts AS a WHERE a.digest = ANY(%(d)s) AND NOT EXISTS "
    "(SELECT 1 FROM session_artifacts AS sa WHERE sa.digest = a.digest)",
]


def _digest(ref: str) -> str:
    if not isinstance(ref, str) or not SHA256_REF.fullmatch(ref):
        raise BadArtifactRef(
            f"artifact reference {ref!r} is not valid: it must be 'sha256:' followed by "
            "64 lowercase hex digits"
        )
    return ref[7:]


class PgArtifacts(ArtifactStore):
    def __init__(self, session: str, query: Query, execute: Execute) -> None:
        self.session = session
        self._query = query
        self._execute = execute

    def put(
        self, data: bytes, name: str, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        params = {"s": self.session, "d": digest, "data": bytes(data)}
        try:
            self._execute([(sql, params) for sql in PUT])
        except psycopg.errors.ForeignKeyViolation:
            # another session's gc removed the bytes between our two statements (we
            # found them there, then held them): stored again, the second time whole
            self._execute([(sql, params) for sql in PUT])
        return ArtifactRef(ref=f"sha256:{digest}", name=name, size=len(data), media_type=media_type)

    def get(self, ref: str) -> bytes:
        digest = _digest(ref)
        rows = self._query(
            "SELECT a.data FROM session_artifacts AS sa JOIN artifacts AS a USING (digest) "
            "WHERE sa.session = %(s)s AND sa.digest = %(d)s",
            {"s": self.session, "d": digest},
        )
        if not rows:
            raise ArtifactMissing(f"artifact {ref} is missing from session {self.session!r}")
        data = bytes(rows[0][0])
        if hashlib.sha256(data).hexdigest() != digest:
            raise ArtifactCorrupt(
                f"artifact {ref} of session {self.session!r} does not match its hash; "
                "restore the database from a backup"
            )
        return data

    def has(self, ref: str) -> bool:
        rows = self._query(
            "SELECT 1 FROM session_artifacts WHERE session = %(s)s AND digest = %(d)s",
            {"s": self.session, "d": _digest(ref)},
        )
        return bool(rows)

    def digests(self) -> list[str]:
        rows = self._query(
            "SELECT digest FROM session_artifacts WHERE session = %(s)s ORDER BY digest",
            {"s": self.session},
        )
        return [r[0] for r in rows]

    def stats(self) -> dict[str, tuple[int, float]]:
        rows = self._query(
            "SELECT sa.digest, octet_length(a.data), extract(epoch FROM sa.stored_at)::float8 "
            "FROM session_artifacts AS sa JOIN artifacts AS a USING (digest) "
            "WHERE sa.session = %(s)s",
            {"s": self.session},
        )
        return {f"sha256:{d}": (int(size), float(at)) for d, size, at in rows}

    def remove(self, refs: list[str]) -> None:
        params = {"s": self.session, "d": [_digest(ref) for ref in refs]}
        self._execute([(sql, params) for sql in REMOVE])


class PgSnapshots(SnapshotStore):
    def __init__(self, session: str, query: Query, execute: Execute, keep: int = 2) -> None:
        self.session = session
        self._query = query
        self._execute = execute
        self.keep = keep

    def save(self, snapshot: Snapshot) -> None:
        state = snapshot.encoded if snapshot.encoded is not None else orjson.dumps(snapshot.state)
        pos = snapshot.position
        params = {
            "s": self.session,
            "seq": pos.seq,
            "r": snapshot.reducer,
            "o": pos.offset,
            "id": pos.last_id,
            "state": state,
            "keep": self.keep,
        }
        self._execute(
            [
                (
                    "INSERT INTO snapshots (session, seq, reducer, log_offset, last_id, state) "
                    "VALUES (%(s)s, %(seq)s, %(r)s, %(o)s, %(id)s, %(state)s) "
                    "ON CONFLICT (session, seq) DO UPDATE SET reducer = excluded.reducer, "
                    "log_offset = excluded.log_offset, last_id = excluded.last_id, "
                    "state = excluded.state",
                    params,
                ),
                (
                    "DELETE FROM snapshots WHERE session = %(s)s AND seq NOT IN "
                    "(SELECT seq FROM snapshots WHERE session = %(s)s "
                    "ORDER BY seq DESC LIMIT %(keep)s)",
                    params,
                ),
            ]
        )

    def _decode(self, row: tuple[Any, ...]) -> Snapshot | None:
        seq, reducer, offset, last_id, raw = row
        try:
            state = orjson.loads(bytes(raw))
        except orjson.JSONDecodeError:
            return None
        return Snapshot(
            int(reducer), self.session, LogPosition(int(seq), int(offset), last_id), state
        )

    def latest(self, reducer: int) -> Snapshot | None:
        rows = self._query(
            "SELECT seq, reducer, log_offset, last_id, state FROM snapshots "
            "WHERE session = %(s)s AND reducer = %(r)s ORDER BY seq DESC",
            {"s": self.session, "r": reducer},
        )
        for row in rows:
            snap = self._decode(row)
            if snap is not None:
                return snap
        return None

    def seqs(self) -> list[int]:
        rows = self._query(
            "SELECT seq FROM snapshots WHERE session = %(s)s ORDER BY seq", {"s": self.session}
        )
        return [int(r[0]) for r in rows]

    def load(self, seq: int) -> Snapshot | None:
        rows = self._query(
            "SELECT seq, reducer, log_offset, last_id, state FROM snapshots "
            "WHERE session = %(s)s AND seq = %(seq)s",
            {"s": self.session, "seq": seq},
        )
        return self._decode(rows[0]) if rows else None

    def sizes(self) -> dict[int, int]:
        rows = self._query(
            "SELECT seq, octet_length(state) FROM snapshots WHERE session = %(s)s",
            {"s": self.session},
        )
        return {int(seq): int(size) for seq, size in rows}

    def drop(self, seq: int) -> None:
        """Delete the snapshot at ``seq`` (gc; fsck --repair: it disagrees with the log)."""
        params = {"s": self.session, "q": seq}
        self._execute([("DELETE FROM snapshots WHERE session = %(s)s AND seq = %(q)s", params)])

    def clear(self) -> None:
        self._execute([("DELETE FROM snapshots WHERE session = %(s)s", {"s": self.session})])
