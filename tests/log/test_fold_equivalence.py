"""``replay`` folds the hot kinds (a tool call's five events) in its own loop, not
through their handlers: the state it leaves must be exactly the one the handlers
leave, record by record (``apply``), whatever the events and wherever a batch
ends. Compared as the snapshot's bytes, so key order counts too."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiond.log.event_data import (
    ApprovalGranted,
    ApprovalRequested,
    ArtifactRef,
    EventData,
    LifecycleChanged,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    ToolFinished,
    ToolIntent,
    ToolStarted,
)
from sessiond.log.replay import apply, replay
from sessiond.log.state import State
from sessiond.log.store.base import Draft, Record
from sessiond.log.store.memory import MemoryStore
from tests.helpers import arun
from tests.strategies import ANY_PAYLOAD

GOLDEN = Path(__file__).parent.parent / "golden"
CALLS = st.sampled_from(["c1", "c2", "c3"])  # few ids: calls overlap and repeat
REF = ArtifactRef(ref="sha256:" + "b" * 64, name="stdout", size=3)


@st.composite
def tool_events(draw: st.DrawFn) -> list[EventData]:
    """A call's five events (the common case), or some of them out of order, with
    approvals, denials, artifacts and hashes or none."""
    call, tool = draw(CALLS), draw(st.sampled_from(["edit_file", "shell"]))
    hashes = draw(st.sampled_from([{}, {"a.txt": "a" * 64}, {"b.txt": None}]))
    art = draw(st.sampled_from([None, REF]))
    events: list[EventData] = [
        ToolIntent(call=call, tool=tool, args={"n": 1}, risk=RiskContract(), writes=("a.txt",)),
        PolicyDecided(
            call=call, tool=tool, decision=draw(st.sampled_from(["allow", "deny", "ask"])), rule="r"
        ),
        ToolStarted(call=call, tool=tool, hashes=hashes),
        ToolFinished(call=call, tool=tool, status="ok", hashes=hashes, output=art, diff=art),
        ObservationProjected(call=call, tool=tool, text=f"did {call}"),
    ]
    extra: list[EventData] = [
        ApprovalRequested(call=call, tool=tool, args_sha256=None),
        ApprovalGranted(call=call, tool=tool, args_sha256=None, by="me"),
        LifecycleChanged(to="running", reason="r"),
    ]
    if draw(st.booleans()):
        return events
    return draw(st.lists(st.sampled_from(events + extra), min_size=1, max_size=6))


EVENTS = st.lists(
    st.one_of(tool_events(), tool_events(), st.lists(ANY_PAYLOAD, min_size=1, max_size=2)),
    min_size=1,
    max_size=12,
).map(lambda groups: [e for g in groups for e in g])


def records_of(events: list[EventData]) -> list[Record]:
    async def write() -> list[Record]:
        log = await MemoryStore().create("s")
        return log.write_many([Draft(e) for e in events]).records

    return arun(write())


def one_by_one(records: list[Record]) -> bytes:
    state = State(session="s")
    for record in records:
        apply(state, record)
    return orjson.dumps(state)


def in_batches(records: list[Record], cuts: list[int]) -> bytes:
    state = State(session="s")
    start = 0
    for cut in [*sorted(cuts), len(records)]:
        replay(records[start:cut], state)
        start = max(start, cut)
    return orjson.dumps(state)


@settings(max_examples=300, deadline=None)
@given(events=EVENTS, cuts=st.lists(st.integers(0, 60), max_size=4))
def test_replay_leaves_the_state_the_handlers_leave(
    events: list[EventData], cuts: list[int]
) -> None:
    records = records_of(events)
    assert in_batches(records, cuts) == one_by_one(records)


def test_a_busy_session_folds_to_the_same_state() -> None:
    events: list[EventData] = []
    for i in range(200):
        call = f"c{i % 7}"
        events += [d.data for d in _call(call, i)]
        if i % 50 == 0:
            events.append(LifecycleChanged(to="running", reason="r"))
    records = records_of(events)
    expected = one_by_one(records)
    assert in_batches(records, [64 * k for k in range(1, 20)]) == expected
    state = orjson.loads(expected)
    assert state["tool_calls"] == 200
    assert state["calls"] == {}


def _call(call: str, i: int) -> list[Draft]:
    h = {"a.txt": f"{i:064x}"}
    return [
        Draft(ToolIntent(call=call, tool="t", args={"i": i}, risk=RiskContract(), writes=())),
        Draft(PolicyDecided(call=call, tool="t", decision="allow", rule="r")),
        Draft(ToolStarted(call=call, tool="t", hashes=h)),
        Draft(ToolFinished(call=call, tool="t", status="ok", hashes=h, output=REF, diff=None)),
        Draft(ObservationProjected(call=call, tool="t", text=str(i))),
    ]


def test_the_golden_logs_fold_to_the_same_state() -> None:
    folders = sorted(p for p in GOLDEN.iterdir() if (p / "golden.jsonl").exists())
    assert folders
    for folder in folders:
        records = [
            orjson.loads(line[:-9]) for line in (folder / "golden.jsonl").read_bytes().splitlines()
        ]
        assert in_batches(records, [3, 10]) == one_by_one(records), folder.name
