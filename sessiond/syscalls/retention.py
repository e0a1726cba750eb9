"""``gc``: apply ``[retention]`` now, and every ``interval`` (docs/design.md section 6).

For each session: read its log from where the last gc stopped (without its
lock, a slice at a time, so the loop and the session go on), then under its lock
read what was appended since, plan (sessiond.log.retention), record the plan
as ``gc.collected`` (durable), and only then remove the files. A dry run plans
and reports, and changes nothing. One gc runs at a time; an operator action
(a run's processes cannot call it: sessiond.ipc.runpeer and the program
endpoint refuse it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal

import structlog

from sessiond.errors import SessiondError
from sessiond.log.event_data import CollectedArtifact, GcCollected
from sessiond.log.evidence import Evidence
from sessiond.log.pace import Pacer
from sessiond.log.retention import Plan, needed, plan, remove
from sessiond.log.store.base import START, LogPosition, PositionMismatch, Record
from sessiond.log.store.files import FileStore
from sessiond.replies import GcReport, Who
from sessiond.runs.context import RunContext
from sessiond.table.sessions import Session

log = structlog.get_logger(__name__)

Trigger = Literal["sessionctl", "interval"]


# How many artifact references the gcs' read positions may keep in memory, across
# all sessions (about 100 bytes each).
KEPT_REFS = 100_000


def _size(evidence: Evidence) -> int:
    return len(evidence.referenced) + len(evidence.collected)


class Retention:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._one = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._interval: float | None = None
        self._removed = 0  # files removed by this daemon's gcs (the crash tests' hook)
        # per session: what its log said, where the reading stopped, the last seq read
        self._read: dict[str, tuple[Evidence, LogPosition, int]] = {}
        self._kept_refs = 0
        self._events_read = 0  # events read from logs by gcs (how much a cursor saves)

    async def gc(
        self,
        dry_run: bool = False,
        who: Who | None = None,
        trigger: Trigger = "sessionctl",
    ) -> GcReport:
        """Apply the rules to every session; what was (or would be) removed, and the
        bytes freed."""
        rules = self.ctx.config.retention
        plans: list[Plan] = []
        errors: list[str] = []
        read_before = self._events_read
        await self.ctx.table.ensure_all()  # after a start-up: every session's log, open
        async with self._one:
            for gone in self._read.keys() - {s.name for s in self.ctx.table}:
                self._kept_refs -= _size(self._read.pop(gone)[0])
            if rules.rules():
                for s in list(self.ctx.table):
                    if s.journal_or_none is None:  # a broken log: fsck and a person first
                        continue
                    try:
                        p = await self._session(s, dry_run, who, trigger)
                    except (OSError, SessiondError) as exc:
                        errors.append(f"{s.name}: {exc}")
                        log.warning("gc.failed", session=s.name, error=str(exc))
                        continue
                    if p:
                        plans.append(p)
        total = sum(p.bytes for p in plans)
        if not dry_run and plans:
            log.info("gc.done", trigger=trigger, sessions=len(plans), bytes=total)
        return {
            "dry_run": dry_run,
            "rules": rules.rules(),
            "sessions": [p.to_dict() for p in plans],
            "artifacts": sum(len(p.artifacts) for p in plans),
            "snapshots": sum(len(p.snapshots) for p in plans),
            "bytes": total,
            "errors": errors,
            "events_read": self._events_read - read_before,
        }

    async def _session(self, s: Session, dry_run: bool, who: Who | None, trigger: Trigger) -> Plan:
        rules = self.ctx.config.retention
        # only the snapshot rule: nothing to learn from the log
        read = (rules.terminated, rules.unreferenced, rules.keep_artifacts) != (None,) * 3
        pacer = Pacer()
        # Where the last gc stopped reading this log, and what it had learnt: only
        # what was appended since is read (an idle session costs no read at all).
        place = self._read.get(s.name)
        evidence, after, seq = place if place is not None else (Evidence(), START, 0)
        # What is appended while the log is read (without the lock) is caught here,
        # so the lock is held only for what came after, never for a whole log.
        tail: list[Record] = []
        unlisten = self.ctx.table.listen(
            lambda name, record: tail.append(record) if name == s.name else None
        )
        try:
            if read:
                records = self._records(s.name, after)
                try:
                    head = list(itertools.islice(records, 1))  # the position is checked
                except PositionMismatch:  # the log was replaced (import): from the top
                    evidence, after, seq = Evidence(), START, 0
                    records, head = self._records(s.name, after), []
                for record, position in itertools.chain(head, records):
                    after = position
                    self._events_read += 1
                    if record["seq"] > seq:  # a tail record of the last gc is known
                        evidence.add(record)
                        seq = record["seq"]
                    if pacer.due():
                        await pacer.pause()
            async with s.lock:
                for record in tail if read else ():
                    if record["seq"] > seq:
                        evidence.add(record)
                        seq = record["seq"]
                if read:
                    self._keep(s.name, (evidence, after, seq))
                return await self._collect(s, evidence, dry_run, who, trigger)
        finally:
            unlisten()

    def _keep(self, name: str, place: tuple[Evidence, LogPosition, int]) -> None:
        """Keep where this log was read to, within :data:`KEPT_REFS` references in all
        (the daemon's memory stays bounded in log length: a session whose artifacts
        do not fit is read whole at each gc, as before)."""
        old = self._read.pop(name, None)
        if old is not None:
            self._kept_refs -= _size(old[0])
        if self._kept_refs + _size(place[0]) <= KEPT_REFS:
            self._read[name] = place
            self._kept_refs += _size(place[0])

    def _records(self, name: str, after: LogPosition) -> Iterator[tuple[Record, LogPosition]]:
        store = self.ctx.store
        if isinstance(store, FileStore):
            yield from store.read_after(name, after)  # from the byte it stopped at
            return
        for record in store.read(name, since=after.seq + 1):  # the database: by seq
            yield record, LogPosition(record["seq"], record["seq"], record["id"])

    async def _collect(
        self, s: Session, evidence: Evidence, dry_run: bool, who: Who | None, trigger: Trigger
    ) -> Plan:
        """Plan, record and remove, under the session's lock."""
        store = self.ctx.store
        rules = self.ctx.config.retention
        artifacts = store.artifacts(s.name)
        snapshots = store.snapshots(s.name)
        now = datetime.fromisoformat(self.ctx.now().replace("Z", "+00:00"))
        state = s.journal.state
        keep = needed(state, evidence, artifacts)
        # a stat of every file and a read of every context's manifest: off the loop
        p = await asyncio.to_thread(
            plan,
            s.name,
            keep,
            state.state != "terminated",
            evidence,
            artifacts,
            snapshots,
            rules,
            now,
            time.time(),
        )
        if dry_run or not p:
            return p
        # Recorded first: a crash from here on leaves these files recorded and
        # (some of them) present, which fsck accepts and the next gc finishes.
        await self.ctx.table.append(
            s,
            GcCollected(
                artifacts=tuple(
                    CollectedArtifact(artifact=r.ref, size=r.size, rule=r.rule) for r in p.artifacts
                ),
                snapshots=tuple(p.snapshots),
                bytes=p.bytes,
                trigger=trigger,
                uid=who["uid"] if who is not None else None,
                user=who["user"] if who is not None else "",
            ),
        )
        await asyncio.to_thread(remove, artifacts, snapshots, p, self._fault_hook())
        return p

    def _fault_hook(self) -> Any:
        limit = self.ctx.config.retention.fault_kill_after
        if limit is None:
            return None

        def each() -> None:  # TEST ONLY: a real kill -9 part way through a gc
            self._removed += 1
            if self._removed >= limit:
                os.kill(os.getpid(), signal.SIGKILL)

        return each

    # --- the periodic gc ----------------------------------------------------------------

    def start(self) -> None:
        """Run a gc every ``[retention] interval`` (if set); after a reload, on the
        new interval (a gc under way is left to finish when it is unchanged)."""
        interval = self.ctx.config.retention.interval
        if self._task is not None and interval == self._interval:
            return
        self.close()
        self._interval = interval
        if interval is not None:
            self._task = asyncio.ensure_future(self._every(interval))

    async def _every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.gc(trigger="interval")
            except Exception:  # the next one may do better; never the loop's end
                log.exception("gc.failed")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
