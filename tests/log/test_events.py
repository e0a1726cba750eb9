"""The event format: every type round-trips, unknown types and newer versions are
refused clearly, older versions are upcast."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiond.codec import decode_line, encode_line
from sessiond.errors import InvalidEvent, UnknownEventType, UnsupportedVersion
from sessiond.log.event_data import PAYLOADS, ContextCompacted, EventData, LifecycleChanged
from sessiond.log.events import CURRENT_VERSION, ENVELOPES, EVENT_TYPES, decode, encode, upcast
from sessiond.log.replay import HANDLERS
from sessiond.log.store.base import Draft
from sessiond.log.store.lines import RecordBuilder
from tests.strategies import PAYLOAD_STRATEGIES

DESIGN_TYPES = {
    "session.created", "session.forked", "session.merged", "session.migrated",
    "session.imported", "lifecycle.changed", "wake.requested", "gate.evaluated",
    "recovery.resolved", "run.started", "run.finished", "message.received",
    "model.requested", "model.responded", "tool.intent", "policy.decided",
    "approval.requested", "approval.granted", "approval.denied", "tool.started",
    "tool.finished", "observation.projected", "context.compacted",
    "verification.started", "verification.finished", "budget.exhausted",
    "binding.observed", "log.repaired",
    # section 8's `apply`: an operator's new spec, recorded with who applied it
    "spec.applied",
    # section 6's retention: what a gc removed from the session's store
    "gc.collected",
    # section 2's `arriving`: the two phases of a hand-over (migrate --to)
    "migration.started", "migration.aborted", "migration.arriving",
    "migration.finished", "migration.discarded",
}  # fmt: skip


def record_of(payload: EventData, seq: int = 1) -> dict[str, Any]:
    records, _ = RecordBuilder("s1", lambda: 1_764_406_800_123_456_789).build(
        seq - 1, [Draft(payload, causation=None, correlation="c1")]
    )
    return dict(records[0])  # a plain dict: the tests below break it on purpose


def test_the_event_types_are_exactly_those_of_the_design() -> None:
    assert set(EVENT_TYPES) == DESIGN_TYPES
    assert set(ENVELOPES) == DESIGN_TYPES
    assert set(HANDLERS) == DESIGN_TYPES


@pytest.mark.parametrize("payload_type", PAYLOADS, ids=lambda p: p.EVENT_TYPE)
def test_every_type_round_trips_through_a_line(payload_type: type[EventData]) -> None:
    @given(PAYLOAD_STRATEGIES[payload_type])
    def check(payload: EventData) -> None:
        record = record_of(payload)
        back = decode_line(encode_line(record)[:-1])
        assert back == record
        assert back is not None
        event = decode(back)
        assert event.type == payload_type.EVENT_TYPE
        assert event.data == payload
        assert encode(event) == record

    check()


def test_the_envelope_carries_every_field_of_the_contract() -> None:
    record = record_of(LifecycleChanged(from_state="created", to="ready"), seq=7)
    assert set(record) == {
        "v", "session", "seq", "id", "ts", "type", "causation", "correlation", "data"
    }  # fmt: skip
    assert record["seq"] == 7
    assert record["ts"] == "2025-11-29T09:00:00.123456Z"
    assert record["data"]["from"] == "created"  # the on-disk name, not the Python one
    assert len(record["id"]) == 32


def test_an_unknown_type_is_a_clear_error_never_dropped() -> None:
    record = record_of(LifecycleChanged(to="ready"))
    record["type"] = "tool.exploded"
    with pytest.raises(UnknownEventType, match=r"unknown type 'tool.exploded'"):
        decode(record)


def test_a_newer_version_is_refused_with_what_to_do() -> None:
    record = record_of(LifecycleChanged(to="ready"))
    record["v"] = 2
    with pytest.raises(UnsupportedVersion, match="upgrade sessiond"):
        decode(record)


@pytest.mark.parametrize("version", [0, -1, "1", True, None])
def test_a_malformed_version_is_refused(version: object) -> None:
    record = record_of(LifecycleChanged(to="ready"))
    record["v"] = version
    with pytest.raises(InvalidEvent):
        decode(record)


def test_an_older_version_is_upcast_step_by_step() -> None:
    # A pretend history: lifecycle.changed v1 had "state", v2 renamed it "to",
    # v3 added "reason". Reading a v1 record must give the v3 shape.
    def v1_to_v2(r: Mapping[str, Any]) -> Mapping[str, Any]:
        data = dict(r["data"])
        data["to"] = data.pop("state")
        return {**r, "data": data}

    def v2_to_v3(r: Mapping[str, Any]) -> Mapping[str, Any]:
        return {**r, "data": {**r["data"], "reason": "upcast"}}

    current = {**CURRENT_VERSION, "lifecycle.changed": 3}
    upcasters = {("lifecycle.changed", 1): v1_to_v2, ("lifecycle.changed", 2): v2_to_v3}
    old = {"v": 1, "seq": 4, "type": "lifecycle.changed", "data": {"state": "ready"}}
    new = upcast(old, current=current, upcasters=upcasters)
    assert new["v"] == 3
    assert new["data"] == {"to": "ready", "reason": "upcast"}
    assert old["data"] == {"state": "ready"}  # the input is not mutated


def test_a_missing_upcaster_is_reported_as_a_bug() -> None:
    current = {**CURRENT_VERSION, "lifecycle.changed": 2}
    with pytest.raises(UnsupportedVersion, match="no upcaster"):
        upcast({"v": 1, "seq": 1, "type": "lifecycle.changed", "data": {}}, current=current)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ts", "2026-11-29 09:00:00", "RFC 3339"),
        ("ts", "2026-11-29T09:00:00+02:00", "RFC 3339"),
        ("id", "not-an-id", "32 lowercase hex"),
        ("seq", 0, "seq"),
        ("extra", 1, "extra"),
    ],
)
def test_envelope_problems_name_the_field(field: str, value: object, message: str) -> None:
    record = record_of(LifecycleChanged(to="ready"))
    record[field] = value
    with pytest.raises(InvalidEvent, match=message):
        decode(record)


def test_payload_problems_name_the_field() -> None:
    record = record_of(LifecycleChanged(to="ready"))
    record["data"]["to"] = "exploded"
    with pytest.raises(InvalidEvent, match=r"data\.to"):
        decode(record)


def test_artifact_references_must_be_sha256() -> None:
    record = orjson.loads(
        b'{"v":1,"session":"s","seq":1,"id":"0123456789abcdef0123456789abcdef",'
        b'"ts":"2026-01-01T00:00:00Z","type":"run.finished","data":{"run":"r","status":"ok",'
        b'"stdout":{"ref":"sha256:../../etc/passwd","name":"x","size":1}}}'
    )
    with pytest.raises(InvalidEvent, match="sha256"):
        decode(record)


@given(st.integers(1, 100), st.integers(1, 100))
def test_a_compaction_range_runs_forwards(lo: int, hi: int) -> None:
    if lo <= hi:
        assert ContextCompacted(from_seq=lo, to_seq=hi, summary="s").to_seq == hi
    else:
        with pytest.raises(ValueError, match="after to_seq"):
            ContextCompacted(from_seq=lo, to_seq=hi, summary="s")
