"""The embedded backend: plain files under the state dir (docs/design.md section 6).

::

    $STATE_DIR/sessions/<name>/
      spec.toml
      events.jsonl                 one framed event a line (see sessiond.codec)
      artifacts/<sha256 hex>       content-addressed evidence
      snapshots/state-<seq>.json   an optimisation; the log wins on disagreement

This module owns the folders: creating a session (durably, by rename), listing
them, cleaning up what a crashed create left, reading logs and specs without
opening a log for writing. Each file inside has its own module: the open log and
its group commit (filelog.py), artifacts (fileartifacts.py), snapshots
(filesnapshots.py). They are re-exported here, the one place callers import the
file backend from.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessiond.codec import Clock
from sessiond.errors import AlreadyExists, LogCorrupt, NoSuchSession, StorageError
from sessiond.log.pace import Pacer
from sessiond.log.store.base import START, Durability, LogPosition, Record, Snapshot, Store
from sessiond.log.store.disk import DISK_THREADS
from sessiond.log.store.durable import (
    DIR_MODE,
    FILE_MODE,
    fsync_dir,
    planted_error,
    private_dir,
    read_regular,
    real_dir,
    write_all,
    write_durable,
)
from sessiond.log.store.fileartifacts import FileArtifacts
from sessiond.log.store.filelog import FileEventLog, IOHooks, check_position
from sessiond.log.store.filesnapshots import SNAPSHOT_FORMAT, FileSnapshots
from sessiond.log.store.hashcache import HashCache
from sessiond.log.store.lines import ScanEnd, classify_tail, scan
from sessiond.names import check_name

__all__ = [
    "LOG_NAME",
    "SNAPSHOT_FORMAT",
    "SPEC_LIMIT",
    "SPEC_NAME",
    "FileArtifacts",
    "FileEventLog",
    "FileSnapshots",
    "FileStore",
    "IOHooks",
]

LOG_NAME = "events.jsonl"
SPEC_NAME = "spec.toml"
SPEC_LIMIT = 1 << 20


READ_STEP = 256 << 10  # bytes a read of read_lines() takes at most


class FileStore(Store):
    """Sessions as folders under ``root/sessions``."""

    def __init__(
        self,
        root: Path,
        *,
        clock: Clock = time.time_ns,
        hooks: IOHooks | None = None,
        snapshots_keep: int = 2,
        sync_interval: float = 1.0,
    ) -> None:
        self.root = Path(root)
        self.sessions_dir = self.root / "sessions"
        self.clock = clock
        self.hooks = hooks or IOHooks()
        self.snapshots_keep = snapshots_keep
        self.sync_interval = sync_interval  # durability "os": see filelog.py
        # Artifact hashes the gate checked, for every session (see hashcache.py).
        self.artifact_hashes = HashCache()
        # Set False by the daemon when its previous run stopped cleanly.
        self.sync_on_recover = True
        # The seq each session's log ends at, where something proved it (the table
        # index at start-up): its next opening reads the snapshot there first.
        self.snapshot_hints: dict[str, int] = {}
        # Logs made durable before this start (the table index vouched for them; the
        # start's sync of the file system, or the clean stop, covered them): opened
        # later without an fsync of their own, whatever sync_on_recover says by then.
        self.durable_logs: set[str] = set()
        self._fsync_threads: ThreadPoolExecutor | None = None

    def fsync_threads(self) -> ThreadPoolExecutor:
        """The threads the logs' group-commit fsyncs run in, started on first use:
        one a log that waits, up to DISK_THREADS (disk.py: fsyncs of many sessions'
        logs at once share the file system's journal commits). The store and every
        log it opened hold them; once none does, the idle threads exit by
        themselves (ThreadPoolExecutor's own weak reference), so a log may outlive
        its store."""
        if self._fsync_threads is None:
            self._fsync_threads = ThreadPoolExecutor(
                max_workers=DISK_THREADS, thread_name_prefix="fsync"
            )
        return self._fsync_threads

    def _dir(self, name: str) -> Path:
        return self.sessions_dir / check_name(name)

    def log_path(self, name: str) -> Path:
        return self._dir(name) / LOG_NAME

    def names(self) -> list[str]:
        try:
            entries = os.listdir(real_dir(self.sessions_dir))
        except FileNotFoundError:
            return []
        base = str(self.sessions_dir)  # plain strings: this runs for every session
        isfile, islink = os.path.isfile, os.path.islink
        # A log replaced by a symlink (even a dangling one) is listed, so the session
        # shows up refused with the reason instead of silently vanishing.
        return sorted(
            n
            for n in entries
            if n[0] != "." and (isfile(p := f"{base}/{n}/{LOG_NAME}") or islink(p))
        )

    def leftovers(self) -> list[str]:
        """Folders of creates (create, fork, import) a crash cut off before their
        rename: they never held a session."""
        try:
            entries = os.listdir(real_dir(self.sessions_dir))
        except FileNotFoundError:
            return []
        return sorted(n for n in entries if n.startswith(".new-"))

    def remove_leftovers(self) -> list[str]:
        """Delete what ``leftovers`` finds. Only while no create can be under way: the
        daemon holds the state dir's lock, fsck runs with no daemon."""
        gone = self.leftovers()
        for entry in gone:
            shutil.rmtree(self.sessions_dir / entry, ignore_errors=True)
        return gone

    def exists(self, name: str) -> bool:
        return self.log_path(name).is_file()

    def _real_dir(self, name: str) -> Path:
        """The session's folder for reading, refused when it is a symlink (reading
        through one would serve another folder's log, spec or artifacts)."""
        try:
            return real_dir(self._dir(name))
        except FileNotFoundError:
            raise NoSuchSession(f"no session {name!r} in {self.sessions_dir}") from None

    async def create(
        self,
        name: str,
        *,
        spec: str | None = None,
        lines: Iterable[bytes] = (),
        artifacts: Iterable[bytes] = (),
        durability: Durability = "fsync",
    ) -> FileEventLog:
        final = self._dir(name)
        if final.exists():
            raise AlreadyExists(f"session {name!r} exists already; pick another name")
        # The files are written in a thread: what takes long here (writes, fsync,
        # hashing the artifacts) releases the GIL, so the loop goes on meanwhile.
        await asyncio.to_thread(self._build, name, final, spec, lines, artifacts)
        log = await self.open_log(name, durability=durability)
        pacer = Pacer()
        for _ in log.recover():  # a long log is checked a slice at a time
            if pacer.due():
                await pacer.pause()
        return log

    def _build(
        self,
        name: str,
        final: Path,
        spec: str | None,
        lines: Iterable[bytes],
        artifacts: Iterable[bytes],
    ) -> None:
        """The session's folder, made under a temporary name and renamed in place."""
        private_dir(self.sessions_dir)
        tmp = self.sessions_dir / f".new-{name}-{os.urandom(4).hex()}"
        os.mkdir(tmp, DIR_MODE)
        try:
            os.mkdir(tmp / "artifacts", DIR_MODE)
            os.mkdir(tmp / "snapshots", DIR_MODE)
            store = FileArtifacts(tmp / "artifacts")
            for blob in artifacts:
                store.put(blob, "copied")
            if spec is not None:
                write_durable(tmp / SPEC_NAME, spec.encode(), sync_dir=False)
            fd = os.open(tmp / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                # A thousand lines a write: few system calls, and no join of the whole
                # log at once (a join holds the GIL for as long as it copies).
                group: list[bytes] = []
                for line in lines:
                    group.append(line)
                    if len(group) >= 1024:
                        write_all(fd, b"".join(group))
                        group.clear()
                if group:
                    write_all(fd, b"".join(group))
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(tmp)
            try:
                os.rename(tmp, final)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise AlreadyExists(
                        f"session {name!r} exists already; pick another name"
                    ) from exc
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(self.sessions_dir)

    async def open_log(self, name: str, *, durability: Durability = "fsync") -> FileEventLog:
        folder = f"{self.sessions_dir}/{check_name(name)}"  # (a string: see _folder)
        if os.path.islink(folder):
            raise StorageError(f"{folder} is a symbolic link; the state dir must hold real folders")
        return FileEventLog(
            Path(f"{folder}/{LOG_NAME}"),
            name,
            durability,
            self.clock,
            self.hooks,
            self.sync_on_recover and name not in self.durable_logs,
            self.fsync_threads(),
            self.sync_interval,
        )

    def read(self, name: str, *, since: int = 1, upto: int | None = None) -> Iterator[Record]:
        for record, _line in self.read_lines(name, upto=upto):
            if record["seq"] >= since:
                yield record

    def read_lines(self, name: str, *, upto: int | None = None) -> Iterator[tuple[Record, bytes]]:
        for record, line, _end in self._lines(name, START, upto):
            yield record, line

    def read_after(self, name: str, after: LogPosition) -> Iterator[tuple[Record, LogPosition]]:
        """Every event after ``after`` (a position this store gave, or ``START``), each
        with the position right after it, without reading what comes before: a
        reader that keeps its place (gc) reads only what was appended since.
        :class:`PositionMismatch` if the log there is not what ``after`` says (a
        log replaced by ``import``, a session made anew under the name)."""
        for record, line, end in self._lines(name, after, None):
            yield record, LogPosition(record["seq"], end, record["id"])
            del line

    def _lines(
        self, name: str, after: LogPosition, upto: int | None
    ) -> Iterator[tuple[Record, bytes, int]]:
        path = self._real_dir(name) / LOG_NAME
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NoSuchSession(f"no session {name!r} in {self.sessions_dir}") from None
        except OSError as exc:
            raise planted_error(path, exc) from None

        def read(size: int, offset: int) -> bytes:
            # A reader that yields to the loop between lines (log, replay, fork, export)
            # must not meet one step that splits 8 MB: a quarter of a MB a read.
            return os.pread(fd, min(size, READ_STEP), offset)

        try:
            if after != START:
                # the whole span at once (a line may be longer than READ_STEP)
                check_position(lambda n, at: os.pread(fd, n, at), os.fstat(fd).st_size, after)
            end = ScanEnd(after)
            offset = after.offset
            for record, line in scan(read, after, end, upto=upto, with_lines=True):
                offset += len(line) + 1
                yield record, line + b"\n", offset
            if end.tail_bytes == -1 and (upto is None or end.position.seq < upto):
                bad = classify_tail(read, end, os.fstat(fd).st_size)
                if bad is not None:
                    raise LogCorrupt(str(path), bad.line, bad.offset, bad.why)
        finally:
            os.close(fd)

    def artifacts(self, name: str) -> FileArtifacts:
        return FileArtifacts(self._dir(name) / "artifacts", self.artifact_hashes)

    def snapshots(self, name: str) -> FileSnapshots:
        return FileSnapshots(
            f"{self.sessions_dir}/{check_name(name)}/snapshots",
            keep=self.snapshots_keep,
            hint=self.snapshot_hints.pop(name, None) if self.snapshot_hints else None,
        )

    def _folder(self, name: str) -> str:
        """``_real_dir`` as a plain string: start-up reads every session's files, and
        building paths as objects cost more than the reads."""
        path = f"{self.sessions_dir}/{check_name(name)}"
        try:
            return real_dir(path)
        except FileNotFoundError:
            raise NoSuchSession(f"no session {name!r} in {self.sessions_dir}") from None

    def read_spec(self, name: str) -> str | None:
        path = f"{self._folder(name)}/{SPEC_NAME}"
        try:
            return read_regular(path, limit=SPEC_LIMIT).decode()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise planted_error(path, exc) from None
        except UnicodeDecodeError:
            raise StorageError(f"{path} is not UTF-8 text; restore it from a backup") from None

    def save_snapshots(self, snapshots: list[Snapshot]) -> None:
        """Save many snapshots with two syncs of the file system instead of two
        fsyncs each (shutdown snapshots every session): write them all, sync,
        publish them all by rename, sync."""
        staged = []
        for snap in snapshots:
            store = self.snapshots(snap.session)
            final = store.path(snap.position.seq)
            tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
            try:
                write_all(fd, store.encode(snap))
            finally:
                os.close(fd)
            staged.append((tmp, final, store))
        if not staged:
            return
        os.sync()  # every staged file's data is on disk before it gets its name
        for tmp, final, _ in staged:
            os.replace(tmp, final)
        os.sync()  # and the names
        for _, _, store in staged:
            store.prune()

    def write_spec(self, name: str, text: str) -> None:
        write_durable(real_dir(self._dir(name)) / SPEC_NAME, text.encode())
