"""Event envelopes: the closed, versioned set of event types.

An event on disk is a JSON object with the envelope fields ``v``, ``session``,
``seq``, ``id``, ``ts``, ``type``, ``causation``, ``correlation`` and ``data``.
Two forms exist in memory:

* a *record*: the plain ``dict`` read from a line whose checksum holds. The replay
  hot path folds records directly; the writer validated them when it wrote them.
* an :class:`Envelope`: a frozen pydantic model, produced by :func:`decode` for
  anything read from outside (an imported bundle, a golden file, ``fsck``).

The envelope class of each type is ``Envelope`` with ``type`` narrowed to one
literal (the discriminator) and ``data`` narrowed to the type's payload.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal, cast

from pydantic import Field, ValidationError, create_model, field_validator

from sessiond.errors import InvalidEvent, UnknownEventType, UnsupportedVersion
from sessiond.log.event_data import PAYLOAD_BY_TYPE, PAYLOADS, EventData, Record
from sessiond.log.event_records import EventRecord

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$")
EVENT_ID = re.compile(r"^[0-9a-f]{32}$")

# Schema version of each type as this sessiond writes it. Bump one (and add an
# upcaster from the old version, and a golden file of the old version) when a
# type's meaning changes.
CURRENT_VERSION: Mapping[str, int] = MappingProxyType(dict.fromkeys(PAYLOAD_BY_TYPE, 1))

# An upcaster takes a record of one older version of its type (that version's shape,
# not today's EventRecord) and returns the record at the next version.
Upcaster = Callable[[Mapping[str, Any]], Mapping[str, Any]]

# (type, from_version) -> function returning the record at from_version + 1.
# Empty while only version 1 of every type is published.
UPCASTERS: Mapping[tuple[str, int], Upcaster] = MappingProxyType({})


class Envelope(Record):
    """Fields every event carries."""

    v: int = Field(ge=1)
    session: str
    seq: int = Field(ge=1)
    id: str
    ts: str
    type: str
    causation: str | None = None
    correlation: str | None = None
    data: EventData
    # Which cluster node wrote the event, under which epoch of its ownership
    # (docs/design.md section 10); absent in logs of the files backend.
    node: str | None = None
    epoch: int | None = Field(default=None, ge=1)

    @field_validator("ts")
    @classmethod
    def _utc_rfc3339(cls, value: str) -> str:
        if not RFC3339_UTC.match(value):
            raise ValueError("ts must be an RFC 3339 UTC time like 2026-01-31T09:00:00.000001Z")
        datetime.fromisoformat(value.replace("Z", "+00:00"))
        return value

    @field_validator("id")
    @classmethod
    def _event_id(cls, value: str) -> str:
        if not EVENT_ID.match(value):
            raise ValueError("id must be 32 lowercase hex digits")
        return value


def _envelope_class(payload: type[EventData]) -> type[Envelope]:
    name = payload.__name__ + "Event"
    cls: type[Envelope] = create_model(
        name,
        __base__=Envelope,
        type=(Literal[payload.EVENT_TYPE], ...),  # type: ignore[arg-type]
        data=(payload, ...),
    )
    return cls


ENVELOPES: Mapping[str, type[Envelope]] = MappingProxyType(
    {p.EVENT_TYPE: _envelope_class(p) for p in PAYLOADS}
)

EVENT_TYPES: tuple[str, ...] = tuple(PAYLOAD_BY_TYPE)


def upcast(
    # a record as written at any version: only its version says its shape
    record: Mapping[str, Any],
    *,
    current: Mapping[str, int] = CURRENT_VERSION,
    upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS,
) -> EventRecord:
    """Bring a record to the current version of its type.

    Raises :class:`UnknownEventType` for a type this sessiond does not know and
    :class:`UnsupportedVersion` for a version newer than it writes. Never drops a
    record silently.
    """
    etype = record.get("type")
    if not isinstance(etype, str) or etype not in current:
        raise UnknownEventType(
            f"event seq {record.get('seq')!r} has unknown type {etype!r}; known types are "
            f"{', '.join(sorted(current))}. Was it written by a newer or another program?"
        )
    version = record.get("v")
    want = current[etype]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidEvent(
            f"event seq {record.get('seq')!r} ({etype}) has version {version!r}; "
            "v must be a positive integer"
        )
    if version > want:
        raise UnsupportedVersion(
            f"event seq {record.get('seq')!r} is {etype} v{version}, but this sessiond "
            f"reads up to v{want}; upgrade sessiond to read this log"
        )
    while version < want:
        step = upcasters.get((etype, version))
        if step is None:
            raise UnsupportedVersion(
                f"no upcaster from {etype} v{version} to v{version + 1}; this is a bug in "
                "sessiond: every published version must stay readable"
            )
        record = step(record)
        version += 1
        record = {**record, "v": version}
    # at the current version of its type: the shape its writer validated
    return cast(EventRecord, record)


# a record as read (any version, any type): the envelope's model checks it
def decode(record: Mapping[str, Any]) -> Envelope:
    """Fully validate a record from outside (after upcasting) into its typed envelope."""
    current = upcast(record)
    try:
        return ENVELOPES[current["type"]].model_validate(current)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise InvalidEvent(
            f"event seq {current.get('seq')!r} ({current['type']}) is invalid: {problems}"
        ) from exc


def encode(event: Envelope) -> EventRecord:
    """The record form of an envelope (what :func:`decode` reads back). The
    cluster's optional fields are left out where absent, as they are in the line."""
    record = cast(EventRecord, event.model_dump(mode="json", by_alias=True))
    if record["node"] is None:
        del record["node"]
    if record["epoch"] is None:
        del record["epoch"]
    return record
