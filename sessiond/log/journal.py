"""A session's open log together with its folded state and snapshots.

Opening replays the latest snapshot plus the tail of the log (or the whole log
when there is no usable snapshot). Appending writes the events, folds them into
the state at once (so seq order and fold order are the same), then waits for
durability. A snapshot is written every ``snapshot_every`` events, after the
events it covers are durable.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice

import structlog

from sessiond.errors import LogCorrupt
from sessiond.log.event_data import EventData
from sessiond.log.masking import mask_drafts
from sessiond.log.pace import OffLoop, Pacer, batches, collector_paused, encode_paced
from sessiond.log.replay import apply, replay
from sessiond.log.state import REDUCER_VERSION, State
from sessiond.log.store.base import (
    START,
    Draft,
    Durability,
    EventLog,
    Pending,
    PositionMismatch,
    Record,
    Snapshot,
    SnapshotStore,
    Store,
)
from sessiond.redaction import Redactor

log = structlog.get_logger(__name__)

DEFAULT_SNAPSHOT_EVERY = 1000
FOLD_STEP = 64  # records a slice of an opening's fold takes (read, checked, folded)
FREEZE_AFTER = 10_000  # events folded at an opening: a state worth keeping off the collector


class Journal:
    def __init__(
        self, event_log: EventLog, snapshots: SnapshotStore, state: State, snapshot_every: int
    ) -> None:
        self.log = event_log
        self.snapshots = snapshots
        self.state = state
        self.snapshot_every = snapshot_every
        self._snapshot_seq = state.seq
        self.from_snapshot: int | None = None
        # Called with each record once it is durable (followers of `sessionctl log -f`).
        self.listeners: list[Callable[[Record], None]] = []
        self._unpublished: list[Record] = []  # written with durable=False, not yet synced
        # Types of the records written since the last sync this journal awaited: what
        # the next one commits (the ``log.commit`` debug line counts a path's commits).
        self._unsynced: list[str] = []
        # The session's redactor now (its spec's patterns, its secrets): the free text
        # of every event is masked before it is written (sessiond.log.masking). Set
        # by the table; None, or a redactor of None, masks nothing and costs nothing.
        self.redaction: Callable[[], Redactor | None] | None = None
        # The store the log is in (set by open): what is built from the log on
        # demand (the messages view, compaction) reads it through ``read``.
        self.store: Store | None = None
        # flush_within: the flush armed for what was written without waiting
        self._due: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Future[None] | None = None
        self._closed = False

    @property
    def session(self) -> str:
        return self.log.session

    @classmethod
    async def open(
        cls,
        store: Store,
        name: str,
        *,
        durability: Durability = "fsync",
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        use_snapshots: bool = True,
    ) -> Journal:
        """Open, recover and fold a session's log. Raises LogCorrupt, LogLocked, NoSuchSession."""
        event_log = await store.open_log(name, durability=durability)
        snapshots = store.snapshots(name)
        try:
            state, from_snapshot = await cls._recover(event_log, snapshots, name, use_snapshots)
        except BaseException:
            await event_log.close()
            raise
        journal = cls(event_log, snapshots, state, snapshot_every)
        journal.from_snapshot = from_snapshot
        journal.store = store
        journal._snapshot_seq = from_snapshot or 0
        repair = event_log.repair
        if repair is not None:  # recover() cut a torn tail and recorded it
            log.warning(
                "log.repaired",
                session=name,
                dropped_bytes=repair.dropped_bytes,
                last_good_seq=repair.last_good_seq,
            )
        return journal

    @staticmethod
    async def _recover(
        event_log: EventLog, snapshots: SnapshotStore, name: str, use_snapshots: bool
    ) -> tuple[State, int | None]:
        snap = snapshots.latest(REDUCER_VERSION) if use_snapshots else None
        if snap is not None and snap.session == name:
            try:
                state = State.from_dict(snap.state)
                return await _fold(event_log.recover(snap.position), state), snap.position.seq
            except PositionMismatch as exc:
                log.warning("snapshot.ignored", session=name, seq=snap.position.seq, why=str(exc))
            except (TypeError, ValueError) as exc:
                log.warning(
                    "snapshot.unreadable", session=name, seq=snap.position.seq, why=str(exc)
                )
        return await _fold(event_log.recover(START), State(session=name)), None

    async def append(
        self, data: EventData, *, causation: str | None = None, correlation: str | None = None
    ) -> Record:
        return (await self.append_many([Draft(data, causation, correlation)]))[0]

    async def append_many(self, drafts: Sequence[Draft], *, durable: bool = True) -> list[Record]:
        """Write and fold ``drafts``; with ``durable`` (the default), return once they
        are on disk. ``durable=False`` is for steps nobody is told about and that a
        durable append follows before anything acts on them (an fsync covers every
        line written before it): they need not wait for a disk flush of their own."""
        redaction = self.redaction
        if redaction is not None and (redactor := redaction()) is not None:
            drafts = mask_drafts(drafts, redactor)
        pending = self.log.write_many(drafts)
        for record in pending.records:
            apply(self.state, record)
        if len(self._unsynced) < 64:  # bounded: a debug line's worth
            self._unsynced.extend(r["type"] for r in pending.records[:64])
        if not durable:
            # Told to nobody yet (followers of the log included): published with
            # the durable append that covers them.
            self._unpublished.extend(pending.records)
            return pending.records
        await self._sync(pending)
        self._publish(pending.position.seq)
        for listener in self.listeners:
            for record in pending.records:
                listener(record)
        # Snapshot only when nothing was written after our (now durable) events:
        # then the state is exactly the durable log up to here.
        due = self.state.seq - self._snapshot_seq >= self.snapshot_every
        if due and self.log.position == pending.position:
            await self.snapshot()
        return pending.records

    async def flush(self) -> None:
        """Wait until everything written so far is durable."""
        position = self.log.position
        await self._sync(Pending([], position))
        self._publish(position.seq)

    def flush_within(self, seconds: float) -> None:
        """Make what was written so far durable within ``seconds``, waited for by
        nobody: a durable append meanwhile covers it and costs nothing more (the
        end of a step, which the next step's start usually covers)."""
        if self._due is None and not self._closed:
            self._due = asyncio.get_running_loop().call_later(seconds, self._flush_due)

    def _flush_due(self) -> None:
        self._due = None
        if not self._closed:  # (a flush of what is durable already waits for nothing)
            self._flushing = asyncio.ensure_future(self.flush())  # held while it runs
            self._flushing.add_done_callback(_retrieved)

    async def _sync(self, pending: Pending) -> None:
        """Wait until ``pending`` is durable. Each wait that has something to commit
        is logged (debug): the awaited commits on a path (a wake's, say) are counted
        from these lines, not guessed."""
        types, self._unsynced = self._unsynced, []
        if types:
            # Through bind(): what the proxy's own attribute lookup does, without its
            # failed lookup first (about 1 µs a commit even when debug is filtered).
            log.bind().debug(
                "log.commit", session=self.session, seq=pending.position.seq, types=types
            )
        await self.log.sync(pending)

    def _publish(self, durable_seq: int) -> None:
        """Tell the listeners of the records written without a flush, up to what is
        durable now."""
        if not self._unpublished:
            return
        ready = [r for r in self._unpublished if r["seq"] <= durable_seq]
        self._unpublished = [r for r in self._unpublished if r["seq"] > durable_seq]
        for listener in self.listeners:
            for record in ready:
                listener(record)

    async def take_snapshot(self) -> Snapshot | None:
        """The state as a snapshot, once it is durable; None if nothing is new."""
        position = self.log.position
        if position.seq != self.state.seq or position.seq == self._snapshot_seq:
            return None
        await self._sync(Pending([], position))
        # Serialised in the loop, a slice at a time, only to bytes (decoding them
        # again, three times the encoding's cost, stalled the loop for tens of ms on
        # a long session, and the file needs bytes). The state changes only by
        # folding an event, which moves its seq: one that moved meanwhile is left
        # for the next snapshot.
        encoded = await encode_paced(self.state)
        if self.state.seq != position.seq:
            return None
        self._snapshot_seq = position.seq
        return Snapshot(REDUCER_VERSION, self.session, position, {}, encoded)

    async def snapshot(self) -> None:
        """Write a snapshot of the state now (in a worker thread), once it is durable."""
        snap = await self.take_snapshot()
        if snap is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.snapshots.save, snap)

    def read(self, *, upto: int | None = None) -> Iterator[Record]:
        """The session's records from its first, up to seq ``upto`` (default: the
        state's, not what is written meanwhile)."""
        if self.store is None:
            raise RuntimeError("a journal opened without its store cannot read its log")
        return self.store.read(self.session, upto=self.state.seq if upto is None else upto)

    async def close(self) -> None:
        self._closed = True
        if self._due is not None:
            self._due.cancel()
            self._due = None
        await self.log.close()


