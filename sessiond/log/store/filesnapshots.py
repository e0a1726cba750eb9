"""A session's snapshots as files: ``snapshots/state-<seq>.json``.

Snapshots are an optimisation; the log wins on disagreement. So a snapshot that
does not parse, or names another seq, reads as none at all, and only the newest
few are kept.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import orjson

from sessiond.codec import frame, unframe
from sessiond.errors import StorageError
from sessiond.log.store.base import LogPosition, Snapshot, SnapshotStore
from sessiond.log.store.durable import read_regular, real_dir, write_durable

SNAPSHOT_FORMAT = "sessiond-snapshot"


class FileSnapshots(SnapshotStore):
    """``state-<seq>.json``: a framed header line and a framed state line."""

    def __init__(self, folder: Path | str, keep: int = 2, hint: int | None = None) -> None:
        # Kept as a string: finding the newest snapshot is part of every session's
        # opening, and paths as objects cost more there than the reads.
        self._at = str(folder)
        self.keep = keep
        # The seq the log is known to end at (the table index's, at start-up): the
        # snapshot there, if any, is the newest one that can match the log, and is
        # read without listing the folder (see latest).
        self.hint = hint

    @property
    def folder(self) -> Path:
        return Path(self._at)

    @staticmethod
    def encode(snapshot: Snapshot) -> bytes:
        header = {
            "format": SNAPSHOT_FORMAT,
            "reducer": snapshot.reducer,
            "session": snapshot.session,
            "seq": snapshot.position.seq,
            "offset": snapshot.position.offset,
            "last_id": snapshot.position.last_id,
        }
        state = snapshot.encoded if snapshot.encoded is not None else orjson.dumps(snapshot.state)
        return frame(orjson.dumps(header)) + frame(state)

    def path(self, seq: int) -> Path:
        return self.folder / f"state-{seq}.json"

    def save(self, snapshot: Snapshot) -> None:
        write_durable(
            real_dir(self.folder) / f"state-{snapshot.position.seq}.json", self.encode(snapshot)
        )
        self.prune()

    def prune(self) -> None:
        for old in self.seqs()[: -self.keep]:
            (self.folder / f"state-{old}.json").unlink(missing_ok=True)

    def sizes(self) -> dict[int, int]:
        out = {}
        for seq in self.seqs():
            try:
                out[seq] = os.lstat(self.path(seq)).st_size
            except FileNotFoundError:
                continue
        return out

    def drop(self, seq: int) -> None:
        # a gc fsyncs the folder once for all it dropped (sessiond.log.retention)
        with contextlib.suppress(FileNotFoundError):
            (real_dir(self.folder) / f"state-{seq}.json").unlink()

    def seqs(self) -> list[int]:
        try:
            names = os.listdir(real_dir(self._at))
        except FileNotFoundError:
            return []
        found = []
        for n in names:
            if n.startswith("state-") and n.endswith(".json") and n[6:-5].isdigit():
                found.append(int(n[6:-5]))
        return sorted(found)

    def load(self, seq: int) -> Snapshot | None:
        try:
            raw = read_regular(f"{self._at}/state-{seq}.json")
        except (OSError, StorageError):
            return None
        parts = raw.split(b"\n")
        if len(parts) != 3 or parts[2]:
            return None
        bodies = [unframe(p) for p in parts[:2]]
        if bodies[0] is None or bodies[1] is None:
            return None
        try:
            header = orjson.loads(bodies[0])
            state = orjson.loads(bodies[1])
            if header.get("format") != SNAPSHOT_FORMAT or header["seq"] != seq:
                return None
            position = LogPosition(int(header["seq"]), int(header["offset"]), header["last_id"])
            return Snapshot(int(header["reducer"]), str(header["session"]), position, state)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def latest(self, reducer: int) -> Snapshot | None:
        hint, self.hint = self.hint, None
        if hint is not None:
            # No snapshot beyond the log's end can match it, so the one at its end is
            # the newest worth having; and any that matches (the opening checks it
            # against the log) is as good a start as a newer one: the log is the
            # truth. Listing the folder was a quarter of a start-up's opening.
            try:
                real_dir(self._at)  # (a symlink planted in its place: refused, as below)
            except FileNotFoundError:
                return None
            snap = self.load(hint)
            if snap is not None and snap.reducer == reducer:
                return snap
        for seq in reversed(self.seqs()):
            snap = self.load(seq)
            if snap is not None and snap.reducer == reducer:
                return snap
        return None

    def clear(self) -> None:
        for seq in self.seqs():
            (self.folder / f"state-{seq}.json").unlink(missing_ok=True)
