"""The table index: a compact row per session, so the daemon answers at once.

Opening 10,000 logs takes seconds; listing them from one small file takes a few
ms. ``table.index`` (in the state dir) holds, for each session, its ``ps`` row
and what that row reflects: the log's seq, and the log's and the spec's file
identity (inode, size, mtime) at that moment. It is a cache, never the truth:

- at start-up an entry whose log or spec is not exactly the file it describes
  (an append since, a torn tail cut, a spec rewritten, a folder replaced) is
  *stale*: that session is opened from its log before ``ps`` answers, as is any
  session with no entry, and any whose entry says work was in flight;
- the file is orjson lines: a header, then one entry per line, a later line for
  a name replacing an earlier one. Changes are appended in batches (a second
  after a durable append, never in the append path); the file is rewritten whole,
  atomically, at a clean stop and when the appended lines outgrow it;
- nothing in it is fsynced but the clean stop's copy: a line a crash tore or lost
  is skipped, so its session is stale, and opened from its log first. A line that
  cannot be read is skipped; an index that cannot be read at all is ignored (every
  session is opened from its log, as before the index existed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
import structlog

from sessiond.log.state import State
from sessiond.log.store.base import Record
from sessiond.log.store.durable import write_all, write_durable
from sessiond.replies import PsRow
from sessiond.table import indexfile
from sessiond.table.indexfile import (  # the read half, on its own for the early server
    HEADER,
    INDEX_NAME,
    LOG_NAME,
    SPEC_NAME,
    Entry,
    Plan,
    Stamp,
    plan,
    stamp,
)
from sessiond.table.sessions import Session, summary

__all__ = ["FLUSH_EVERY", "HEADER", "INDEX_NAME", "LOG_NAME", "SPEC_NAME", "Entry", "IndexKeeper",
           "Plan", "Stamp", "busy", "entry_for", "plan", "read_index", "stamp"]  # fmt: skip

log = structlog.get_logger(__name__)

FLUSH_EVERY = 1.0  # seconds: how long a change waits before its line is appended


def busy(state: State) -> bool:
    """Work in flight: what the daemon must recover, resume or re-time at start-up
    (a run, a queue place, a hand-over, an open turn, wakes or a timed sleep)."""
    return (
        state.state in ("ready", "running", "arriving")
        or state.handover is not None
        or state.turn is not None
        or bool(state.pending_wakes)
        or state.until is not None
        or "retry" in state.reason
        or (state.state == "suspended" and state.reason.startswith("budget: runs_per_day"))
    )


def entry_for(
    session: Session,
    sessions_dir: Path,
    wake_fn: Callable[[Session], str | None],
    wake_at: float | None,
) -> Entry | None:
    """The session's entry now, or None when its log is not exactly what its state
    folded (an append not yet on disk, or not yet durable): tried again later."""
    base = f"{sessions_dir}/{session.name}"
    log_stamp = stamp(f"{base}/{LOG_NAME}")
    journal = session.journal_or_none
    row = summary(session, wake_fn)
    row["pid"] = None  # no run outlives the daemon
    if journal is None:  # a log that cannot be used: opened (and refused) first again
        return (
            None if log_stamp is None else _make(session, 0, log_stamp, base, is_busy=True, row=row)
        )
    position = journal.log.position
    synced = getattr(journal.log, "synced_offset", position.offset)
    if (
        log_stamp is None
        or position.seq != journal.state.seq
        or log_stamp[1] != position.offset
        or synced < position.offset
    ):
        return None
    if session.held is not None:  # held in memory only: the next start reads the log's
        row["state"], row["reason"] = journal.state.state, journal.state.reason
    entry = _make(session, position.seq, log_stamp, base, is_busy=busy(journal.state), row=row)
    entry["wake_at"] = wake_at
    if session.spec is not None:  # (no spec: no agent's budget counts it)
        days = journal.state.model_spend.get("days", {})
        entry["spend"] = {day: list(used) for day, used in days.items()}
    return entry


def _make(
    session: Session, seq: int, log_stamp: Stamp, base: str, *, is_busy: bool, row: PsRow
) -> Entry:
    return {
        "name": session.name,
        "seq": seq,
        "log": log_stamp,
        "spec": stamp(f"{base}/{SPEC_NAME}"),
        "busy": is_busy,
        "wake_at": None,
        "row": row,
        "triggers": session.spec is not None and session.spec.has_triggers,
        "workspace": _workspace(session),
    }


def _workspace(session: Session) -> str | None:
    spec = session.spec
    return str(spec.workspace) if spec is not None and spec.run is not None else None


def read_index(path: Path) -> tuple[dict[str, Entry], int]:
    """The entries of the index at ``path`` (sessiond.table.indexfile), its
    warnings in the daemon's log."""
    return indexfile.read_index(path, lambda event, fields: log.warning(event, **fields))


