"""Masking an event before it is written (docs/design.md section 8, "Secrets and
redaction"): the one place every event passes on its way to the log.

Every string of an event is masked unless it is known to be a link or a word of
the schema. So a field added later is masked until it is classified, never
stored in the clear by default. What is never touched:

- links and proofs: ids (``call``, ``run``, ``request_id``...), artifact
  references, hashes, times, names of sessions, profiles and sockets;
- words of the schema: every field typed as a fixed set of values (``status``,
  ``decision``...), and a wake's ``trigger``;
- the spec as written (``session.created``'s ``spec``): it names secrets by
  reference and holds the patterns themselves; a spec must hold no secret
  (docs/spec.md says so);
- a step's recorded result: one that holds a match is refused before it is
  recorded (runs.steps); a masked one could not be replayed.

Names are masked as names (``Redactor.ident``: a keyed digest per match), so
they stay distinct and stable: a step's ``key`` and name (``tool``, ``model``),
a divergence's, the paths a step writes, and the keys of any JSON object. What
people, programs and models wrote (a message, a tool call's argument values, an
observation, a reason, a note) is masked as text (``[REDACTED]``).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from functools import cache
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel

from sessiond.log.event_data import (
    PAYLOADS,
    CollectedArtifact,
    EventData,
    SessionCreated,
    ToolFinished,
)
from sessiond.log.store.base import Draft
from sessiond.redaction import Redactor

E = TypeVar("E", bound=EventData)

# Links, proofs and words of the schema, by field name, in any event or record.
KEPT = frozenset(
    {
        "call",
        "run",
        "request_id",
        "message_id",
        "handover",
        "ref",
        "media_type",
        "digest",
        "spec_sha256",
        "args_sha256",
        "request_sha256",
        "tools_sha256",
        "bundle_sha256",
        "git_head",
        "until",
        "expires_at",
        "exported_at",
        "trigger",
        "user",  # the answerer's account, from the peer's credentials
        "changed",  # top-level keys of a spec
        "parent",  # session names
        "child",
        "original_name",
        "profile",
        "from_profile",
        "to_profile",
        "source",  # a daemon's socket (migration.arriving)
        "to",  # a socket, a session or a lifecycle state
    }
)
# ... and those of one event type only
KEPT_IN: dict[type[BaseModel], frozenset[str]] = {
    SessionCreated: frozenset({"name", "spec"}),
    CollectedArtifact: frozenset({"artifact"}),  # a reference that no longer resolves
    ToolFinished: frozenset({"result"}),  # refused when it matches (runs.steps)
}
# Names: masked as names, so they stay distinct and stable (a step's identity).
NAMES = frozenset({"tool", "model", "key", "name", "writes", "sender", "hashes"})

Plan = tuple[tuple[str, str], ...]  # (field, "text" | "name" | "model")


def _fixed(annotation: Any) -> bool:
    """Whether a field's type is a fixed set of values (or no text at all)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return True
    if origin in (Union, types.UnionType):
        return all(_fixed(a) for a in get_args(annotation) if a is not type(None))
    return annotation in (int, float, bool, type(None))


@cache
def plan(model: type[BaseModel]) -> Plan:
    """How each field of ``model`` is masked; fields with nothing to mask are left out."""
    kept = KEPT | KEPT_IN.get(model, frozenset())
    out = []
    for name, info in model.model_fields.items():
        if name in kept or _fixed(info.annotation):
            continue
        out.append((name, "name" if name in NAMES else "text"))
    return tuple(out)


def _value(r: Redactor, how: str, value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _record(value, r)
    if isinstance(value, str):
        return r.ident(value) if how == "name" else r.text(value)
    if isinstance(value, tuple | list):
        items = [_value(r, how, v) for v in value]
        same = all(a is b for a, b in zip(items, value, strict=True))
        return value if same else type(value)(items)
    if isinstance(value, dict):
        if how == "name":  # hashes: paths by name, the hashes themselves kept
            out = {r.ident(k) if isinstance(k, str) else k: v for k, v in value.items()}
            return value if all(a is b for a, b in zip(out, value, strict=True)) else out
        return r.walk(value)
    return value


def _record(data: BaseModel, r: Redactor) -> Any:
    update: dict[str, object] = {}  # field -> its masked value
    for name, how in plan(type(data)):
        value = getattr(data, name)
        masked = _value(r, how, value)
        if masked is not value:
            update[name] = masked
    return data.model_copy(update=update) if update else data


def mask(data: E, r: Redactor) -> E:
    """``data`` with everything in it masked but its links; ``data`` itself when
    nothing changed."""
    masked: E = _record(data, r)
    return masked


def mask_drafts(drafts: Sequence[Draft], r: Redactor) -> list[Draft]:
    out = []
    for draft in drafts:
        data = mask(draft.data, r)
        out.append(draft if data is draft.data else draft._replace(data=data))
    return out


# what each event type masks (docs/events.md; tests/log/test_masking.py reads it)
MASKED: dict[str, Plan] = {p.EVENT_TYPE: plan(p) for p in PAYLOADS}

__all__ = ["KEPT", "MASKED", "NAMES", "mask", "mask_drafts", "plan"]
