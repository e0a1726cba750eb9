"""A target's durable cursor: how far each session's log has been notified.

One file per target, ``<state>/notify/<target>.cursor``: a header line, then one
line per step forward, ``{"s": session, "q": seq}``, each meaning "every notice
of this session up to ``seq`` is delivered (or was never due)". The last line of
a session wins. Lines are appended as notices are delivered (written and
fsynced right after each delivery, so only a kill between the two may send one
again); the file is rewritten whole, atomically, at start-up and at a clean stop.
A torn last line (a kill in the middle of a write) is ignored: its step is
taken again, which is at most one resend. The daemon also rewrites it every
``CHECKPOINT`` seconds while events come, so a start-up after a crash reads
only the logs' newest events.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import orjson

from sessiond.log.store.durable import write_all, write_durable

FILE_MODE = 0o600
CHECKPOINT = 60.0  # seconds between whole rewrites while events come


class Cursor:
    """The positions of one target. ``since``: when the target first appeared (an
    RFC 3339 time); a session it has no line for is notified only of records from
    then on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.positions: dict[str, int] = {}
        self.since: str | None = None
        self.new = False  # no file yet: the target is new, nothing old is due
        self._fd: int | None = None
        # the delivery thread and the loop (a new session's first line) both append
        self._lock = threading.Lock()

    def load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.new = True
            self.since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            return
        lines = raw.split(b"\n")
        for line in lines:
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # the torn last line of a killed write; its step is taken again
            if not isinstance(entry, dict):
                continue
            if "since" in entry:
                self.since = str(entry["since"])
            elif isinstance(entry.get("s"), str) and isinstance(entry.get("q"), int):
                self.positions[entry["s"]] = max(self.positions.get(entry["s"], 0), entry["q"])
        if self.since is None:  # a header lost: be safe, notify everything not marked done
            self.since = "0000"

    def rewrite(self, positions: dict[str, int]) -> None:
        """Replace the file with one line per session (blocking: call it off the loop
        when the loop serves). A step the delivery thread took meanwhile is kept."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            merged = dict(positions)
            for session, seq in self.positions.items():
                merged[session] = max(merged.get(session, 0), seq)
            lines = [orjson.dumps({"since": self.since})]
            lines += [orjson.dumps({"s": s, "q": q}) for s, q in sorted(merged.items())]
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_durable(self.path, b"\n".join(lines) + b"\n")
            self.positions = merged
            self.new = False

    def advance(self, session: str, seq: int, *, sync: bool) -> None:
        """Record that ``session`` is done up to ``seq``; with ``sync``, durably
        (blocking: the delivery thread calls it right after a delivery)."""
        with self._lock:
            if seq <= self.positions.get(session, -1):
                return
            if self._fd is None:
                self._fd = os.open(
                    self.path,
                    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                    FILE_MODE,
                )
            write_all(self._fd, orjson.dumps({"s": session, "q": seq}) + b"\n")
            if sync:
                os.fsync(self._fd)
            self.positions[session] = seq  # only once it is written

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
