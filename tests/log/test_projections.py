"""Projections of state and events: the messages view and the trace."""

from __future__ import annotations

from sessiond.describe import describe
from sessiond.log.event_data import (
    ArtifactRef,
    ContextCompacted,
    EventData,
    MessageReceived,
    ModelResponded,
    ObservationProjected,
    SessionCreated,
    SessionMerged,
    ToolFinished,
)
from sessiond.log.projections import messages, trace
from sessiond.log.store.base import Draft, Record
from sessiond.log.store.memory import MemoryStore
from tests.helpers import arun

RAW = ArtifactRef(ref="sha256:" + "9" * 64, name="stdout", size=10_000)


def _records(payloads: list[EventData]) -> list[Record]:
    async def go() -> list[Record]:
        log = await MemoryStore().create("s")
        return await log.append_many([Draft(p) for p in payloads])

    return arun(go())


def test_the_messages_view_shows_what_a_model_would_see() -> None:
    records = _records(
        [
            SessionCreated(name="s", goal="keep docs in step"),
            MessageReceived(sender="ann", text="please update the docs"),
            ModelResponded(model="m", request_id="q", text="running the generator"),
            ToolFinished(call="c", tool="gen", status="ok", exit_code=0, output=RAW),
            ObservationProjected(call="c", tool="gen", text="docs/api.md regenerated"),
            SessionMerged(child="side", summary="found two stale links", artifacts=(RAW,)),
        ]
    )
    view = messages(records)
    assert [(m["role"], m["content"]) for m in view] == [
        ("system", "Goal: keep docs in step"),
        ("user", "please update the docs"),
        ("assistant", "running the generator"),
        ("tool", "docs/api.md regenerated"),
        ("user", "[merged from side] found two stale links"),
    ]
    assert view[1]["sender"] == "ann"
    assert view[3]["tool"] == "gen"
    # never raw tool output: the 10 kB stdout is an artifact, not a message
    assert all("sha256:" not in m["content"] for m in view)


def test_compaction_summaries_stand_in_place_of_their_range() -> None:
    records = _records(
        [
            *(MessageReceived(sender="u", text=f"m{i}") for i in range(1, 6)),
            ContextCompacted(from_seq=1, to_seq=3, summary="asked for m1-m3"),
        ]
    )
    view = messages(records)
    assert [m["content"] for m in view] == [
        "Summary of earlier context (events 1-3): asked for m1-m3",
        "m4",
        "m5",
    ]
    assert view[0]["kind"] == "summary"
    assert view[0]["range"] == [1, 3]


def test_the_trace_has_one_readable_line_per_event() -> None:
    records = _records(
        [
            SessionCreated(name="s", goal="g"),
            ToolFinished(call="c1", tool="gen", status="error", exit_code=2, hashes={"a": None}),
        ]
    )
    lines = trace(records)
    assert len(lines) == 2
    assert "session.created" in lines[0]
    assert lines[0].endswith("s: g")
    assert "gen [c1] error exit=2 after: a=absent" in lines[1]


def test_every_event_type_has_a_description() -> None:
    from sessiond.describe import _DESCRIBE
    from sessiond.log.events import EVENT_TYPES

    assert set(_DESCRIBE) == set(EVENT_TYPES)
    assert describe({"type": "lifecycle.changed", "data": {
        "from": "running", "to": "terminated", "outcome": "completed", "reason": "done"
    }}) == "running -> terminated (completed): done"  # fmt: skip
