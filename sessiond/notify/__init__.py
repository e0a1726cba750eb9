"""Notifications (docs/design.md section 11): ``[[notify]]`` targets fed from the log.

Every record a session's log makes durable reaches the table's listeners; a
target that wants it (sessiond.notify.notices) queues a notice for it and
delivers it (sessiond.notify.target). What was delivered is kept in a durable
cursor per target (sessiond.notify.cursor), and at start-up each target reads
the logs on from its cursor: a notice whose record was durable before a crash
and that was not delivered yet is sent then. So none is lost, and one is sent
twice only when the daemon was killed between its delivery and the cursor's
write; its id (``session:seq``) is the same both times.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import structlog

from sessiond.config import NOTICE_EVENTS, BadConfig, DaemonConfig
from sessiond.errors import SessiondError
from sessiond.log.events import CURRENT_VERSION as EVENT_TYPES
from sessiond.log.store.base import Record, Store
from sessiond.notify.cursor import CHECKPOINT, Cursor
from sessiond.notify.links import LinkKey, approval_links
from sessiond.notify.notices import Notice, notice_for
from sessiond.notify.target import Target, load_apprise, target_id
from sessiond.replies import TargetStatus
from sessiond.table.sessions import Table

log = structlog.get_logger(__name__)


class Notices:
    """Every target of the configuration, fed from the table's appends."""

    def __init__(self, config: DaemonConfig, table: Table, store: Store) -> None:
        self.config = config
        self.table = table
        self.store = store
        self.targets: list[Target] = []
        # per session, the last seq every target has looked at (live or read back)
        self._seen: dict[str, int] = {}
        self._unlisten: Any = None
        self._moved = asyncio.Event()  # records came since the last checkpoint
        self._checkpoints: asyncio.Task[None] | None = None
        self.links = LinkKey(config.state_dir)

    def behind(self, pending: Mapping[str, int]) -> list[str]:
        """Of the sessions not opened yet (``pending``: each one's seq, its log's end,
        as the table index proved it), those some target has not looked at up to
        that end: opened before :meth:`start`, whose read-back reads them as any
        open session's (with a vouched one's log unchanged since its entry, the
        others have nothing due)."""
        self._targets()
        looking = [t.cursor for t in self.targets if not t.cursor.new]
        return [
            name
            for name, seq in pending.items()
            if any(c.positions.get(name, -1) < seq for c in looking)
        ]

    def start(self, pending: Mapping[str, int] | None = None) -> None:
        """Open the cursors, read back what is due since them, then follow the
        appends. Call it after the table is loaded and before anything appends.
        ``pending``: the sessions not opened yet and their logs' ends (none is
        behind: :meth:`behind`), whose places the cursors keep."""
        if not self._targets():
            return
        self._unlisten = self.table.listen(self._on_record)
        for target in self.targets:
            self._catch_up(target, pending or {})
            target.start()
        self._checkpoints = asyncio.ensure_future(self._checkpoint_loop())

    def _targets(self) -> bool:
        """The targets and their cursors, read once; False when there are none."""
        if not self.config.notify:
            return False
        if self.targets:
            return True
        ids = [target_id(t) for t in self.config.notify]
        if len(set(ids)) != len(ids):
            raise BadConfig(
                "[[notify]]: two targets have the same name or URL; give each a distinct 'name'"
            )
        for entry in self.config.notify:
            unknown = [e for e in entry.events if e not in NOTICE_EVENTS and e not in EVENT_TYPES]
            if unknown:
                raise BadConfig(
                    f"[[notify]] {target_id(entry)}: events: {', '.join(unknown)}: no such event; "
                    f"use {', '.join(NOTICE_EVENTS)}, or an event type of docs/events.md"
                )
        if any(t.links for t in self.config.notify) and self.config.web.link_base() is None:
            raise BadConfig(
                "[[notify]] links = true needs the web console's address for its links: "
                'set [web] listen to a fixed port (e.g. "127.0.0.1:8765") or [web] public_url'
            )
        apprise = load_apprise()
        folder = self.config.state_dir / "notify"
        for entry, tid in zip(self.config.notify, ids, strict=True):
            cursor = Cursor(folder / f"{tid}.cursor")
            cursor.load()
            self.targets.append(Target(entry, cursor, apprise, self.config.state_dir))
        return True

    def _catch_up(self, target: Target, pending: Mapping[str, int]) -> None:
        """Queue what the target has not had of each log, then write its cursor whole.

        Synchronous on purpose: nothing is appended meanwhile, so no live record
        can slip between the read and the listener."""
        public_url = self.config.web.link_base()
        since = target.cursor.since or ""
        kept = target.cursor.positions
        positions: dict[str, int] = {}
        ends: list[tuple[str, int]] = []  # each readable log's end
        for s in self.table:
            if s.journal_or_none is None:  # a log that cannot be read: its place is kept
                if s.name in kept:
                    positions[s.name] = kept[s.name]
                continue
            ends.append((s.name, s.journal.state.seq))
        # not opened yet: its log ends where the table index proved it does
        ends += [(n, end) for n, end in pending.items() if n not in self.table.sessions]
        for name, end in ends:
            start = end if target.cursor.new else kept.get(name)
            if start is None or start < end:
                try:
                    for record in self.store.read(name, since=(start or 0) + 1, upto=end):
                        if start is None and record["ts"] < since:
                            continue  # before the target existed
                        notice = self._notice(target, name, record, public_url)
                        if notice is not None:
                            target.put(notice)
                except SessiondError as exc:  # read again at the next start
                    log.error("notify.unreadable", target=target.id, session=name, error=str(exc))
                    if start is not None:
                        positions[name] = start
                    continue
            positions[name] = end
            self._seen[name] = max(self._seen.get(name, 0), end)
        for name, first in target.first_pending().items():
            positions[name] = first - 1
        # sessions gone from the table (retention) leave the cursor with them
        target.cursor.positions = {}
        target.cursor.rewrite(positions)
        if target.queue:
            log.info("notify.catching_up", target=target.id, notices=len(target.queue))

    def _on_record(self, session: str, record: Record) -> None:
        seq = record["seq"]
        if seq <= self._seen.get(session, 0):
            return
        first_sight = session not in self._seen
        self._seen[session] = seq
        self._moved.set()
        public_url = self.config.web.link_base()
        for target in self.targets:
            if first_sight and session not in target.cursor.positions:
                # a session new since start-up (created, forked, imported): mark where
                # its notices begin, so a restart never notifies the records a fork
                # or an import copied into it
                target.cursor.advance(session, seq - 1, sync=False)
            notice = self._notice(target, session, record, public_url)
            if notice is not None:
                target.put(notice)

    def _notice(
        self, target: Target, session: str, record: Record, public_url: str | None
    ) -> Notice | None:
        """The target's notice for the record; an approval's with its signed links
        when the target asks for them (``links = true``)."""
        notice = notice_for(session, record, target.wanted, public_url)
        if notice is None or not target.config.links or public_url is None:
            return notice
        if notice.event != "approval.requested" or session not in self.table.sessions:
            return notice
        s = self.table.sessions[session]
        try:
            actions = approval_links(
                self.links, public_url, s, record, target=target.id, ttl=target.config.link_ttl
            )
        except (OSError, ValueError, SessiondError) as exc:  # no key (a read-only state dir):
            # no links, but the notice goes (this runs in the table's listener: never raise)
            log.error("notify.links_failed", target=target.id, session=session, error=str(exc))
            return notice
        return dataclasses.replace(notice, actions=actions) if actions else notice

    def status(self) -> list[TargetStatus]:
        return [t.status() for t in self.targets]

    def _positions(self, target: Target) -> dict[str, int]:
        """Where each session is done for ``target``: what it has looked at, short of
        the first notice still to deliver."""
        positions = dict(target.cursor.positions)
        for name, seq in self._seen.items():
            positions[name] = max(positions.get(name, 0), seq)
        for name, first in target.first_pending().items():
            positions[name] = min(positions.get(name, first - 1), first - 1)
        return positions

    async def _checkpoint_loop(self) -> None:
        """Rewrite the cursors now and then while events come (in a worker thread),
        so that a start-up after a crash has little of the logs to read again."""
        while True:
            await self._moved.wait()
            await asyncio.sleep(CHECKPOINT)  # at most one rewrite a period
            self._moved.clear()
            for target in self.targets:
                try:
                    await asyncio.to_thread(target.cursor.rewrite, self._positions(target))
                except OSError as exc:  # the appended lines still hold; try again later
                    log.warning("notify.checkpoint_failed", target=target.id, error=str(exc))

    async def close(self) -> None:
        """Stop delivering; write each cursor whole (so the next start reads nothing)."""
        if self._unlisten is not None:
            self._unlisten()
        if self._checkpoints is not None:
            self._checkpoints.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpoints
        for target in self.targets:
            await target.close()
            try:
                target.cursor.rewrite(self._positions(target))
            except OSError as exc:  # the appended lines still hold: nothing is lost
                log.error("notify.cursor_unwritable", target=target.id, error=str(exc))
