"""The embedded backend: plain files under the state dir (DESIGN.md section 6).

::

    $STATE_DIR/sessions/<name>/
      spec.toml
      events.jsonl                 one framed event a line (see sessiond.codec)
      artifacts/<sha256 hex>       content-addressed evidence
      snapshots/state-<seq>.json   an optimisation; the log wins on disagreement

Group commit: appends write their lines at once (in call order, in the event
loop) and then wait for durability. One fsync runs at a time per log, in a
worker thread of the store; every append written before it started is covered
by it, and appends written while it ran share the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from sessiond.codec import Clock, decode_line, frame, unframe
from sessiond.errors import (
    AlreadyExists,
    ArtifactCorrupt,
    ArtifactMissing,
    BadArtifactRef,
    LogCorrupt,
    LogFailed,
    LogLocked,
    NoSuchSession,
    StorageError,
    StorageFull,
)
from sessiond.log.event_data import SHA256_HEX, SHA256_REF, ArtifactRef, EventData, LogRepaired
from sessiond.log.store.base import (
    START,
    ArtifactStore,
    Draft,
    Durability,
    EventLog,
    LogPosition,
    Pending,
    PositionMismatch,
    Record,
    Repair,
    Snapshot,
    SnapshotStore,
    Store,
)
from sessiond.log.store.durable import (
    DIR_MODE,
    FILE_MODE,
    fsync_dir,
    private_dir,
    read_regular,
    real_dir,
    write_all,
    write_durable,
)
from sessiond.log.store.lines import RecordBuilder, ScanEnd, classify_tail, scan
from sessiond.names import check_name

LOG_NAME = "events.jsonl"
SPEC_NAME = "spec.toml"
SNAPSHOT_FORMAT = "sessiond-snapshot"
SPEC_LIMIT = 1 << 20


@dataclass(frozen=True)
class IOHooks:
    """The system calls the log makes, replaceable by tests (fault injection, counting)."""

    fsync: Callable[[int], None] = os.fsync
    write: Callable[[int, bytes], None] = write_all
    # Told (session, offset) each time a log is durable up to offset, before any
    # append up to there is acknowledged (the power-cut simulation of the tests).
    synced: Callable[[str, int], None] | None = None


def _fsync_job(
    fsync: Callable[[int], None],
    fd: int,
    loop: asyncio.AbstractEventLoop,
    done: asyncio.Future[None],
) -> None:
    """Runs in a worker thread: one fsync, then one wake-up of the loop with its outcome.

    (``loop.run_in_executor`` wakes the loop through a chain of two futures and
    costs the loop about 1 µs more per append with 32 writers on one log.)"""
    outcome: BaseException | None = None
    try:
        fsync(fd)
    except BaseException as exc:  # the waiters get it, whatever it is
        outcome = exc
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
        loop.call_soon_threadsafe(_settle, done, outcome)


def _settle(done: asyncio.Future[None], outcome: BaseException | None) -> None:
    if done.done():  # the flusher was cancelled meanwhile
        return
    if outcome is None:
        done.set_result(None)
    else:
        done.set_exception(outcome)


@dataclass
class FileEventLog(EventLog):
    path: Path
    session: str
    durability: Durability
    clock: Clock
    hooks: IOHooks = field(default_factory=IOHooks)
    sync_on_recover: bool = True
    # Where fsyncs run; the store's own threads (open_log), the loop's default
    # executor when None.
    fsync_threads: Executor | None = None

    def __post_init__(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NoSuchSession(
                f"no session {self.session!r}: {self.path} does not exist"
            ) from None
        except OSError as exc:
            raise _planted(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLocked(
                f"the log of session {self.session!r} ({self.path}) is open by another writer; "
                "stop the daemon that holds it (one writer per log)"
            ) from None
        self._fd = fd
        self._builder = RecordBuilder(self.session, self.clock)
        self._pos = START
        self._recovered = False
        self._repair: Repair | None = None
        self._failed: str | None = None
        self._synced = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._closing = False
        self._flusher: asyncio.Task[None] | None = None

    # --- reading ------------------------------------------------------------------

    def _read(self, size: int, offset: int) -> bytes:
        return os.pread(self._fd, size, offset)

    @property
    def position(self) -> LogPosition:
        return self._pos

    @property
    def synced_offset(self) -> int:
        """Bytes known durable (fsync mode). Used by the power-cut simulation in tests."""
        return self._synced

    @property
    def repair(self) -> Repair | None:
        return self._repair

    def recover(self, after: LogPosition = START) -> Iterator[Record]:
        if self._recovered:
            raise RuntimeError("recover() runs once per open log")
        if after.seq:
            self._check_position(after)
        end = ScanEnd(after)
        yield from scan(self._read, after, end)
        size = os.fstat(self._fd).st_size
        bad = classify_tail(self._read, end, size)
        if bad is not None:
            self._failed = f"line {bad.line} is corrupt"
            raise LogCorrupt(str(self.path), bad.line, bad.offset, bad.why)
        self._pos = end.position
        if end.tail_bytes:
            # Cut the torn tail and record the cut in one durable step: a crash
            # between the two must not lose the record of what was dropped.
            self._repair = Repair(
                dropped_bytes=end.tail_bytes,
                at_offset=end.position.offset,
                last_good_seq=end.position.seq,
                reason=end.tail_reason,
            )
            os.ftruncate(self._fd, end.position.offset)
            event = LogRepaired(
                dropped_bytes=end.tail_bytes,
                at_offset=end.position.offset,
                last_good_seq=end.position.seq,
                reason=end.tail_reason,
            )
            records, buf = self._builder.build(self._pos.seq, [Draft(event)])
            self.hooks.write(self._fd, buf)
            self.hooks.fsync(self._fd)
            self._pos = LogPosition(
                records[0]["seq"], self._pos.offset + len(buf), records[0]["id"]
            )
            yield records[0]
        elif self.durability == "fsync" and self.sync_on_recover and self._pos.offset:
            # What a crashed writer left in the page cache is durable from now on,
            # before anyone acts on it. (The daemon syncs the whole file system
            # once instead, and sets sync_on_recover False.)
            try:
                self.hooks.fsync(self._fd)
            except OSError as exc:
                self._failed = f"fsync failed: {exc}"
                raise LogFailed(f"{self.path}: {self._failed}") from exc
        self._synced = self._pos.offset
        if self.hooks.synced is not None:
            self.hooks.synced(self.session, self._synced)
        self._recovered = True

    def _check_position(self, after: LogPosition) -> None:
        """Is the line that ends at ``after.offset`` event ``after.seq`` with ``after.last_id``?"""
        size = os.fstat(self._fd).st_size
        if not 0 < after.offset <= size:
            raise PositionMismatch(f"offset {after.offset} is outside the log ({size} bytes)")
        span = 1 << 12
        while True:
            start = max(0, after.offset - span)
            tail = self._read(after.offset - start, start)
            if not tail.endswith(b"\n"):
                raise PositionMismatch("no line ends at the snapshot's offset")
            cut = tail.rfind(b"\n", 0, len(tail) - 1)
            if cut >= 0 or start == 0:
                break
            span *= 4
        record = decode_line(tail[cut + 1 : -1])
        if record is None or record.get("seq") != after.seq or record.get("id") != after.last_id:
            raise PositionMismatch(f"the line before offset {after.offset} is not seq {after.seq}")

    # --- writing ------------------------------------------------------------------

    def write_many(self, drafts: Sequence[Draft]) -> Pending:
        if not self._recovered:
            raise RuntimeError("recover() the log before appending to it")
        if self._closing:
            raise LogFailed(f"the log of session {self.session!r} is closed; nothing was written")
        if self._failed is not None:
            raise LogFailed(
                f"the log of session {self.session!r} takes no appends: {self._failed}; "
                "restart the daemon to re-read it from disk"
            )
        records, buf = self._builder.build(self._pos.seq, drafts)
        if not records:
            return Pending([], self._pos)
        try:
            self.hooks.write(self._fd, buf)
        except OSError as exc:
            self._undo_partial_write(exc)
        last = records[-1]
        self._pos = LogPosition(last["seq"], self._pos.offset + len(buf), last["id"])
        return Pending(records, self._pos)

    def _undo_partial_write(self, exc: OSError) -> None:
        """Cut a partly written batch so the log stays a sequence of whole lines."""
        try:
            os.ftruncate(self._fd, self._pos.offset)
        except OSError as cut_exc:
            self._failed = f"a write failed ({exc}) and cutting it back failed ({cut_exc})"
            raise LogFailed(f"{self.path}: {self._failed}") from exc
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFull(
                f"{self.path}: no space left on the device; nothing was written. Free space "
                "in the state dir and try again"
            ) from exc
        self._failed = f"a write failed: {exc}"
        raise LogFailed(f"{self.path}: {self._failed}") from exc

    async def sync(self, pending: Pending) -> None:
        waiter = self._waiter(pending.position.offset)
        if waiter is not None:
            await waiter

    # append and append_many are the base class's, written out flat: one coroutine
    # frame less per append is measurable when many writers share a log.

    async def append_many(self, drafts: Sequence[Draft]) -> list[Record]:
        pending = self.write_many(drafts)
        waiter = self._waiter(pending.position.offset)
        if waiter is not None:
            await waiter
        return pending.records

    async def append(
        self, data: EventData, *, causation: str | None = None, correlation: str | None = None
    ) -> Record:
        pending = self.write_many((Draft(data, causation, correlation),))
        waiter = self._waiter(pending.position.offset)
        if waiter is not None:
            await waiter
        return pending.records[0]

    def _waiter(self, target: int) -> asyncio.Future[None] | None:
        """A future done once the log is durable up to byte ``target`` (None: already is)."""
        if self.durability == "os" or self._synced >= target:
            return None
        if self._failed is not None:
            raise LogFailed(f"{self.path}: {self._failed}")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiters.append((target, done))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush_loop())
        return done

    async def _flush_loop(self) -> None:
        """Group commit: one fsync covers every append written before it started;
        appends written while it ran wait for the next one. Runs while anyone waits."""
        loop = asyncio.get_running_loop()
        try:
            while self._waiters:
                # Let every task that is ready run one step first: writers just
                # acknowledged by the previous fsync write their next events now
                # and join this fsync instead of the one after (no timer, no delay
                # beyond the work already queued).
                await asyncio.sleep(0)
                target = self._pos.offset
                try:
                    if self.fsync_threads is None:
                        await loop.run_in_executor(None, self.hooks.fsync, self._fd)
                    else:
                        done: asyncio.Future[None] = loop.create_future()
                        self.fsync_threads.submit(
                            _fsync_job, self.hooks.fsync, self._fd, loop, done
                        )
                        await done
                except BaseException as exc:
                    # fsyncgate: after a failed fsync the kernel may have dropped the
                    # dirty pages, so a later fsync can succeed without the data.
                    # Stop writing; a restart re-reads what is really on disk. Any
                    # other failure (cancellation, a closed executor) is the same to
                    # the waiters: not durable. Nobody is left waiting.
                    self._failed = f"fsync failed: {exc!r}"
                    error = LogFailed(f"{self.path}: {self._failed}")
                    for _, waiter in self._waiters:
                        if not waiter.done():
                            waiter.set_exception(error)
                    self._waiters.clear()
                    if not isinstance(exc, Exception):
                        raise
                    return
                self._synced = max(self._synced, target)
                if self.hooks.synced is not None:
                    self.hooks.synced(self.session, self._synced)
                waiting = []
                for entry in self._waiters:
                    if entry[0] <= target:
                        if not entry[1].done():
                            entry[1].set_result(None)
                    else:
                        waiting.append(entry)
                self._waiters = waiting
        finally:
            self._flusher = None

    async def close(self) -> None:
        """Refuse new appends, wait until every written append is durable, close."""
        if self._fd < 0:
            return
        self._closing = True
        while self._flusher is not None:
            await asyncio.wait([self._flusher])
        os.close(self._fd)
        self._fd = -1


def _planted(path: Path, exc: OSError) -> StorageError:
    """The error for a file of the state dir that O_NOFOLLOW would not open."""
    if exc.errno == errno.ELOOP:
        # A symlink planted in place of a log or spec could make the daemon read
        # (and append to) a file anywhere: it is refused, never followed.
        return StorageError(
            f"{path} is a symbolic link; the state dir must hold real files only: "
            "replace it with the file itself (or restore it from a backup)"
        )
    return StorageError(f"{path} cannot be opened: {exc.strerror or exc}")


class FileArtifacts(ArtifactStore):
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, ref: str) -> Path:
        if not isinstance(ref, str) or not SHA256_REF.fullmatch(ref):
            raise BadArtifactRef(
                f"artifact reference {ref!r} is not valid: it must be 'sha256:' followed by "
                "64 lowercase hex digits"
            )
        return real_dir(self.folder) / ref[7:]

    def put(
        self, data: bytes, name: str, media_type: str = "application/octet-stream"
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        path = real_dir(self.folder) / digest
        try:
            st = os.lstat(path)
            present = stat.S_ISREG(st.st_mode) and st.st_size == len(data)
        except FileNotFoundError:
            present = False
        if not present:
            if path.is_symlink():
                path.unlink()
            write_durable(path, data)
        return ArtifactRef(ref=f"sha256:{digest}", name=name, size=len(data), media_type=media_type)

    def get(self, ref: str) -> bytes:
        path = self._path(ref)
        try:
            data = read_regular(path)
        except FileNotFoundError:
            raise ArtifactMissing(f"artifact {ref} is missing from {self.folder}") from None
        except OSError as exc:  # ELOOP: a symlink planted in place of an artifact
            raise ArtifactCorrupt(f"artifact {ref} cannot be read safely: {exc}") from exc
        except StorageError as exc:
            raise ArtifactCorrupt(f"artifact {ref}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != ref[7:]:
            raise ArtifactCorrupt(
                f"artifact {ref} in {self.folder} does not match its hash; restore it from a backup"
            )
        return data

    def has(self, ref: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self._path(ref)).st_mode)
        except FileNotFoundError:
            return False

    def digests(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(real_dir(self.folder)) if SHA256_HEX.fullmatch(n))
        except FileNotFoundError:
            return []


class FileSnapshots(SnapshotStore):
    """``state-<seq>.json``: a framed header line and a framed state line."""

    def __init__(self, folder: Path, keep: int = 2) -> None:
        self.folder = folder
        self.keep = keep

    @staticmethod
    def encode(snapshot: Snapshot) -> bytes:
        header = {
            "format": SNAPSHOT_FORMAT,
            "reducer": snapshot.reducer,
            "session": snapshot.session,
            "seq": snapshot.position.seq,
            "offset": snapshot.position.offset,
            "last_id": snapshot.position.last_id,
        }
        return frame(orjson.dumps(header)) + frame(orjson.dumps(snapshot.state))

    def path(self, seq: int) -> Path:
        return self.folder / f"state-{seq}.json"

    def save(self, snapshot: Snapshot) -> None:
        write_durable(
            real_dir(self.folder) / f"state-{snapshot.position.seq}.json", self.encode(snapshot)
        )
        self.prune()

    def prune(self) -> None:
        for old in self.seqs()[: -self.keep]:
            (self.folder / f"state-{old}.json").unlink(missing_ok=True)

    def seqs(self) -> list[int]:
        try:
            names = os.listdir(real_dir(self.folder))
        except FileNotFoundError:
            return []
        found = []
        for n in names:
            if n.startswith("state-") and n.endswith(".json") and n[6:-5].isdigit():
                found.append(int(n[6:-5]))
        return sorted(found)

    def load(self, seq: int) -> Snapshot | None:
        try:
            raw = read_regular(self.folder / f"state-{seq}.json")
        except (OSError, StorageError):
            return None
        parts = raw.split(b"\n")
        if len(parts) != 3 or parts[2]:
            return None
        bodies = [unframe(p) for p in parts[:2]]
        if bodies[0] is None or bodies[1] is None:
            return None
        try:
            header = orjson.loads(bodies[0])
            state = orjson.loads(bodies[1])
            if header.get("format") != SNAPSHOT_FORMAT or header["seq"] != seq:
                return None
            position = LogPosition(int(header["seq"]), int(header["offset"]), header["last_id"])
            return Snapshot(int(header["reducer"]), str(header["session"]), position, state)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def latest(self, reducer: int) -> Snapshot | None:
        for seq in reversed(self.seqs()):
            snap = self.load(seq)
            if snap is not None and snap.reducer == reducer:
                return snap
        return None

    def clear(self) -> None:
        for seq in self.seqs():
            (self.folder / f"state-{seq}.json").unlink(missing_ok=True)


class FileStore(Store):
    """Sessions as folders under ``root/sessions``."""

    def __init__(
        self,
        root: Path,
        *,
        clock: Clock = time.time_ns,
        hooks: IOHooks | None = None,
        snapshots_keep: int = 2,
    ) -> None:
        self.root = Path(root)
        self.sessions_dir = self.root / "sessions"
        self.clock = clock
        self.hooks = hooks or IOHooks()
        self.snapshots_keep = snapshots_keep
        # Set False by the daemon when its previous run stopped cleanly.
        self.sync_on_recover = True
        self._fsync_threads: ThreadPoolExecutor | None = None

    def fsync_threads(self) -> ThreadPoolExecutor:
        """The threads the logs' group-commit fsyncs run in (as many as the loop's
        default executor would have), started on first use. The store and every
        log it opened hold them; once none does, the idle threads exit by
        themselves (ThreadPoolExecutor's own weak reference), so a log may outlive
        its store."""
        if self._fsync_threads is None:
            self._fsync_threads = ThreadPoolExecutor(
                max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="fsync"
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
                for line in lines:
                    write_all(fd, line)
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
        log = await self.open_log(name, durability=durability)
        for _ in log.recover():
            pass
        return log

    async def open_log(self, name: str, *, durability: Durability = "fsync") -> FileEventLog:
        folder = self._dir(name)
        if folder.is_symlink():
            raise StorageError(f"{folder} is a symbolic link; the state dir must hold real folders")
        return FileEventLog(
            self.log_path(name),
            name,
            durability,
            self.clock,
            self.hooks,
            self.sync_on_recover,
            self.fsync_threads(),
        )

    def read(self, name: str, *, since: int = 1, upto: int | None = None) -> Iterator[Record]:
        for record, _line in self.read_lines(name, upto=upto):
            if record["seq"] >= since:
                yield record

    def read_lines(self, name: str, *, upto: int | None = None) -> Iterator[tuple[Record, bytes]]:
        path = self._real_dir(name) / LOG_NAME
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NoSuchSession(f"no session {name!r} in {self.sessions_dir}") from None
        except OSError as exc:
            raise _planted(path, exc) from None

        def read(size: int, offset: int) -> bytes:
            return os.pread(fd, size, offset)

        try:
            end = ScanEnd(START)
            for record, line in scan(read, START, end, upto=upto, with_lines=True):
                yield record, line + b"\n"
            if end.tail_bytes == -1 and (upto is None or end.position.seq < upto):
                bad = classify_tail(read, end, os.fstat(fd).st_size)
                if bad is not None:
                    raise LogCorrupt(str(path), bad.line, bad.offset, bad.why)
        finally:
            os.close(fd)

    def artifacts(self, name: str) -> FileArtifacts:
        return FileArtifacts(self._dir(name) / "artifacts")

    def snapshots(self, name: str) -> FileSnapshots:
        return FileSnapshots(self._dir(name) / "snapshots", keep=self.snapshots_keep)

    def read_spec(self, name: str) -> str | None:
        path = self._real_dir(name) / SPEC_NAME
        try:
            return read_regular(path, limit=SPEC_LIMIT).decode()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _planted(path, exc) from None
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
