"""Replay is a pure fold: snapshots change nothing but speed, the clock is never
read, and the state holds what recovery needs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiond.log.event_data import (
    ApprovalGranted,
    ApprovalRequested,
    ArtifactRef,
    BindingObserved,
    ContextCompacted,
    EventData,
    LifecycleChanged,
    MessageReceived,
    ModelRequested,
    ModelResponded,
    ObservationProjected,
    PolicyDecided,
    RecoveryResolved,
    RiskContract,
    RunFinished,
    RunStarted,
    SessionCreated,
    ToolFinished,
    ToolIntent,
    ToolStarted,
    WakeRequested,
)
from sessiond.log.journal import Journal
from sessiond.log.replay import replay_all
from sessiond.log.state import MAILBOX_KEEP, State
from sessiond.log.store.base import Draft, Record
from sessiond.log.store.files import FileStore
from sessiond.log.store.memory import MemoryStore
from tests.helpers import arun, tool_call
from tests.strategies import ANY_PAYLOAD


def as_json(state: State) -> Any:
    return orjson.loads(orjson.dumps(state))


@given(
    batches=st.lists(st.lists(ANY_PAYLOAD, min_size=1, max_size=4), min_size=1, max_size=12),
    every=st.integers(1, 7),
)
def test_snapshot_plus_tail_equals_a_full_replay(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[EventData]], every: int
) -> None:
    store = FileStore(tmp_path_factory.mktemp("snap"))

    async def go() -> tuple[Any, Any, int | None]:
        await (await store.create("s")).close()
        journal = await Journal.open(store, "s", snapshot_every=every, durability="os")
        for batch in batches:
            await journal.append_many([Draft(p) for p in batch])
        live = as_json(journal.state)
        await journal.close()
        reopened = await Journal.open(store, "s", snapshot_every=every)
        from_snapshot = reopened.from_snapshot
        resumed = as_json(reopened.state)
        await reopened.close()
        assert live == resumed
        return live, resumed, from_snapshot

    live, resumed, from_snapshot = arun(go())
    full = as_json(replay_all("s", store.read("s")))
    assert full == live == resumed
    total = sum(len(b) for b in batches)
    if total >= every:
        assert from_snapshot is not None


def test_a_snapshot_that_disagrees_with_the_log_is_ignored(state_dir: Path) -> None:
    store = FileStore(state_dir)

    async def go() -> None:
        await (await store.create("s")).close()
        journal = await Journal.open(store, "s", snapshot_every=3)
        for i in range(3):
            await journal.append_many(tool_call(f"c{i}"))
        await journal.close()

    arun(go())
    snaps = store.snapshots("s")
    assert snaps.seqs()
    # Rewrite the log with other events (other ids): every snapshot now disagrees.
    store.log_path("s").unlink()
    store.log_path("s").touch(mode=0o600)

    async def rewrite() -> State:
        log = await store.open_log("s")
        list(log.recover())
        await log.append_many(tool_call("x") + tool_call("y"))
        await log.close()
        journal = await Journal.open(store, "s")
        state = journal.state
        await journal.close()
        return state

    state = arun(rewrite())
    assert state.seq == 10
    assert state.last_observation is not None
    assert state.last_observation["call"] == "y"  # the log won


def test_replay_never_reads_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore(clock=lambda: 1_800_000_000_000_000_000)
    records = arun(_log_of(store, _sample()))

    def no_clock(*args: object) -> float:
        raise AssertionError("replay read the clock")

    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter"):
        monkeypatch.setattr(time, name, no_clock)
    once = as_json(replay_all("s", records))
    twice = as_json(replay_all("s", records))
    assert once == twice
    assert once["last_ts"] == "2027-01-15T08:00:00.000000Z"


async def _log_of(store: MemoryStore, payloads: list[Draft]) -> list[Record]:
    log = await store.create("s")
    records = await log.append_many(payloads)
    await log.close()
    return records


OUT = ArtifactRef(ref="sha256:" + "1" * 64, name="stdout", size=3)
CTX = ArtifactRef(ref="sha256:" + "2" * 64, name="context.json", size=9)


def _sample() -> list[Draft]:
    payloads: list[EventData] = [
        SessionCreated(name="s", goal="fix the tests", agent="coder", priority=7),
        BindingObserved(hashes={"spec.md": "3" * 64}),
        WakeRequested(trigger="watch", details={"paths": ["src/a.py"]}),
        LifecycleChanged(from_state="sleeping", to="running", reason="watch"),
        RunStarted(run="r1", pid=10, pgid=10, proc_start=99),
        ModelRequested(model="m", request_id="q1", context=CTX),
        ModelResponded(model="m", request_id="q1", tokens_in=100, tokens_out=20, text="edit it"),
        ToolIntent(
            call="c1",
            tool="edit_file",
            args={"path": "src/a.py"},
            risk=RiskContract(idempotency="unsafe", resume="require-user-confirmation"),
            writes=("src/a.py",),
        ),
        PolicyDecided(call="c1", tool="edit_file", decision="ask", rule="ask: edit_file"),
        ApprovalRequested(call="c1", tool="edit_file", args_sha256="4" * 64),
    ]
    return [Draft(p, correlation=getattr(p, "call", None)) for p in payloads]


def test_the_state_tracks_a_tool_call_through_its_stages() -> None:
    store = MemoryStore()
    records = arun(_log_of(store, _sample()))
    s = replay_all("s", records)
    assert (s.name, s.goal, s.agent, s.priority) == ("s", "fix the tests", "coder", 7)
    assert s.state == "running"
    assert s.runs == 1
    assert s.current_run is not None
    assert s.current_run["pid"] == 10
    assert s.pending_wakes == []  # consumed by the run
    assert s.last_wake is not None
    assert (s.model_replies, s.tokens_in, s.tokens_out) == (1, 100, 20)
    assert s.pending_model is None
    assert s.bound == {"spec.md": "3" * 64}
    assert list(s.pending_intents()) == ["c1"]
    assert s.calls["c1"]["stage"] == "approval"
    assert list(s.pending_approvals()) == ["c1"]
    assert not s.at_stable_point()

    more = [
        ApprovalGranted(call="c1", tool="edit_file", by="ann", expires_at="2030-01-01T00:00:00Z"),
        ToolStarted(call="c1", tool="edit_file", hashes={"src/a.py": "5" * 64}, git_head="a" * 40),
    ]
    s = replay_all("s", [*records, *arun(_append(store, more))])
    assert s.calls["c1"]["stage"] == "started"
    assert s.approvals["c1"]["status"] == "granted"
    assert list(s.in_flight()) == ["c1"]
    risk = s.in_flight()["c1"]["risk"]
    assert risk is not None
    assert risk["resume"] == "require-user-confirmation"
    assert s.in_flight()["c1"]["started"]["hashes"] == {"src/a.py": "5" * 64}

    done = [
        ToolFinished(
            call="c1",
            tool="edit_file",
            status="ok",
            exit_code=0,
            hashes={"src/a.py": "6" * 64},
            output=OUT,
        ),
    ]
    s = replay_all("s", list(store.read("s")) + arun(_append(store, done)))
    assert list(s.unobserved()) == ["c1"]
    assert OUT.ref in s.live_artifacts()
    assert s.file_hashes == {"src/a.py": "6" * 64}

    end = [
        ObservationProjected(call="c1", tool="edit_file", text="edited src/a.py"),
        RunFinished(run="r1", status="ok", exit_code=0, duration_ms=2500),
        LifecycleChanged(from_state="running", to="sleeping", reason="done"),
    ]
    s = replay_all("s", list(store.read("s")) + arun(_append(store, end)))
    assert s.calls == {}
    assert s.approvals == {}
    assert s.at_stable_point()
    assert s.current_run is None
    assert s.last_run is not None
    assert s.last_run["status"] == "ok"
    assert s.seconds_used == 2
    assert s.last_observation is not None
    assert s.last_observation["text"] == "edited src/a.py"
    assert OUT.ref not in s.live_artifacts()


async def _append(store: MemoryStore, payloads: Sequence[EventData]) -> list[Record]:
    log = await store.open_log("s")
    list(log.recover())
    records = await log.append_many([Draft(p) for p in payloads])
    await log.close()
    return records


def test_recovery_options_change_what_the_state_expects() -> None:
    store = MemoryStore()
    base = arun(_log_of(store, [*tool_call("c1")[:3], Draft(BindingObserved(hashes={"b": None}))]))
    s = replay_all("s", base)
    assert list(s.in_flight()) == ["c1"]
    more = arun(
        _append(
            store,
            [
                RecoveryResolved(option="discard", call="c1"),
                RecoveryResolved(option="accept", hashes={"b": "7" * 64, "a.txt": "8" * 64}),
            ],
        )
    )
    s = replay_all("s", base + more)
    assert s.in_flight() == {}
    assert s.bound == {"b": "7" * 64}
    assert s.file_hashes["a.txt"] == "8" * 64
    assert s.last_recovery is not None
    assert s.last_recovery["option"] == "accept"


def test_compaction_replaces_a_range_of_the_transcript() -> None:
    store = MemoryStore()
    payloads: list[EventData] = [MessageReceived(sender="u", text=f"m{i}") for i in range(1, 7)]
    records = arun(_log_of(store, [Draft(p) for p in payloads]))
    records += arun(_append(store, [ContextCompacted(from_seq=2, to_seq=4, summary="m2..m4")]))
    s = replay_all("s", records)
    texts = [t["text"] for t in s.transcript]
    assert texts == ["m1", "Summary of earlier context (events 2-4): m2..m4", "m5", "m6"]
    records += arun(_append(store, [ContextCompacted(from_seq=1, to_seq=5, summary="all")]))
    s = replay_all("s", records)
    assert [t["text"] for t in s.transcript] == [
        "Summary of earlier context (events 1-5): all",
        "m6",
    ]
    assert s.compactions == 2
    assert s.mailbox == [1, 2, 3, 4, 5, 6]  # unread seqs: compaction changes context only


def test_the_state_stays_bounded_however_long_the_session() -> None:
    store = MemoryStore()
    drafts = [Draft(RunStarted(run=f"r{i}")) for i in range(3)]  # one day: one bucket
    drafts += [Draft(MessageReceived(sender="u", text=str(i))) for i in range(MAILBOX_KEEP + 50)]
    s = replay_all("s", arun(_log_of(store, drafts)))
    assert len(s.mailbox) == MAILBOX_KEEP
    assert s.mailbox[-1] == 3 + MAILBOX_KEEP + 50
    assert s.messages_received == MAILBOX_KEEP + 50
    assert sum(s.runs_by_day.values()) == 3


def test_a_run_takes_delivery_of_the_mailbox() -> None:
    store = MemoryStore()
    drafts = [Draft(MessageReceived(sender="u", text="one")), Draft(RunStarted(run="r1"))]
    drafts.append(Draft(MessageReceived(sender="u", text="two")))
    s = replay_all("s", arun(_log_of(store, drafts)))
    assert s.mailbox == [3]


def test_a_run_takes_its_wakes_at_running_even_if_its_run_started_never_came() -> None:
    """A run cut off between `running` and its run.started (its program may have run)
    took the wakes recorded before it: none is left pending to run the work again.
    Wakes recorded after it wait for the next turn."""
    payloads: list[EventData] = [
        SessionCreated(name="s"),
        WakeRequested(trigger="manual"),
        LifecycleChanged(from_state="created", to="ready", reason="gate ok"),
        LifecycleChanged(from_state="ready", to="running", reason="manual"),
    ]
    records = arun(_log_of(MemoryStore(), [Draft(p) for p in payloads]))
    cut_off = replay_all("s", records)
    assert cut_off.pending_wakes == []
    assert (cut_off.runs, cut_off.run_number) == (0, 1)
    later = [
        *payloads,
        LifecycleChanged(from_state="running", to="sleeping", reason="daemon restarted"),
        WakeRequested(trigger="message"),
    ]
    records = arun(_log_of(MemoryStore(), [Draft(p) for p in later]))
    assert [w["trigger"] for w in replay_all("s", records).pending_wakes] == ["message"]
