"""sessiond.log.masking: everything an event holds is masked but its links; names
(step keys, tools, keys of arguments) are masked as names, distinct and stable."""

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
from sessiond.log.masking import KEPT, MASKED, mask, mask_drafts
from sessiond.log.store.base import Draft
from sessiond.redaction import IDENT, MASK, Redactor

KEY = "sk-" + "b" * 30
R = Redactor([r"sk-[A-Za-z0-9]{20,}"])
REF = "sha256:" + "a" * 64


def test_every_event_type_masks_all_but_its_links() -> None:
    """A field is masked unless it is named a link or typed as a fixed set of values:
    a field added later is masked until someone says it is a link."""
    assert set(MASKED) == {p.EVENT_TYPE for p in PAYLOADS}
    for payload in PAYLOADS:
        masked = {name for name, _ in MASKED[payload.EVENT_TYPE]}
        assert masked <= set(payload.model_fields), payload.EVENT_TYPE
        assert not masked & KEPT, payload.EVENT_TYPE
    assert ("args", "text") in MASKED["tool.intent"]
    assert ("key", "name") in MASKED["tool.intent"]
    assert ("tool", "name") in MASKED["tool.intent"]
    assert ("key", "name") in MASKED["model.requested"]
    assert {"goal", "description", "labels"} <= {n for n, _ in MASKED["session.created"]}
    assert "spec" not in {n for n, _ in MASKED["session.created"]}  # as written
    assert "result" not in {n for n, _ in MASKED["tool.finished"]}  # refused, never masked


def test_keys_of_args_and_step_keys_are_masked_as_distinct_names() -> None:
    other = "sk-" + "c" * 30
    intent = ToolIntent(
        call="r1.1",
        tool=f"pay_{KEY}",
        args={KEY: 1, other: 2, "plain": f"x {KEY}"},
        key=f"order-{KEY}",
        ordinal=1,
        turn=1,
    )
    masked = mask(intent, R)
    dumped = str(dump_data(masked))
    assert KEY not in dumped
    assert other not in dumped
    assert len(masked.args) == 3  # two secret keys stay two keys
    assert masked.args["plain"] == f"x {MASK}"
    assert all(IDENT.fullmatch(k) for k in masked.args if k != "plain")
    assert masked.key is not None
    assert masked.key.startswith("order-redacted.")
    assert masked.tool.startswith("pay_redacted.")
    # the same secret, the same mask; the mask of a mask is itself
    assert mask(intent, R) == masked
    assert R.ident(masked.key) == masked.key
    assert R.ident(f"order-{other}") != masked.key


def test_a_field_of_any_event_holding_a_secret_is_masked() -> None:
    data = [
        GateEvaluated(ok=False, checks=(GateCheck(name=KEY, ok=False, detail="d"),)),
        ToolFinished(
            call="c",
            tool="t",
            status="ok",
            output=ArtifactRef(ref=REF, name=f"{KEY}.out", size=1),
            hashes={f"notes/{KEY}.txt": None},
        ),
        MessageReceived(sender=KEY, text="hi"),
    ]
    for item in data:
        masked = mask(item, R)
        assert KEY not in str(dump_data(masked)), item.EVENT_TYPE


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
