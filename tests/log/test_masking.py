"""sessiond.log.masking: only the free text of an event is masked, never its links."""

from __future__ import annotations

from sessiond.log.event_data import (
    PAYLOADS,
    ArtifactRef,
    ContextCompacted,
    GateCheck,
    GateEvaluated,
    MessageReceived,
    ModelResponded,
    ObservationProjected,
    RunStarted,
    ToolFinished,
    ToolIntent,
    WakeRequested,
    dump_data,
)
from sessiond.log.masking import FREE_TEXT, mask, mask_drafts
from sessiond.log.store.base import Draft
from sessiond.redaction import MASK, Redactor

KEY = "sk-" + "b" * 30
R = Redactor([r"sk-[A-Za-z0-9]{20,}"])
REF = "sha256:" + "a" * 64


def test_every_event_type_is_classified() -> None:
    assert set(FREE_TEXT) == {p.EVENT_TYPE for p in PAYLOADS}
    for payload in PAYLOADS:
        for name in FREE_TEXT[payload.EVENT_TYPE]:
            assert name in payload.model_fields, (payload.EVENT_TYPE, name)


def test_free_text_is_masked() -> None:
    cases = [
        (MessageReceived(sender="op", text=f"use {KEY}"), "text"),
        (ModelResponded(model="m", request_id="q", text=KEY), "text"),
        (ObservationProjected(call="c", tool="t", text=f"saw {KEY}"), "text"),
        (ContextCompacted(from_seq=1, to_seq=2, summary=KEY), "summary"),
    ]
    for data, name in cases:
        masked = mask(data, R)
        assert KEY not in str(dump_data(masked)), data.EVENT_TYPE
        assert MASK in getattr(masked, name)


def test_nested_free_text_and_links_kept() -> None:
    intent = mask(ToolIntent(call=KEY, tool="http", args={"h": [f"Bearer {KEY}"], "n": 2}), R)
    assert intent.args == {"h": [f"Bearer {MASK}"], "n": 2}
    assert intent.call == KEY  # an id is never touched, even when it matches
    wake = mask(WakeRequested(trigger="message", details={"text": KEY, "paths": [KEY]}), R)
    assert wake.details == {"text": MASK, "paths": [MASK]}
    started = mask(
        RunStarted(run="r1", wakes=({"trigger": "message", "seq": 3, "details": {"t": KEY}},)),
        R,
    )
    assert started.wakes == ({"trigger": "message", "seq": 3, "details": {"t": MASK}},)
    gate = mask(GateEvaluated(ok=False, checks=(GateCheck(name="n", ok=False, detail=KEY),)), R)
    assert gate.checks[0].detail == MASK
    assert gate.checks[0].name == "n"


def test_refs_and_hashes_never_masked() -> None:
    r = Redactor([r"[0-9a-f]{64}", "a{10}"])
    out = ArtifactRef(ref=REF, name="stdout", size=1)
    finished = ToolFinished(call="c", tool="t", status="ok", output=out, hashes={"f": "a" * 64})
    assert mask(finished, r) is finished


def test_unchanged_events_are_the_same_objects() -> None:
    draft = Draft(MessageReceived(sender="op", text="hello"), None, "c")
    assert mask_drafts([draft], R)[0] is draft
    masked = mask_drafts([Draft(MessageReceived(sender="op", text=KEY), "x", "y")], R)[0]
    assert masked.causation == "x"
    assert masked.correlation == "y"
    assert masked.data.text == MASK  # type: ignore[attr-defined]