def _retrieved(task: asyncio.Future[None]) -> None:
    """A background flush's failure fails the log (its next append says so), never
    a stray "exception was never retrieved"."""
    if not task.cancelled():
        task.exception()


async def _fold(records: Iterable[Record], state: State) -> State:
    """``replay`` a batch at a time: opening a long log (a fork, an import, a
    session with no snapshot) leaves the loop free for others between batches.
    The state lives as long as its session: once folded from many events it is
    put out of the cyclic collector's way (``gc.freeze``), as the daemon does with
    the table it loads at start-up, so that no later collection walks it."""
    if not isinstance(records, OffLoop):  # (a database's: read off the loop, in batches)
        rest = iter(records)
        first = next(rest, None)  # (a file log's recovery reads, checks and cuts its tail)
        if first is None:
            return state  # nothing after the snapshot: most sessions at a start-up
        records = chain((first,), rest)
    before = state.seq
    with collector_paused():
        if isinstance(records, OffLoop):
            async for batch in batches(records):
                replay(batch, state)
        else:
            # A slice of records at a time, taken in C (islice): no per-record
            # list append and clock check in Python, and a slice folds in well
            # under the pacer's half millisecond.
            pacer = Pacer()
            it = iter(records)
            while batch := list(islice(it, FOLD_STEP)):
                replay(batch, state)
                await pacer.tick()
        if state.seq - before >= FREEZE_AFTER:
            # before the collector is back: its first collection would walk it all
            gc.freeze()
    return state


__all__ = ["DEFAULT_SNAPSHOT_EVERY", "Journal", "LogCorrupt"]
