"""``sessiond fsck``: check (and carefully repair) the sessions of a state dir, offline.

Checks per session: every line's checksum and seq order, every event against
its schema, every referenced artifact present with its hash, every stored
artifact matching its name, every snapshot equal to a replay up to its seq,
owner-only permissions. ``--repair`` fixes only what is safe to fix: it cuts a
torn tail (recorded as ``log.repaired``), deletes snapshots that disagree with
the log, and tightens permissions. It never touches corruption in the middle of
a log: that needs a person and a backup.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from sessiond.errors import ArtifactCorrupt, ArtifactMissing, InvalidInput, LogLocked, SessiondError
from sessiond.log.chunks import parts
from sessiond.log.events import decode
from sessiond.log.evidence import Evidence
from sessiond.log.journal import Journal
from sessiond.log.replay import apply
from sessiond.log.state import REDUCER_VERSION, State
from sessiond.log.store.base import START, ArtifactStore, Snapshot
from sessiond.log.store.durable import DIR_MODE, FILE_MODE
from sessiond.log.store.files import FileStore
from sessiond.log.store.lines import ScanEnd, classify_tail, scan


@dataclass
class Problem:
    session: str
    kind: str  # torn-tail | corrupt-line | invalid-event | artifact-missing | ...
    detail: str
    repairable: bool = False
    repaired: bool = False

    def line(self) -> str:
        mark = (
            " (repaired)"
            if self.repaired
            else (" (repairable with --repair)" if self.repairable else "")
        )
        return f"{self.session}: {self.kind}: {self.detail}{mark}"


@dataclass
class Report:
    state_dir: str
    sessions: int = 0
    events: int = 0
    artifacts: int = 0
    collected: int = 0  # referenced artifacts a gc removed (recorded as gc.collected)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.repaired for p in self.problems)

    def to_dict(self) -> dict[str, object]:
        return {
            "state_dir": self.state_dir,
            "ok": self.ok,
            "sessions": self.sessions,
            "events": self.events,
            "artifacts": self.artifacts,
            "collected": self.collected,
            "problems": [asdict(p) for p in self.problems],
        }


def check(state_dir: Path, *, repair: bool = False) -> Report:
    store = FileStore(state_dir)
    report = Report(str(state_dir))
    if not store.sessions_dir.is_dir():
        report.problems.append(Problem("-", "no-sessions", f"{store.sessions_dir} does not exist"))
        return report
    removed = set(store.remove_leftovers()) if repair else set()
    for entry in sorted({*os.listdir(store.sessions_dir), *removed}):
        folder = store.sessions_dir / entry
        if entry.startswith(".new-"):
            report.problems.append(
                Problem(
                    entry,
                    "leftover",
                    "an interrupted create left this folder; it holds no session"
                    + ("; deleted" if entry in removed else ": --repair deletes it"),
                    repairable=True,
                    repaired=entry in removed,
                )
            )
        elif not (folder / "events.jsonl").is_file():
            report.problems.append(Problem(entry, "no-log", f"{folder} has no events.jsonl"))
    for name in store.names():
        report.sessions += 1
        try:
            _check_session(store, name, report, repair)
        except (OSError, SessiondError) as exc:  # a symlink planted, a folder unreadable
            report.problems.append(
                Problem(name, "unreadable", f"{exc}; fix or remove the file, then check again")
            )
    return report


def _check_session(store: FileStore, name: str, report: Report, repair: bool) -> None:
    path = store.log_path(name)
    problems: list[Problem] = []
    state = State(session=name)
    snapshots = store.snapshots(name)
    snap_seqs = set(snapshots.seqs())
    evidence = Evidence()
    torn = False
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:

        def read(size: int, offset: int) -> bytes:
            return os.pread(fd, size, offset)

        end = ScanEnd(START)
        for record in scan(read, START, end):
            report.events += 1
            try:
                decode(record)
            except InvalidInput as exc:
                problems.append(Problem(name, "invalid-event", str(exc)))
                continue
            evidence.add(record)
            apply(state, record)
            if state.seq in snap_seqs:
                _compare_snapshot(store, name, state, problems, repair)
        bad = classify_tail(read, end, os.fstat(fd).st_size)
        if bad is not None:
            problems.append(
                Problem(
                    name,
                    "corrupt-line",
                    f"line {bad.line} (byte {bad.offset}): {bad.why}; "
                    "restore the log from a backup (never cut by --repair)",
                )
            )
        elif end.tail_bytes:
            torn = True
            problems.append(
                Problem(
                    name,
                    "torn-tail",
                    f"{end.tail_bytes} bytes after seq {end.position.seq}: {end.tail_reason}",
                    repairable=True,
                )
            )
    finally:
        os.close(fd)
    corrupt = any(p.kind == "corrupt-line" for p in problems)
    for seq in snap_seqs:
        # Past a corrupt line the log cannot be read, so a snapshot there is not
        # "ahead" of it; leave it for whoever restores the log.
        if seq > state.seq and not corrupt:
            problems.append(
                Problem(
                    name,
                    "snapshot-ahead",
                    f"snapshot at seq {seq} is past the log's end (seq {state.seq}); the log wins",
                    repairable=True,
                )
            )
            if repair:
                (store.snapshots(name).folder / f"state-{seq}.json").unlink(missing_ok=True)
                problems[-1].repaired = True
    check_artifacts(store.artifacts(name), name, evidence, report, problems)
    _check_modes(store, name, problems, repair)
    if torn and repair:
        _repair_tail(store, name, problems)
    report.problems.extend(problems)


def _compare_snapshot(
    store: FileStore, name: str, state: State, problems: list[Problem], repair: bool
) -> None:
    folder = store.snapshots(name).folder
    compare_snapshot(
        name,
        state,
        store.snapshots(name).load(state.seq),
        problems,
        (lambda: (folder / f"state-{state.seq}.json").unlink(missing_ok=True)) if repair else None,
    )


def compare_snapshot(
    name: str,
    state: State,
    snap: Snapshot | None,
    problems: list[Problem],
    drop: Callable[[], None] | None,
) -> None:
    """The snapshot at ``state.seq`` (``snap``; None: unreadable) against a replay of
    the log, on either backend; ``drop`` (given with ``--repair``) removes it."""
    if snap is None:
        problems.append(
            Problem(name, "snapshot-unreadable", f"snapshot at seq {state.seq}", repairable=True)
        )
    elif snap.reducer != REDUCER_VERSION:
        return  # written by another reducer version: ignored at start-up, not a problem
    elif snap.state != orjson.loads(orjson.dumps(state)):
        problems.append(
            Problem(
                name,
                "snapshot-mismatch",
                f"snapshot at seq {state.seq} differs from a replay of the log; the log wins",
                repairable=True,
            )
        )
    else:
        return
    if drop is not None:
        drop()
        problems[-1].repaired = True


def check_artifacts(
    artifacts: ArtifactStore, name: str, evidence: Evidence, report: Report, problems: list[Problem]
) -> None:
    """Stored artifacts match their hash; referenced ones are there (or a gc removed
    them, recorded); a chunked context has its parts. On files and the database."""
    stored = artifacts.digests()
    report.artifacts += len(stored)
    for digest in stored:
        try:
            artifacts.get(f"sha256:{digest}")
        except ArtifactCorrupt as exc:
            problems.append(Problem(name, "artifact-corrupt", str(exc)))
    present = set(stored)
    for ref in sorted(evidence.referenced):
        if ref[7:] not in present and ref in evidence.collected:
            report.collected += 1  # removed by a gc, recorded in the log: not damage
        elif ref[7:] not in present:
            problems.append(
                Problem(
                    name,
                    "artifact-missing",
                    str(ArtifactMissing(f"{ref} is referenced but missing")),
                )
            )
    for manifest in sorted(evidence.manifests):
        if manifest[7:] in present:
            _check_chunks(artifacts, name, manifest, present, evidence.collected, problems)


def _check_chunks(  # noqa: PLR0917 (one caller)
    artifacts: ArtifactStore,
    name: str,
    manifest: str,
    present: set[str],
    collected: set[str],
    problems: list[Problem],
) -> None:
    """Every part of a chunked context is there, or recorded as removed by a gc (one
    cut off by a crash may have removed some parts before their manifest)."""
    try:
        needed = parts(artifacts, manifest, missing=collected.__contains__)
    except SessiondError as exc:
        problems.append(Problem(name, "artifact-corrupt", f"context {manifest}: {exc}"))
        return
    for ref in needed:
        if ref[7:] not in present and ref not in collected:
            problems.append(
                Problem(
                    name, "artifact-missing", f"{ref}, a part of context {manifest}, is missing"
                )
            )


def _check_modes(store: FileStore, name: str, problems: list[Problem], repair: bool) -> None:
    folder = store.sessions_dir / name
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            _mode(Path(root) / d, DIR_MODE, name, problems, repair)
        for f in files:
            _mode(Path(root) / f, FILE_MODE, name, problems, repair)
    _mode(folder, DIR_MODE, name, problems, repair)


def _mode(path: Path, want: int, name: str, problems: list[Problem], repair: bool) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        problems.append(Problem(name, "symlink", f"{path} is a symbolic link; remove it"))
        return
    if stat.S_IMODE(st.st_mode) & ~want:
        problems.append(
            Problem(
                name,
                "permissions",
                f"{path} is {oct(stat.S_IMODE(st.st_mode))}, wider than {oct(want)}",
                repairable=True,
            )
        )
        if repair:
            os.chmod(path, want)
            problems[-1].repaired = True


def _repair_tail(store: FileStore, name: str, problems: list[Problem]) -> None:
    torn = next(p for p in problems if p.kind == "torn-tail")

    async def run() -> None:
        journal = await Journal.open(store, name, use_snapshots=False)
        await journal.close()

    try:
        asyncio.run(run())
    except LogLocked:
        torn.detail += "; not repaired: the log is open by a running daemon (stop it first)"
        return
    except SessiondError as exc:
        torn.detail += f"; not repaired: {exc}"
        return
    torn.repaired = True
