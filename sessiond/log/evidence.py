"""What a session's log says about its artifacts, read in seq order.

Fork, export, fsck and gc each read a log to learn which artifacts it needs.
Three things complicate a plain list of references, and this is the one place
that knows them:

- a gc may have removed evidence (``gc.collected``): such an artifact is gone on
  purpose, recorded, and is neither copied nor called missing;
- a chunked context (sessiond.log.chunks) is a manifest whose chunks no event
  names: whoever copies or keeps the manifest copies or keeps them too;
- the merge and compaction artifacts are what the messages view shows, so a gc
  keeps them while the session lives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sessiond.errors import SessiondError
from sessiond.log.chunks import CHUNKED_MEDIA, parts
from sessiond.log.event_data import SHA256_REF
from sessiond.log.store.base import ArtifactStore, Record

# Fields of event data that hold any JSON a program or a person gave (tool
# arguments, wake details, run wakes, the spec as written, a step's result): a {"ref": "sha256:..."}
# in them is data, not evidence. Taken for a reference, it made export and fork of
# the session fail for ever, looking for an artifact that never existed.
FREE_FORM = frozenset({"args", "details", "wakes", "spec", "result"})

# Events whose artifacts the messages view shows (merge results, summaries).
SHOWN = frozenset({"session.merged", "context.compacted"})


@dataclass
class Evidence:
    # every artifact an event names -> the seq of the last event naming it
    referenced: dict[str, int] = field(default_factory=dict)
    # removed by a gc and not named again since
    collected: set[str] = field(default_factory=set)
    manifests: set[str] = field(default_factory=set)  # chunked contexts
    shown: set[str] = field(default_factory=set)
    terminated_at: str | None = None  # ts of the last move to terminated

    def add(self, record: Record) -> None:
        etype = record["type"]
        data = record["data"]
        if etype == "gc.collected":
            self.collected.update(a["artifact"] for a in data.get("artifacts", ()))
            return
        if etype == "lifecycle.changed":
            self.terminated_at = record["ts"] if data.get("to") == "terminated" else None
        seq = record["seq"]
        for ref, media in _refs({k: v for k, v in data.items() if k not in FREE_FORM}):
            self.referenced[ref] = seq
            self.collected.discard(ref)
            if media == CHUNKED_MEDIA:
                self.manifests.add(ref)
            if etype in SHOWN:
                self.shown.add(ref)

    def add_all(self, records: Iterable[Record]) -> Evidence:
        for record in records:
            self.add(record)
        return self

    def wanted(self, artifacts: ArtifactStore) -> list[str]:
        """What a copy of this session (fork, export) takes: every reference but
        those a gc removed (when they are gone), and the parts of chunked contexts."""

        def kept(ref: str) -> bool:
            return ref not in self.collected or artifacts.has(ref)

        out = {r for r in self.referenced if kept(r)}
        for manifest in self.manifests & out:
            out.update(p for p in parts_of(artifacts, manifest) if kept(p))
        return sorted(out)


def parts_of(artifacts: ArtifactStore, manifest: str) -> list[str]:
    """The parts of a chunked context that can be found (an index chunk a gc cut off
    part way lists none of its own); none when its manifest cannot be read (it is
    then reported missing or corrupt by whoever checks it)."""
    try:
        return parts(artifacts, manifest, missing=lambda _ref: True)
    except SessiondError:
        return []


def _refs(value: Any) -> Iterable[tuple[str, str | None]]:
    if isinstance(value, dict):
        ref = value.get("ref")
        if isinstance(ref, str) and SHA256_REF.fullmatch(ref):
            media = value.get("media_type")
            yield ref, media if isinstance(media, str) else None
        for item in value.values():
            if isinstance(item, dict | list):
                yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)
