"""Benchmarks of the event log: appends, group commit, replay, snapshot resume."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import orjson

from sessiond.codec import frame
from sessiond.log.event_data import (
    ArtifactRef,
    ContextCompacted,
    EventData,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    SessionCreated,
    ToolFinished,
    ToolIntent,
    ToolStarted,
)
from sessiond.log.journal import Journal
from sessiond.log.replay import apply
from sessiond.log.state import REDUCER_VERSION, State
from sessiond.log.store.base import Draft, Snapshot
from sessiond.log.store.files import FileStore, IOHooks
from sessiond.log.store.kernelfsync import for_loop
from sessiond.log.store.lines import RecordBuilder

OUTPUT = ArtifactRef(ref="sha256:" + "ab" * 32, name="stdout", size=1234, media_type="text/plain")
HASH = "cd" * 32


def tool_call(i: int) -> list[Draft]:
    """The five events of one finished tool call, as a real session writes them."""
    call = f"c{i}"
    payloads: list[EventData] = [
        ToolIntent(
            call=call,
            tool="edit_file",
            args={"path": "docs/api.md", "line": i},
            risk=RiskContract(side_effect="workspace-write", resume="rerun-after-check"),
            writes=("docs/api.md",),
        ),
        PolicyDecided(call=call, tool="edit_file", decision="allow", rule="allow: edit_file"),
        ToolStarted(call=call, tool="edit_file", hashes={"docs/api.md": HASH}, git_head="f" * 40),
        ToolFinished(
            call=call,
            tool="edit_file",
            status="ok",
            exit_code=0,
            hashes={"docs/api.md": HASH},
            output=OUTPUT,
            duration_ms=12,
        ),
        ObservationProjected(call=call, tool="edit_file", text=f"rewrote docs/api.md line {i}"),
    ]
    return [Draft(p, correlation=call) for p in payloads]


async def _fresh_log(store: FileStore, name: str, durability: str = "os") -> Journal:
    log = await store.create(name)
    await log.close()
    return await Journal.open(store, name, durability=durability, snapshot_every=1 << 62)  # type: ignore[arg-type]


async def append_os_eps(folder: Path, n: int) -> float:
    """Single appends (one event, one write each), durability ``os``."""
    store = FileStore(folder)
    journal = await _fresh_log(store, "append-os")
    drafts = [d for i in range(8) for d in tool_call(i)]
    log = journal.log
    start = time.perf_counter()
    for i in range(n):
        d = drafts[i % len(drafts)]
        await log.append(d.data, correlation=d.correlation)
    elapsed = time.perf_counter() - start
    await journal.close()
    return n / elapsed


def fsync_each_eps(folder: Path, seconds: float, max_events: int = 5000) -> float:
    """The baseline: a plain loop that writes one line and fsyncs it, per event.

    It writes the same framed lines the group-commit benchmark appends, so the
    two differ only in how they reach the disk."""
    records, _ = RecordBuilder("fsync-each", time.time_ns).build(0, tool_call(0))
    lines = [frame(orjson.dumps(r)) for r in records]
    fd = os.open(folder / "fsync-each.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    count = 0
    start = time.perf_counter()
    try:
        # at least one event: a window a busy machine spent elsewhere would report 0/s
        while count < max_events and (count == 0 or time.perf_counter() - start < seconds):
            os.write(fd, lines[count % len(lines)])
            os.fsync(fd)
            count += 1
    finally:
        os.close(fd)
    return count / (time.perf_counter() - start)


async def group_commit_eps(folder: Path, writers: int, seconds: float) -> tuple[float, int]:
    """``writers`` coroutines appending to one log in mode fsync; events/s and fsyncs.

    The fsyncs go the daemon's way: on the loop's io_uring where the kernel grants
    one (counted by the ring), else in threads (counted by an fsync hook, which is
    also what makes a log use threads: log/store/kernelfsync.py)."""
    fsyncs = 0

    def counting_fsync(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        os.fsync(fd)

    ring = for_loop(asyncio.get_running_loop())
    store = FileStore(folder) if ring else FileStore(folder, hooks=IOHooks(fsync=counting_fsync))
    journal = await _fresh_log(store, "group-commit", durability="fsync")
    log = journal.log
    drafts = tool_call(0)
    count = 0
    deadline = time.perf_counter() + seconds
    fsyncs = 0
    completed = ring.completed if ring else 0

    async def writer() -> None:
        nonlocal count
        i = 0
        while i == 0 or time.perf_counter() < deadline:  # at least one each, as above
            d = drafts[i % len(drafts)]
            await log.append(d.data, correlation=d.correlation)
            count += 1
            i += 1

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - start
    await journal.close()
    return count / elapsed, (ring.completed - completed if ring else fsyncs)


async def write_synthetic_log(
    store: FileStore, name: str, events: int, *, snapshot_before_end: int | None = None
) -> None:
    """A session of ``events`` events: tool calls, compacted every 1,000 events like a
    long-running agent's context. With ``snapshot_before_end``, a snapshot is saved
    that many events before the end (the tail a resume must replay)."""
    journal = await _fresh_log(store, name)
    log = journal.log
    state = State(session=name)
    snap_at = -1 if snapshot_before_end is None else events - snapshot_before_end
    pending: list[Draft] = [Draft(SessionCreated(name=name, goal="benchmark session"))]
    i = 0
    compacted_to = 0
    while log.position.seq < events:
        while len(pending) < 500:
            pending.extend(tool_call(i))
            i += 1
        seq = log.position.seq
        # A batch ends exactly at the snapshot's seq, so log.position is right there.
        stop = snap_at if seq < snap_at else events
        batch, pending = pending[: stop - seq], pending[stop - seq :]
        for record in log.write_many(batch).records:
            apply(state, record)
        if log.position.seq == snap_at:
            snapshot = orjson.loads(orjson.dumps(state))
            store.snapshots(name).save(Snapshot(REDUCER_VERSION, name, log.position, snapshot))
        if log.position.seq - compacted_to >= 1000 + 1:
            upto = log.position.seq
            pending.insert(
                0,
                Draft(
                    ContextCompacted(from_seq=compacted_to + 1, to_seq=upto, summary=f"to {upto}")
                ),
            )
            compacted_to = upto
    await journal.close()


def floor_eps(path: Path) -> float:
    """The floor replay is measured against: a plain loop that reads the file,
    checks each line's checksum and parses it with orjson (no fold, no seq check)."""
    start = time.perf_counter()
    count = 0
    with open(path, "rb") as f:
        for line in f.read().split(b"\n")[:-1]:
            body = line[:-9]
            if zlib.crc32(body) != int(line[-8:], 16):
                raise ValueError("bad line")
            orjson.loads(body)
            count += 1
    return count / (time.perf_counter() - start)


