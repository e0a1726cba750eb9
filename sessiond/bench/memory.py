"""Memory bounded in log length: the daemon's RSS with long logs beside short ones.

* ``mem_10000x1000_mb`` / ``mem_10000x100_mb``: the daemon with 10,000 sessions of
  1,000 events each, and with 10,000 of 100, measured in the same run; the target
  is their ratio (``rss_long_short_ratio`` ≤ 1.1): what a session keeps in memory
  must not grow with its log.
* ``mem_1x1000000_mb`` beside ``mem_empty_mb``: one session of 1,000,000 events
  against a daemon with none (target: ``rss_1m_session_over_empty_mb`` ≤ 50).

Writing ten million events through the socket would take hours, so the state
dirs are written directly (setup only, as :func:`sessiond.bench.daemon.write_sessions`
does): one session's lines are built with the store's own record builder
(:mod:`sessiond.log.store.lines`) and framed with their checksums, then copied
under each session's name, with the snapshot a clean stop would leave (the
template folded once by the daemon's own :class:`~sessiond.log.journal.Journal`).
The real daemon is then started on them and its ``VmRSS`` read from ``/proc`` once
it has answered a ``ps``. The one long session is also measured after a cold start
(no snapshot: its million events folded as the daemon opens it; ``*_cold_mb``).
``*_snapshots_mb`` is what the snapshots hold on disk: the state itself, measured
without the allocator's noise.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path

import orjson

from sessiond.bench import run_async
from sessiond.bench.daemon import BenchDaemon, rpc_latencies_ms, run_cycles, session_events
from sessiond.codec import frame, unframe
from sessiond.log.event_data import (
    MessageReceived,
)
from sessiond.log.journal import Journal
from sessiond.log.store.base import Draft, Snapshot
from sessiond.log.store.files import FileStore
from sessiond.log.store.filesnapshots import FileSnapshots
from sessiond.log.store.lines import RecordBuilder
from sessiond.table.spec import parse_spec, spec_to_toml

TEMPLATE = "s00000"  # the name the template session is built under (same length as the others)


def write_state(
    state_dir: Path, count: int, events: int, first: int = 0, *, snapshots: bool = False
) -> None:
    """``count`` sessions of ``events`` events each, named s00000, s00001, ... (from
    ``first`` on): one session's lines, built once, copied under each name with
    fresh checksums; with ``snapshots``, each with the snapshot of its state a clean
    stop would have left (folded once, by the store's own journal)."""
    sessions = state_dir / "sessions"
    sessions.mkdir(parents=True, mode=0o700, exist_ok=True)
    if count == 0:
        return
    text = f'name = "{TEMPLATE}"\ngoal = "memory benchmark"\nagent = "a"\n'
    spec = parse_spec(text, base=sessions)
    spec_text = spec_to_toml(spec)
    bodies = list(_bodies(spec.goal, spec.agent, events))  # ~300 MB for a million
    old = f'"{TEMPLATE}"'.encode()
    snapshot = _snapshot(sessions, spec_text, bodies) if snapshots else None
    for i in range(first, first + count):
        name = f"s{i:05d}"
        folder = sessions / name
        folder.mkdir(mode=0o700, exist_ok=True)
        (folder / "artifacts").mkdir(mode=0o700, exist_ok=True)
        (folder / "snapshots").mkdir(mode=0o700, exist_ok=True)
        (folder / "spec.toml").write_text(spec_text.replace(TEMPLATE, name))
        new = f'"{name}"'.encode()
        _write_log(folder, bodies, old, new)
        if snapshot is not None:
            seq, header, state = snapshot
            (folder / "snapshots" / f"state-{seq}.json").write_bytes(
                frame(header.replace(old, new)) + frame(state.replace(old, new))
            )
    os.sync()  # on disk, as a daemon's own appends would be


def _write_log(folder: Path, bodies: list[bytes], old: bytes, new: bytes) -> None:
    with open(folder / "events.jsonl", "wb") as f:
        step = 10_000  # lines a write: a million-event log is not built in one piece
        for start in range(0, len(bodies), step):
            part = bodies[start : start + step]
            f.write(b"".join(frame(b.replace(old, new)) for b in part))


def _snapshot(sessions: Path, spec_text: str, bodies: list[bytes]) -> tuple[int, bytes, bytes]:
    """The template session's snapshot (its seq, header and state, unframed), from
    its log opened and folded in a scratch folder by the journal the daemon uses."""
    scratch = sessions.parent / ".template"
    folder = scratch / "sessions" / TEMPLATE
    folder.mkdir(parents=True, mode=0o700)
    (folder / "artifacts").mkdir(mode=0o700)
    (folder / "snapshots").mkdir(mode=0o700)
    (folder / "spec.toml").write_text(spec_text)
    _write_log(folder, bodies, b"", b"")

    async def fold() -> Snapshot:
        journal = await Journal.open(FileStore(scratch), TEMPLATE, durability="os")
        try:
            snap = await journal.take_snapshot()
        finally:
            await journal.close()
        assert snap is not None
        return snap

    snap = run_async(fold)
    shutil.rmtree(scratch)
    encoded = FileSnapshots.encode(snap).split(b"\n")
    header, state = (unframe(line) for line in encoded[:2])
    assert header is not None
    assert state is not None
    return snap.position.seq, header, state


def _bodies(goal: str, agent: str, events: int) -> Iterator[bytes]:
    """The template session's events as JSON, built a run at a time (a million
    events' drafts at once would take gigabytes): what ``session_events`` writes,
    its creation, runs woken by messages with their tool calls, then sleep."""
    builder = RecordBuilder(TEMPLATE, time.time_ns)
    head = session_events(TEMPLATE, goal, agent, 2)
    seq = 0
    for drafts in chain([head], run_cycles()):
        if seq + len(drafts) > events:
            break
        for record in builder.build(seq, drafts)[0]:
            yield orjson.dumps(record)
        seq += len(drafts)
    more = [Draft(MessageReceived(sender="bench", text="later"))] * (events - seq)
    for record in builder.build(seq, more)[0] if more else ():
        yield orjson.dumps(record)


def _rss_once_serving(d: BenchDaemon) -> float:
    """VmRSS once the daemon has answered a ``ps`` (everything loaded and listed)."""
    rpc_latencies_ms(d.socket, "ps", 1)
    return d.rss_mb()


def _snapshot_mb(state_dir: Path) -> float:
    total = 0
    for path in (state_dir / "sessions").glob("*/snapshots/*"):
        total += path.stat().st_size
    return total / (1 << 20)


def daemon_rss(
    root: Path, count: int, events: int, *, cold: bool, source: Path | None = None
) -> dict[str, float]:
    """The RSS (MB) of a daemon over ``count`` sessions of ``events`` events once it
    serves, started on the snapshots a clean stop leaves; with ``cold``, also after a
    first start with none (every log folded from its first event). And the size of
    the snapshots: the state itself, without the allocator's noise. ``source``: the
    daemon of another source tree (a baseline; it folds the logs if it cannot use
    the snapshots)."""
    root.mkdir()
    write_state(root / "state", count, events, snapshots=not cold)
    d = BenchDaemon(root, source)
    figures: dict[str, float] = {}
    try:
        if cold:
            figures["cold_start_s"] = round(d.start(), 1)
            figures["cold_mb"] = round(_rss_once_serving(d), 1)
            d.stop()  # a clean stop snapshots every session
        figures["start_s"] = round(d.start(), 1)
        figures["mb"] = round(_rss_once_serving(d), 1)
    finally:
        d.stop()
    figures["snapshots_mb"] = round(_snapshot_mb(root / "state"), 3)
    shutil.rmtree(root)
    return figures


def measure(work: Path, quick: bool, say: Callable[[str], None]) -> dict[str, float]:
    """The figures; ``quick`` uses fewer sessions and a shorter long session (the
    targets are judged on the full sizes only)."""
    many = 200 if quick else 10_000
    long_log = 100_000 if quick else 1_000_000
    results: dict[str, float] = {}
    for events in (1000, 100):
        say(f"measuring the daemon's RSS with {many} sessions of {events} events ...")
        figures = daemon_rss(work / f"mem{events}", many, events, cold=False)
        for key, value in figures.items():
            results[f"mem_{many}x{events}_{key}"] = value
    long_rss = results[f"mem_{many}x1000_mb"]
    short_rss = results[f"mem_{many}x100_mb"]
    say(f"measuring the daemon's RSS with one session of {long_log} events, and with none ...")
    empty = daemon_rss(work / "mem_empty", 0, 0, cold=True)
    one = daemon_rss(work / "mem_one", 1, long_log, cold=True)
    for key, value in empty.items():
        results[f"mem_empty_{key}"] = value
    for key, value in one.items():
        results[f"mem_1x{long_log}_{key}"] = value
    ratio = round(long_rss / short_rss, 3)
    over = round(one["mb"] - empty["mb"], 1)
    over_cold = round(one["cold_mb"] - empty["cold_mb"], 1)
    if quick:
        results["rss_long_short_ratio_quick"] = ratio
        results["rss_long_session_over_empty_quick_mb"] = over
    else:
        results["rss_long_short_ratio"] = ratio
        results["rss_1m_session_over_empty_mb"] = over
        results["rss_1m_session_over_empty_cold_mb"] = over_cold
    return results
