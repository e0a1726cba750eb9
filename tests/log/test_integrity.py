"""The storage checks behind the gate (docs/design.md section 9): an open log verifies
that the file is its own and as long as its end, reading only the lines written
since the last check; artifact hashes are remembered while a file is unchanged;
``durability = "os"`` syncs each log within ``sync_interval``."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from sessiond.log.event_data import MessageReceived
from sessiond.log.store.files import FileEventLog, FileStore, IOHooks
from sessiond.log.store.hashcache import RACY_NS, HashCache, NotRegularFile
from tests.helpers import arun, tool_call

LATER = 10**12  # a clock this far ahead sees every file as long unchanged


async def _open(store: FileStore, name: str = "s") -> FileEventLog:
    log = await store.create(name)
    await log.append_many(tool_call("c1"))
    return log


def test_an_untouched_log_verifies_and_a_restart_starts_from_what_it_read(
    state_dir: Path,
) -> None:
    async def go() -> None:
        store = FileStore(state_dir)
        log = await _open(store)
        assert log.verify() is None
        await log.append(MessageReceived(sender="x", text="more"))
        assert log.verify() is None
        await log.close()
        again = await store.open_log("s")
        list(again.recover())
        assert again.verify() is None
        await again.close()

    arun(go())


def test_verify_reads_only_the_lines_written_since_the_last_check(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[int] = []
    pread = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        data = pread(fd, size, offset)
        read.append(len(data))
        return data

    async def go() -> None:
        log = await _open(FileStore(state_dir))
        assert log.verify() is None  # the appends after recovery
        before = log.position.offset
        monkeypatch.setattr(os, "pread", counting)
        assert log.verify() is None  # nothing new: nothing to read
        assert sum(read) == 0
        await log.append(MessageReceived(sender="x", text="new"))
        assert log.verify() is None
        assert sum(read) == log.position.offset - before
        monkeypatch.undo()
        await log.close()

    arun(go())


def test_a_truncated_a_longer_a_replaced_and_a_missing_log_are_named(state_dir: Path) -> None:
    async def go() -> None:
        store = FileStore(state_dir)
        log = await _open(store)
        path = store.log_path("s")
        end = log.position.offset
        data = path.read_bytes()
        os.truncate(path, end - 10)
        problem = log.verify()
        assert problem is not None
        assert f"events.jsonl is shorter than the daemon's end ({end - 10} < {end} bytes)" in (
            problem
        )
        assert "truncated" in problem
        assert "fsck" in problem
        path.write_bytes(data + b"extra\n")  # same inode, written by someone else
        problem = log.verify()
        assert problem is not None
        assert "longer than the daemon's end" in problem
        path.write_bytes(data)
        assert log.verify() is None
        mine = path.stat().st_ino
        copy = path.with_name("copy")
        copy.write_bytes(data)
        os.rename(copy, path)
        problem = log.verify()
        assert problem is not None
        assert f"replaced (inode {path.stat().st_ino}, the daemon appended to {mine})" in problem
        path.unlink()
        problem = log.verify()
        assert problem is not None
        assert "is gone" in problem
        await log.close()

    arun(go())


def test_a_broken_line_since_the_last_check_is_named_by_its_seq_and_stays_reported(
    state_dir: Path,
) -> None:
    async def go() -> None:
        store = FileStore(state_dir)
        log = await _open(store)
        assert log.verify() is None
        at = log.position.offset
        records = await log.append_many(tool_call("c2"))
        with open(store.log_path("s"), "r+b") as f:
            line = store.log_path("s").read_bytes()[at:].split(b"\n")[0]
            f.seek(at + line.index(b"tool.intent"))
            f.write(b"T")
        problem = log.verify()
        assert problem is not None
        assert f"the line at seq {records[0]['seq']}" in problem
        assert "fails its checksum" in problem
        problem = log.verify()  # not forgotten at the next gate
        assert problem is not None
        assert f"seq {records[0]['seq']}" in problem
        await log.close()

    arun(go())


# --- the artifact hash cache -------------------------------------------------------


class CountingRead:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fd: int, size: int) -> bytes:
        self.calls += 1
        return os.read(fd, size)


def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    path = tmp_path / "a"
    path.write_bytes(b"evidence")
    read = CountingRead()
    cache = HashCache(read=read, clock=lambda: time.time_ns() + LATER)
    first = cache.sha256(str(path))
    reads = read.calls
    assert reads > 0
    for _ in range(5):
        assert cache.sha256(str(path)) == first
    assert read.calls == reads


def test_a_changed_file_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "a"
    path.write_bytes(b"evidence")
    read = CountingRead()
    cache = HashCache(read=read, clock=lambda: time.time_ns() + LATER)
    digest, _ = cache.sha256(str(path))
    reads = read.calls
    st = path.stat()
    with open(path, "r+b") as f:  # same size, same inode
        f.write(b"EVIDENCE")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: ctime moves
    changed, size = cache.sha256(str(path))
    assert read.calls > reads
    assert changed != digest
    assert size == 8
    path.write_bytes(b"longer evidence")
    assert cache.sha256(str(path))[1] == 15


def test_a_hash_taken_right_after_a_change_is_not_trusted_later(tmp_path: Path) -> None:
    """File times tick coarsely: a write just after hashing could leave them equal."""
    path = tmp_path / "a"
    path.write_bytes(b"evidence")
    changed = max(path.stat().st_mtime_ns, path.stat().st_ctime_ns)
    now = {"ns": changed + RACY_NS // 2}
    read = CountingRead()
    cache = HashCache(read=read, clock=lambda: now["ns"])
    cache.sha256(str(path))
    reads = read.calls
    cache.sha256(str(path))
    assert read.calls > reads  # too fresh to remember: read again
    now["ns"] = changed + RACY_NS
    cache.sha256(str(path))
    reads = read.calls
    cache.sha256(str(path))
    assert read.calls == reads


def test_a_symlink_is_never_followed_and_a_missing_file_says_so(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"not an artifact")
    (tmp_path / "link").symlink_to(target)
    cache = HashCache()
    with pytest.raises(NotRegularFile):
        cache.sha256(str(tmp_path / "link"))
    with pytest.raises(FileNotFoundError):
        cache.sha256(str(tmp_path / "nothing"))


def test_the_cache_keeps_at_most_its_limit(tmp_path: Path) -> None:
    read = CountingRead()
    cache = HashCache(read=read, clock=lambda: time.time_ns() + LATER, limit=2)
    for name in "abc":
        (tmp_path / name).write_bytes(name.encode())
        cache.sha256(str(tmp_path / name))
    reads = read.calls
    cache.sha256(str(tmp_path / "c"))
    assert read.calls == reads
    cache.sha256(str(tmp_path / "a"))  # the oldest went
    assert read.calls > reads


def test_a_stored_artifact_is_verified_by_its_hash(state_dir: Path) -> None:
    store = FileStore(state_dir)
    arun(_open(store, "s"))
    artifacts = store.artifacts("s")
    ref = artifacts.put(b"output", "stdout").ref
    assert artifacts.verify(ref) is None
    path = state_dir / "sessions" / "s" / "artifacts" / ref[7:]
    path.write_bytes(b"OUTPUT")
    problem = artifacts.verify(ref)
    assert problem is not None
    assert problem.startswith("changed: the file now holds 6 bytes that hash to sha256:")
    path.unlink()
    assert artifacts.verify(ref) == f"missing: there is no file artifacts/{ref[7:]}"
    assert "not an artifact reference" in (artifacts.verify("sha256:nope") or "")


# --- durability "os": the periodic sync ---------------------------------------------


def test_os_mode_syncs_what_was_written_within_sync_interval(state_dir: Path) -> None:
    fsyncs: list[int] = []

    async def go() -> None:
        await (await FileStore(state_dir).create("s")).close()
        loop = asyncio.get_running_loop()
        covered: asyncio.Future[int] = loop.create_future()
        target = {"offset": 1 << 62}

        def settle(offset: int) -> None:
            if not covered.done():
                covered.set_result(offset)

        def synced(session: str, offset: int) -> None:
            if offset >= target["offset"]:
                loop.call_soon_threadsafe(settle, offset)

        def fsync(fd: int) -> None:
            fsyncs.append(fd)
            os.fsync(fd)

        store = FileStore(state_dir, hooks=IOHooks(fsync=fsync, synced=synced), sync_interval=0.05)
        log = await store.open_log("s", durability="os")
        list(log.recover())
        fsyncs.clear()
        await log.append_many(tool_call("c1"))
        assert fsyncs == []  # acknowledged after the write, without waiting for the disk
        target["offset"] = log.position.offset
        assert await asyncio.wait_for(covered, 30) >= log.position.offset
        assert log.synced_offset == log.position.offset
        assert len(fsyncs) == 1  # one sync for the whole interval's writes
        await log.close()

    arun(go())


def test_os_mode_syncs_at_close_what_the_timer_had_not_yet(state_dir: Path) -> None:
    async def go() -> None:
        await (await FileStore(state_dir).create("s")).close()
        store = FileStore(state_dir, sync_interval=3600)
        log = await store.open_log("s", durability="os")
        list(log.recover())
        await log.append_many(tool_call("c1"))
        assert log.synced_offset < log.position.offset
        await log.close()
        assert log.synced_offset == log.position.offset

    arun(go())