class IndexKeeper:
    """Keeps ``table.index`` up to date as sessions change: marks a session on
    each durable append (a table listener), appends the marked sessions' lines
    once a second, rewrites the file whole when it is mostly stale lines."""

    def __init__(
        self,
        path: Path,
        sessions_dir: Path,
        entry_of: Callable[[str], Entry | None],
        names: Callable[[], Iterable[str]],
    ) -> None:
        self.path = path
        self.sessions_dir = sessions_dir
        self.entry_of = entry_of  # a session's entry now; None when it cannot be had now
        self.names = names  # every session's name (open or not)
        self.kept: dict[str, Entry] = {}  # what the file holds now, by name
        self.lines = 0  # entry lines in the file (with the replaced ones)
        self.dirty: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def note(self, name: str, _record: Record | None = None) -> None:
        """A session changed (a table listener: called once its append is durable)."""
        self.dirty.add(name)
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(FLUSH_EVERY)  # a batch: every change of the last second
            try:
                self.flush()
                if self.dirty:  # entries that could not be had yet: the next batch
                    self._wake.set()
            except OSError as exc:  # a cache: the next start opens those sessions first
                log.warning("index.unwritten", path=str(self.path), why=str(exc))

    def flush(self) -> None:
        """Append a line for each changed session whose entry can be had now."""
        if not self.dirty:
            return
        if self.lines > max(1000, 2 * len(self.kept)):
            self.write_whole(durable=False)
            return
        out: list[bytes] = []
        live = set(self.names())
        for name in sorted(self.dirty):
            if name not in live:  # gone from the table: the next start will not list it
                self.dirty.discard(name)
                continue
            entry = self.entry_of(name)
            if entry is None:
                continue  # not durable yet, or moving: kept dirty for the next batch
            self.dirty.discard(name)
            self.kept[name] = entry
            out.append(orjson.dumps(entry))
        if not out:
            return
        fresh = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            write_all(fd, (HEADER if fresh else b"") + b"\n".join(out) + b"\n")
        finally:
            os.close(fd)
        self.lines += len(out)

    def write_whole(self, *, durable: bool) -> None:
        """Rewrite the index with one entry per session, atomically (durably at a
        clean stop: what the next start reads first)."""
        entries: dict[str, Entry] = {}
        for name in self.names():
            self._put(entries, name)
        self._write(entries, durable=durable)

    async def rewrite(self) -> None:
        """As ``write_whole`` (not durably), a slice of sessions at a time: after a
        start that found entries missing or stale, so that the next one finds them."""
        entries: dict[str, Entry] = {}
        for n, name in enumerate(list(self.names())):
            self._put(entries, name)
            if n % 256 == 255:
                await asyncio.sleep(0)  # the loop answers meanwhile
        self._write(entries, durable=False)

    def _put(self, entries: dict[str, Entry], name: str) -> None:
        entry = self.entry_of(name)
        if entry is None:
            entry = self.kept.get(name)  # not opened since the start: as it was read
            if entry is None:
                return
        else:
            self.dirty.discard(name)
        entries[name] = entry

    def _write(self, entries: dict[str, Entry], *, durable: bool) -> None:
        body = HEADER + b"".join(orjson.dumps(e) + b"\n" for e in entries.values())
        if durable:
            write_durable(self.path, body)
        else:
            tmp = self.path.with_name(f".{INDEX_NAME}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                write_all(fd, body)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        self.kept, self.lines = entries, len(entries)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
