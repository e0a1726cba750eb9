"""Memory bounded in log length: the state keeps what continuing needs, the messages
view is built from the log a page at a time, and equals the view the fold used to
keep whole."""

from __future__ import annotations

import random
from typing import Any

import orjson

from sessiond.bench.daemon import session_events
from sessiond.log.event_data import (
    ArtifactRef,
    ContextCompacted,
    EventData,
    MessageReceived,
    ModelResponded,
    ObservationProjected,
    SessionCreated,
    SessionMerged,
    VerificationFinished,
)
from sessiond.log.projections import messages, messages_page, transcript_item, view_items
from sessiond.log.replay import replay_all
from sessiond.log.state import TRANSCRIPT_KEEP
from sessiond.log.store.base import Draft, Record
from sessiond.log.store.memory import MemoryStore
from sessiond.sdkwire import Message
from tests.helpers import arun

REF = ArtifactRef(ref="sha256:" + "7" * 64, name="notes", size=10)


def _records(drafts: list[Draft], name: str = "s") -> list[Record]:
    async def go() -> list[Record]:
        log = await MemoryStore().create(name)
        out: list[Record] = []
        for start in range(0, len(drafts), 500):
            out += await log.append_many(drafts[start : start + 500])
        return out

    return arun(go())


def _state_bytes(events: int) -> int:
    records = _records(session_events("s", "keep docs in step", "a", events))
    return len(orjson.dumps(replay_all("s", records)))


def test_the_state_does_not_grow_with_the_log() -> None:
    """Ten times the log, the same state: its snapshot was 4.2 MB for 15,000 items.
    (Runs of 21 events after 2 of creation: both logs end 9 messages after a run.)"""
    short, long = _state_bytes(2 + 21 * 47 + 9), _state_bytes(2 + 21 * 470 + 9)
    assert long <= short * 1.1, (short, long)
    assert long < 20_000


def old_view(records: list[Record]) -> list[dict[str, Any]]:
    """The view as the fold kept it whole before 0.x (the reference): each item in
    seq order, a compaction replacing the items of its range by its summary."""
    items: list[dict[str, Any]] = []
    for r in records:
        if r["type"] == "context.compacted":
            d = r["data"]
            lo, hi = d["from_seq"], d["to_seq"]
            text = f"Summary of earlier context (events {lo}-{hi}): {d['summary']}"
            summary = {"seq": lo, "text": text}
            items = (
                [t for t in items if t["seq"] < lo]
                + [summary]
                + [t for t in items if t["seq"] > hi]
            )
        elif (item := transcript_item(r)) is not None:
            items.append({"seq": item["seq"], "text": item["text"]})
    return items


def _mixed(n: int, seed: int) -> list[Record]:
    """A log of view items of every kind, with compactions over ranges that overlap
    earlier ones in every way (inside, around, reaching past an earlier summary)."""
    rng = random.Random(seed)
    store = MemoryStore()

    async def go() -> list[Record]:
        log = await store.create("s")
        out = await log.append_many([Draft(SessionCreated(name="s", goal="g"))])
        for i in range(n):
            roll = rng.random()
            payload: EventData
            if roll < 0.12 and len(out) > 3:
                lo = rng.randint(1, len(out) - 1)
                hi = rng.randint(lo, len(out))
                payload = ContextCompacted(from_seq=lo, to_seq=hi, summary=f"c{i}")
            elif roll < 0.4:
                payload = MessageReceived(sender="u", text=f"m{i}")
            elif roll < 0.55:
                payload = ModelResponded(model="m", request_id=f"q{i}", text=f"a{i}" * (i % 2))
            elif roll < 0.8:
                payload = ObservationProjected(call=f"c{i}", tool="t", text=f"o{i}")
            elif roll < 0.9:
                payload = SessionMerged(child=f"k{i}", summary=f"s{i}", artifacts=(REF,))
            else:
                payload = VerificationFinished(check=f"v{i}", ok=i % 3 == 0)
            out += await log.append_many([Draft(payload)])
        return out

    return arun(go())


def test_the_view_built_from_the_log_is_the_view_the_fold_kept() -> None:
    for seed in range(20):
        records = _mixed(60, seed)
        state = replay_all("s", records)
        expected = old_view(records)
        got = [{"seq": t["seq"], "text": t["text"]} for t in view_items(records, state.summaries)]
        assert got == expected, seed
        # the state's transcript is the newest items of that view, and no more (fewer
        # after a compaction took some: the older ones are in the log only)
        tail = [{"seq": t["seq"], "text": t["text"]} for t in state.transcript]
        assert 0 < len(tail) <= TRANSCRIPT_KEEP, seed
        assert tail == expected[-len(tail) :], seed


def test_pages_of_the_view_make_the_whole_view() -> None:
    for seed in range(6):
        records = _mixed(80, seed)
        state = replay_all("s", records)
        whole = messages(records)
        for limit in (1, 3, 7, 1000):
            pages: list[Message] = []
            cursor: int | None = None
            count = 0
            while True:
                page, cursor = arun(messages_page(records, state, cursor=cursor, limit=limit))
                assert len(page) <= limit
                pages += page
                count += 1
                if cursor is None:
                    break
            assert pages == whole, (seed, limit)
            assert count >= len(whole) // limit


def test_a_merge_keeps_its_artifacts_live_however_much_comes_after() -> None:
    drafts = [Draft(SessionMerged(child="side", summary="found it", artifacts=(REF,)))]
    drafts += [Draft(MessageReceived(sender="u", text=f"m{i}")) for i in range(50)]
    records = _records(drafts)
    state = replay_all("s", records)
    assert REF.ref in state.live_artifacts()  # gone from the transcript's tail, still live
    more = _records([*drafts, Draft(ContextCompacted(from_seq=1, to_seq=10, summary="x"))])
    assert REF.ref not in replay_all("s", more).live_artifacts()  # compacted away
