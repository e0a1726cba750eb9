"""Which fields of each event are free text, and masking them (DESIGN.md section 8,
"Secrets and redaction").

Only free text is masked: what people, programs and models wrote (a message, a
tool call's arguments, an observation, a model's text, a summary, a reason, a
wake's details). References, hashes, ids, seqs, names of tools and states are
never touched, so a masked event keeps its schema and every link to others.

Every event type is listed (tests/log/test_masking.py checks it), so a new type
is classified when it is added. ``session.created`` is not masked: it stores the
spec as written, which names secrets by reference and holds the patterns
themselves; a spec must hold no secret (docs/spec.md says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sessiond.log.event_data import EventData
from sessiond.log.store.base import Draft
from sessiond.redaction import Redactor

E = TypeVar("E", bound=EventData)

# event type -> its free-text fields (a str, or JSON whose strings are all free text)
FREE_TEXT: dict[str, tuple[str, ...]] = {
    "session.created": (),
    "session.forked": (),
    "session.merged": ("summary",),
    "session.migrated": (),
    "session.imported": (),
    "lifecycle.changed": ("reason",),
    "wake.requested": ("details",),
    "gate.evaluated": ("checks",),  # each check's detail
    "recovery.resolved": (),
    "run.started": ("wakes",),  # each wake's details
    "run.finished": ("error",),
    "message.received": ("text",),
    "model.requested": (),
    "model.responded": ("text",),
    "tool.intent": ("args",),
    "policy.decided": (),
    "approval.requested": (),
    "approval.granted": (),
    "approval.denied": ("reason",),
    "tool.started": (),
    "tool.finished": (),  # a step's result is refused, never masked (runs.steps)
    "observation.projected": ("text",),
    "context.compacted": ("summary",),
    "verification.started": (),
    "verification.finished": (),
    "budget.exhausted": (),
    "binding.observed": (),
    "log.repaired": ("reason",),
    "spec.applied": (),  # the spec is stored as written (like session.created)
    "gc.collected": (),
    "migration.started": (),
    "migration.aborted": ("reason",),
    "migration.arriving": (),
    "migration.finished": (),
    "migration.discarded": ("reason",),
}


def _field(r: Redactor, name: str, value: Any) -> Any:
    if name == "checks":  # GateCheck models: only their detail is text
        out = []
        for check in value:
            detail = r.text(check.detail)
            same = detail is check.detail
            out.append(check if same else check.model_copy(update={"detail": detail}))
        return value if all(a is b for a, b in zip(out, value, strict=True)) else tuple(out)
    if name == "wakes":  # copies of wake.requested: trigger, seq and ts are not text
        out_wakes = []
        for wake in value:
            details = wake.get("details")
            masked = r.walk(details)
            out_wakes.append(wake if masked is details else {**wake, "details": masked})
        same = all(a is b for a, b in zip(out_wakes, value, strict=True))
        return value if same else tuple(out_wakes)
    return r.walk(value)


def mask(data: E, r: Redactor) -> E:
    """``data`` with its free text masked; ``data`` itself when nothing changed."""
    update: dict[str, Any] = {}
    for name in FREE_TEXT.get(data.EVENT_TYPE, ()):
        value = getattr(data, name)
        masked = _field(r, name, value)
        if masked is not value:
            update[name] = masked
    return data.model_copy(update=update) if update else data


def mask_drafts(drafts: Sequence[Draft], r: Redactor) -> list[Draft]:
    out = []
    for draft in drafts:
        data = mask(draft.data, r)
        out.append(draft if data is draft.data else draft._replace(data=data))
    return out


__all__ = ["FREE_TEXT", "mask", "mask_drafts"]