async def replay_eps(folder: Path, events: int, repeats: int) -> tuple[float, float]:
    """Full replay (open, verify every line, fold) of an ``events``-event log, and
    the raw read-and-parse floor of the same file, alternated in one run."""
    store = FileStore(folder)
    await write_synthetic_log(store, "replay", events)
    rates, floors = [], []
    for _ in range(repeats):
        floors.append(floor_eps(store.log_path("replay")))
        start = time.perf_counter()
        journal = await Journal.open(store, "replay", durability="os", use_snapshots=False)
        elapsed = time.perf_counter() - start
        assert journal.state.seq == events
        await journal.close()
        rates.append(events / elapsed)
    return statistics.median(rates), statistics.median(floors)


async def snapshot_resume_ms(folder: Path, events: int, tail: int, repeats: int) -> float:
    """Open a session of ``events`` events from its latest snapshot plus ``tail`` events."""
    store = FileStore(folder)
    await write_synthetic_log(store, "resume", events, snapshot_before_end=tail)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        journal = await Journal.open(store, "resume", durability="os")
        elapsed = time.perf_counter() - start
        assert journal.from_snapshot == events - tail, journal.from_snapshot
        assert journal.state.seq == events
        await journal.close()
        times.append(elapsed * 1000)
    return statistics.median(times)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
