"""Forking a session: a new log that starts with the parent's events unchanged.

The child's log holds the parent's lines 1..N byte for byte (same ids, same
seqs, same ``session`` field), then ``session.forked`` at N+1. The artifacts
those events name are copied into the child's store, so every reference
resolves inside the session's own store. The parent's log gets a
``session.forked`` too, so lineage is visible from both sides.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sessiond.errors import InvalidInput
from sessiond.log.event_data import SHA256_REF, SessionForked
from sessiond.log.evidence import FREE_FORM, Evidence
from sessiond.log.journal import Journal
from sessiond.log.pace import Pacer, release
from sessiond.log.store.base import Durability, Pending, Store
from sessiond.names import check_name


def artifact_refs(data: Any) -> Iterator[str]:
    """Every ``sha256:`` artifact reference in an event's data (outside FREE_FORM)."""
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in FREE_FORM}
    return _refs(data)


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        ref = value.get("ref")
        if isinstance(ref, str) and SHA256_REF.fullmatch(ref):
            yield ref
        for item in value.values():
            if isinstance(item, dict | list):
                yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


async def fork(
    store: Store,
    parent: Journal,
    child: str,
    *,
    at_seq: int | None = None,
    with_triggers: bool = False,
    durability: Durability = "fsync",
) -> Journal:
    """Create ``child`` from ``parent``'s events 1..``at_seq`` (default: all so far)."""
    check_name(child)
    last = parent.state.seq
    at = last if at_seq is None else at_seq
    if not 1 <= at <= last:
        raise InvalidInput(
            f"cannot fork {parent.session!r} at seq {at}: it has events 1..{last}; "
            "pick a seq in that range"
        )
    # Copy only what the parent has durably: the child's history must never hold
    # an event the parent could lose in a power cut.
    await parent.log.sync(Pending([], parent.log.position))
    # Lines 1..at only, a slice at a time: the loop serves other sessions meanwhile.
    # The caller holds the parent's lock, so only the parent's own requests wait.
    lines: list[bytes] = []
    evidence = Evidence()
    pacer = Pacer()
    for record, line in store.read_lines(parent.session, upto=at):
        lines.append(line)
        evidence.add(record)
        if pacer.due():
            await pacer.pause()
    if len(lines) != at:
        raise InvalidInput(f"could read only {len(lines)} of {at} events of {parent.session!r}")
    parent_artifacts = store.artifacts(parent.session)
    # what a gc removed stays removed; a chunked context's parts come along
    blobs = (parent_artifacts.get(ref) for ref in evidence.wanted(parent_artifacts))
    new_log = await store.create(
        child,
        spec=store.read_spec(parent.session),
        lines=lines,
        artifacts=blobs,
        durability=durability,
    )
    await new_log.close()
    await release(lines)  # 100,000 lines freed at once held the loop for milliseconds
    journal = await Journal.open(store, child, durability=durability)
    event = SessionForked(
        parent=parent.session, child=child, at_seq=at, with_triggers=with_triggers
    )
    await journal.append(event)
    await parent.append(event)
    return journal
