"""The fold's types say what the data holds: each handler's payload TypedDict has the
fields of its event's payload model, and what a fold of real logs keeps in the state
has the keys its record TypedDict names (log/records.py, log/event_records.py)."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, NotRequired, is_typeddict

import orjson
import pytest

from sessiond.log.event_data import PAYLOAD_BY_TYPE
from sessiond.log.records import (
    ApprovalRecord,
    CallRecord,
    CurrentRun,
    LastGate,
    LastRun,
    StepRecord,
    SummaryRecord,
    TurnRecord,
    WakeRecord,
)
from sessiond.log.replay import HANDLERS, replay_all
from sessiond.log.state import State
from sessiond.sdkwire import TranscriptItem

GOLDEN = Path(__file__).parent.parent / "golden"


def _payload_type(etype: str) -> Any:
    """The type the fold handler of ``etype`` takes its payload (``d``) as."""
    return typing.get_type_hints(HANDLERS[etype])["d"]


def _keys(td: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(required keys, all keys) of a TypedDict. (Read from its hints: with postponed
    annotations Python 3.11 cannot see ``NotRequired`` in ``__required_keys__``.)"""
    hints = typing.get_type_hints(td, include_extras=True)
    optional = {k for k, h in hints.items() if typing.get_origin(h) is NotRequired}
    every = frozenset(hints)
    return every - optional - td.__optional_keys__, every


def _json_fields(etype: str) -> set[str]:
    model = PAYLOAD_BY_TYPE[etype]
    return {f.alias or name for name, f in model.model_fields.items()}


TYPED = [t for t in HANDLERS if is_typeddict(_payload_type(t))]


def test_every_payload_the_fold_reads_has_its_typeddict() -> None:
    # the two the fold ignores take any object: nothing of theirs is read
    assert set(HANDLERS) - set(TYPED) == {"spec.applied", "gc.collected"}


@pytest.mark.parametrize("etype", TYPED)
def test_a_payload_typeddict_names_the_fields_of_its_model(etype: str) -> None:
    required, every = _keys(_payload_type(etype))
    fields = _json_fields(etype)
    assert required <= fields, f"{etype}: required keys its events lack: {required - fields}"
    if etype.startswith("migration."):  # one TypedDict for the five hand-over events
        assert fields <= every, f"{etype}: fields the TypedDict misses: {fields - every}"
    else:
        assert every == fields, f"{etype}: TypedDict {sorted(every)} != model {sorted(fields)}"


def _conforms(record: Any, td: Any, where: str) -> None:
    required, every = _keys(td)
    assert isinstance(record, dict), where
    assert required <= record.keys(), f"{where}: lacks {required - record.keys()}"
    assert record.keys() <= every, f"{where}: holds what {td.__name__} does not name: " + str(
        record.keys() - every
    )


def _check(state: State) -> None:
    for call, c in state.calls.items():
        _conforms(c, CallRecord, f"calls[{call}]")
    for call, a in state.approvals.items():
        _conforms(a, ApprovalRecord, f"approvals[{call}]")
    for w in state.pending_wakes:
        _conforms(w, WakeRecord, "pending_wakes")
    for t in state.transcript:
        _conforms(t, TranscriptItem, "transcript")
    for s in state.summaries:
        _conforms(s, SummaryRecord, "summaries")
    if state.current_run is not None:
        _conforms(state.current_run, CurrentRun, "current_run")
    if state.last_run is not None:
        _conforms(state.last_run, LastRun, "last_run")
    if state.last_gate is not None:
        _conforms(state.last_gate, LastGate, "last_gate")
    if state.turn is not None:
        _conforms(state.turn, TurnRecord, "turn")
        for slot, step in state.turn["steps"].items():
            _conforms(step, StepRecord, f"turn.steps[{slot}]")


@pytest.mark.parametrize("version", sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()))
def test_what_the_fold_keeps_of_a_golden_log_is_what_its_types_name(version: str) -> None:
    records = [
        orjson.loads(line.rsplit(b" ", 1)[0])
        for line in (GOLDEN / version / "golden.jsonl").read_bytes().splitlines()
    ]
    for n in range(1, len(records) + 1):  # at every point of the log, not only its end
        _check(replay_all("golden", records[:n]))
