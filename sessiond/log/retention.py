"""What a gc removes from one session's store, and removing it (docs/design.md section 6).

:func:`plan` decides from the session's state (what continuing needs), what its
log says about its artifacts (:class:`~sessiond.log.evidence.Evidence`) and the
``[retention]`` rules; :func:`remove` deletes what a plan names. The caller
records the plan as ``gc.collected`` *before* calling :func:`remove`, so a crash
part way leaves files recorded and still present (a later gc removes them),
never files gone without a record.

Never removed, whatever the rules say:

- what the resume gate checks (``State.live_artifacts``: unobserved outputs, the
  last run's output, a model call's context awaiting its answer, what the
  messages view shows), the open turn's step results (a later run of the turn
  replays them) and the merge and compaction artifacts, with the parts of any
  chunked context among them;
- the newest snapshot (``snapshots`` is at least 1);
- in a live session, a file written or reused in the last :data:`FRESH` seconds:
  an event naming it may be on its way (``FileArtifacts.put`` touches a file it
  finds already there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sessiond.config import RetentionConfig
from sessiond.log.event_data import GcRule
from sessiond.log.evidence import Evidence, parts_of
from sessiond.log.state import State
from sessiond.log.store.base import ArtifactStore, SnapshotStore
from sessiond.log.store.durable import fsync_dir, real_dir
from sessiond.log.store.fileartifacts import FileArtifacts
from sessiond.log.store.filesnapshots import FileSnapshots
from sessiond.replies import GcSession

FRESH = 600.0


@dataclass(frozen=True)
class Removal:
    ref: str
    size: int
    rule: GcRule


@dataclass
class Plan:
    session: str
    artifacts: list[Removal] = field(default_factory=list)
    snapshots: list[int] = field(default_factory=list)
    snapshot_bytes: int = 0

    @property
    def bytes(self) -> int:
        return sum(r.size for r in self.artifacts) + self.snapshot_bytes

    def __bool__(self) -> bool:
        return bool(self.artifacts or self.snapshots)

    def to_dict(self) -> GcSession:
        return {
            "name": self.session,
            "artifacts": [{"ref": r.ref, "size": r.size, "rule": r.rule} for r in self.artifacts],
            "snapshots": self.snapshots,
            "bytes": self.bytes,
        }


def needed(state: State, evidence: Evidence, artifacts: ArtifactStore) -> set[str]:
    """What continuing the session needs (never removed): see the module's text."""
    keep = set(state.live_artifacts())
    for step in state.turn["steps"].values() if state.turn else ():
        ref = step.get("result_ref")
        if ref:
            keep.add(ref["ref"])
    keep |= evidence.shown
    for manifest in keep & evidence.manifests:
        keep.update(parts_of(artifacts, manifest))
    return keep


def _age(ts: str | None, now: datetime) -> float | None:
    if ts is None:
        return None
    return (now - datetime.fromisoformat(ts.replace("Z", "+00:00"))).total_seconds()


def plan(  # noqa: PLR0917 (one caller; each input is a different thing)
    name: str,
    keep: set[str],
    live: bool,
    evidence: Evidence,
    artifacts: ArtifactStore,
    snapshots: SnapshotStore,
    rules: RetentionConfig,
    now: datetime,
    real_now: float,
) -> Plan:
    """What ``rules`` remove from session ``name`` now, never ``keep`` (:func:`needed`);
    ``live``: the session is not terminated. ``now``: the daemon's clock, for event
    times; ``real_now``: the machine's, for file times (on a cluster, the time each
    artifact was stored, on the database's clock). Only the store is read: it may
    run in a thread."""
    out = Plan(name)
    files = artifacts.stats()  # ref -> (size, stored or last reused)
    age = _age(evidence.terminated_at, now)
    going: dict[str, GcRule] = {}

    def fresh(ref: str) -> bool:
        return live and real_now - files[ref][1] < FRESH

    if not live and rules.terminated is not None and age is not None and age >= rules.terminated:
        going = {ref: "terminated" for ref in files if ref not in keep}
    else:
        if rules.keep_artifacts is not None:
            named = sorted(
                (r for r in evidence.referenced if r in files and r not in keep),
                key=lambda r: evidence.referenced[r],
                reverse=True,
            )
            for ref in named[rules.keep_artifacts :]:
                if not fresh(ref):
                    going[ref] = "beyond-keep"
        if rules.unreferenced is not None:
            parts: set[str] = set()
            for manifest in evidence.manifests:
                if manifest in files:
                    parts.update(parts_of(artifacts, manifest))
            for ref, (_size, stored) in files.items():
                if (
                    ref not in evidence.referenced
                    and ref not in parts
                    and ref not in keep
                    and real_now - stored >= max(rules.unreferenced, FRESH if live else 0)
                ):
                    going[ref] = "unreferenced"
        # the parts of a removed context go with it, unless a kept one shares them
        removed = {m for m in evidence.manifests if m in going}
        if removed:
            kept_parts: set[str] = set()
            for manifest in evidence.manifests:
                if manifest in files and manifest not in going:
                    kept_parts.update(parts_of(artifacts, manifest))
            for manifest in removed:
                for part in parts_of(artifacts, manifest):
                    if (
                        part in files
                        and part not in going
                        and part not in kept_parts
                        and part not in keep
                        and part not in evidence.referenced
                        and not fresh(part)
                    ):
                        going[part] = "chunk"
    out.artifacts = [Removal(ref, files[ref][0], rule) for ref, rule in sorted(going.items())]
    if rules.snapshots is not None:
        sizes = snapshots.sizes()
        for seq in sorted(sizes)[: -rules.snapshots]:
            out.snapshot_bytes += sizes[seq]
            out.snapshots.append(seq)
    return out


def remove(
    artifacts: ArtifactStore,
    snapshots: SnapshotStore,
    plan: Plan,
    each: Callable[[], None] | None = None,
) -> None:
    """Delete what ``plan`` names (already recorded), then make the deletions durable.
    ``each``, if given, is called after every file (the crash tests' hook)."""
    if not isinstance(artifacts, FileArtifacts) or not isinstance(snapshots, FileSnapshots):
        # a cluster's database: one transaction for the artifacts, one per snapshot
        if plan.artifacts:
            artifacts.remove([r.ref for r in plan.artifacts])
        for seq in plan.snapshots:
            snapshots.drop(seq)
        return
    folder = real_dir(artifacts.folder)
    for removal in plan.artifacts:
        (folder / removal.ref[7:]).unlink(missing_ok=True)
        if each is not None:
            each()
    for seq in plan.snapshots:
        snapshots.path(seq).unlink(missing_ok=True)
        if each is not None:
            each()
    if plan.artifacts:
        fsync_dir(folder)
    if plan.snapshots:
        fsync_dir(snapshots.folder)
