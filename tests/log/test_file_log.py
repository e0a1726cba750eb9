"""The files backend under crashes and failures: torn tails, corruption, group
commit, full disks, failed fsyncs, permissions and planted symlinks."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiond.errors import ArtifactCorrupt, LogCorrupt, LogFailed, StorageError, StorageFull
from sessiond.log.event_data import LifecycleChanged, MessageReceived
from sessiond.log.journal import Journal
from sessiond.log.store.base import START, PositionMismatch, Record
from sessiond.log.store.durable import write_all
from sessiond.log.store.files import FileStore, IOHooks
from tests.helpers import arun, tool_call


def _write_session(store: FileStore, name: str, calls: int) -> list[Record]:
    async def go() -> list[Record]:
        log = await store.create(name)
        records: list[Record] = []
        for i in range(calls):
            records += await log.append_many(tool_call(f"c{i}"))
            records.append(await log.append(MessageReceived(sender="x", text="é" * i)))
        await log.close()
        return records

    return arun(go())


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[Record]]:
    store = FileStore(tmp_path_factory.mktemp("written"))
    records = _write_session(store, "src", 4)
    return store.log_path("src").read_bytes(), records


def _session_with_bytes(root: Path, data: bytes) -> FileStore:
    store = FileStore(root)
    arun(_create(store))
    store.log_path("s").write_bytes(data)
    return store


async def _create(store: FileStore) -> None:
    await (await store.create("s")).close()


@given(st.data())
def test_a_log_cut_at_any_byte_reopens_as_an_exact_prefix(
    tmp_path_factory: pytest.TempPathFactory,
    written: tuple[bytes, list[Record]],
    data: st.DataObject,
) -> None:
    raw, records = written
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    store = _session_with_bytes(tmp_path_factory.mktemp("cut"), raw[:cut])
    whole_lines = raw[:cut].count(b"\n")

    journal = arun(Journal.open(store, "s", use_snapshots=False))
    try:
        kept = list(store.read("s", upto=whole_lines))
        assert kept == records[:whole_lines]  # never a wrong or partial event
        if raw[:cut].endswith(b"\n") or cut == 0:
            assert journal.state.repairs == []
            assert journal.state.seq == whole_lines
        else:
            (repair,) = journal.state.repairs
            assert repair["dropped_bytes"] == cut - raw.rfind(b"\n", 0, cut) - 1
            assert repair["last_good_seq"] == whole_lines
            assert journal.state.seq == whole_lines + 1  # the log.repaired event
    finally:
        arun(journal.close())


@given(st.data())
def test_any_flipped_byte_in_a_middle_line_is_reported_as_corruption(
    tmp_path_factory: pytest.TempPathFactory,
    written: tuple[bytes, list[Record]],
    data: st.DataObject,
) -> None:
    raw, _ = written
    last_line_start = raw.rfind(b"\n", 0, len(raw) - 1) + 1
    index = data.draw(st.integers(0, last_line_start - 1), label="index")
    flip = data.draw(st.integers(1, 255), label="xor")
    damaged = bytearray(raw)
    damaged[index] ^= flip
    line = raw.count(b"\n", 0, index) + 1
    store = _session_with_bytes(tmp_path_factory.mktemp("flip"), bytes(damaged))

    with pytest.raises(LogCorrupt) as caught:
        arun(Journal.open(store, "s"))
    assert caught.value.line == line
    assert f"line {line}" in str(caught.value)
    with pytest.raises(LogCorrupt):
        list(store.read("s"))
    assert store.log_path("s").read_bytes() == bytes(damaged)  # nothing cut, nothing appended


def test_a_corrupt_log_takes_no_appends(state_dir: Path) -> None:
    store = FileStore(state_dir)
    _write_session(store, "s", 2)
    path = store.log_path("s")
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0x01
    path.write_bytes(bytes(raw))

    async def go() -> None:
        log = await store.open_log("s")
        with pytest.raises(LogCorrupt, match=r"line 1 .*fsck"):
            list(log.recover())
        with pytest.raises(RuntimeError):
            await log.append(LifecycleChanged(to="ready"))
        await log.close()

    arun(go())
    assert path.read_bytes() == bytes(raw)


def test_a_duplicated_line_breaks_seq_order_and_is_corruption(state_dir: Path) -> None:
    store = FileStore(state_dir)
    _write_session(store, "s", 2)
    path = store.log_path("s")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([*lines[:3], lines[2], *lines[3:]]))
    with pytest.raises(LogCorrupt, match="seq 3 where 4 was expected"):
        list(store.read("s"))


def test_trailing_garbage_after_a_crash_is_cut_as_a_torn_tail(state_dir: Path) -> None:
    store = FileStore(state_dir)
    records = _write_session(store, "s", 1)
    path = store.log_path("s")
    good = path.read_bytes()
    path.write_bytes(good + b"\0" * 300 + b"\n" + b"\0" * 20)  # zero-filled blocks

    journal = arun(Journal.open(store, "s"))
    assert journal.state.repairs[0]["dropped_bytes"] == 321
    arun(journal.close())
    assert list(store.read("s", upto=len(records))) == records


def test_group_commit_shares_one_fsync_among_concurrent_appends(state_dir: Path) -> None:
    calls = 0

    def slow_fsync(fd: int) -> None:
        nonlocal calls
        calls += 1
        os.fsync(fd)

    store = FileStore(state_dir, hooks=IOHooks(fsync=slow_fsync))

    async def go() -> None:
        log = await store.create("s")
        calls_before = calls
        results = await asyncio.gather(
            *(log.append(MessageReceived(sender="w", text=str(i))) for i in range(200))
        )
        assert sorted(r["seq"] for r in results) == list(range(1, 201))
        assert calls - calls_before <= 2  # 200 appends, one (at most two) fsyncs
        batch_before = calls
        await log.append_many(tool_call("c1"))  # a batch: one write, one fsync
        assert calls - batch_before == 1
        assert log.synced_offset == log.position.offset == os.path.getsize(store.log_path("s"))
        await log.close()

    arun(go())


def test_an_append_is_acknowledged_only_after_its_fsync(state_dir: Path) -> None:
    release = threading.Event()
    entered = threading.Event()

    def gated_fsync(fd: int) -> None:
        entered.set()
        release.wait(10)
        os.fsync(fd)

    store = FileStore(state_dir, hooks=IOHooks(fsync=gated_fsync))

    async def go() -> None:
        log = await store.create("s")
        append = asyncio.ensure_future(log.append(LifecycleChanged(to="ready")))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
        await asyncio.sleep(0.05)
        assert not append.done()  # written, not yet durable: not acknowledged
        release.set()
        record = await asyncio.wait_for(append, 10)
        assert record["seq"] == 1
        await log.close()

    arun(go())


def test_a_log_keeps_group_committing_after_its_store_is_gone(state_dir: Path) -> None:
    import gc

    async def go() -> None:
        await (await FileStore(state_dir).create("s")).close()
        log = await FileStore(state_dir).open_log("s")  # nothing else holds that store
        list(log.recover())
        gc.collect()
        appends = [log.append(LifecycleChanged(to="ready")) for _ in range(3)]
        records = await asyncio.gather(*appends)
        assert [r["seq"] for r in records] == [1, 2, 3]
        assert log.synced_offset == log.position.offset
        await log.close()

    arun(go())


def test_mode_os_acknowledges_after_the_write(state_dir: Path) -> None:
    fsyncs: list[int] = []
    store = FileStore(state_dir)

    async def go() -> None:
        await (await store.create("s")).close()
        log = await FileStore(state_dir, hooks=IOHooks(fsync=fsyncs.append)).open_log(
            "s", durability="os"
        )
        list(log.recover())
        fsyncs.clear()
        await log.append_many(tool_call("c1"))
        assert fsyncs == []  # not waited for: the sync comes within sync_interval
        assert len(list(store.read("s"))) == 5
        await log.close()

    arun(go())


def test_a_full_disk_keeps_the_log_whole_and_usable(state_dir: Path) -> None:
    fail = {"on": False}

    def half_then_enospc(fd: int, data: bytes) -> None:
        if fail["on"]:
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        write_all(fd, data)

    store = FileStore(state_dir, hooks=IOHooks(write=half_then_enospc))

    async def go() -> None:
        log = await store.create("s")
        await log.append_many(tool_call("c1"))
        size = os.path.getsize(store.log_path("s"))
        fail["on"] = True
        with pytest.raises(StorageFull, match=r"no space left.*Free space"):
            await log.append_many(tool_call("c2"))
        assert os.path.getsize(store.log_path("s")) == size  # the half write was cut
        fail["on"] = False
        record = await log.append(LifecycleChanged(to="blocked", reason="disk full"))
        assert record["seq"] == 6
        await log.close()

    arun(go())
    assert [r["seq"] for r in store.read("s")] == [1, 2, 3, 4, 5, 6]


def test_a_failed_fsync_fails_the_log_for_good(state_dir: Path) -> None:
    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def go() -> None:
        await (await FileStore(state_dir).create("s")).close()
        log = await FileStore(state_dir, hooks=IOHooks(fsync=broken_fsync)).open_log("s")
        list(log.recover())
        with pytest.raises(LogFailed, match="fsync failed"):
            await log.append(LifecycleChanged(to="ready"))
        with pytest.raises(LogFailed, match="takes no appends"):
            await log.append(LifecycleChanged(to="ready"))
        await log.close()

    arun(go())


def test_everything_in_the_state_dir_is_owner_only(state_dir: Path) -> None:
    store = FileStore(state_dir)
    _write_session(store, "s", 1)
    store.artifacts("s").put(b"evidence", "out")
    store.write_spec("s", "name='s'\n")
    journal = arun(Journal.open(store, "s", snapshot_every=1))
    arun(journal.append(LifecycleChanged(to="ready")))
    arun(journal.close())
    seen = 0
    for root, dirs, files in os.walk(state_dir / "sessions"):
        for d in dirs:
            assert stat.S_IMODE(os.stat(Path(root) / d).st_mode) == 0o700
            seen += 1
        for f in files:
            assert stat.S_IMODE(os.stat(Path(root) / f).st_mode) == 0o600, f
            seen += 1
    assert seen >= 7  # session, artifacts, snapshots folders; log, spec, artifact, snapshot


def test_planted_symlinks_are_refused(state_dir: Path, tmp_path: Path) -> None:
    store = FileStore(state_dir)
    _write_session(store, "s", 1)
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    artifacts = store.artifacts("s")
    digest = "0" * 64
    (artifacts.folder / digest).symlink_to(outside)
    with pytest.raises(ArtifactCorrupt, match="cannot be read safely"):
        artifacts.get(f"sha256:{digest}")

    folder = artifacts.folder
    os.rename(folder, tmp_path / "real-artifacts")
    folder.symlink_to(tmp_path / "real-artifacts")
    with pytest.raises(StorageError, match="symbolic link"):
        artifacts.put(b"x", "x")


def test_a_corrupt_artifact_is_detected_on_read(state_dir: Path) -> None:
    store = FileStore(state_dir)
    _write_session(store, "s", 1)
    ref = store.artifacts("s").put(b"evidence", "out")
    (store.artifacts("s").folder / ref.digest).write_bytes(b"tampered")
    with pytest.raises(ArtifactCorrupt, match="does not match its hash"):
        store.artifacts("s").get(ref.ref)


def test_an_interrupted_create_leaves_no_session(state_dir: Path) -> None:
    store = FileStore(state_dir)

    def bad_lines() -> Any:
        yield b"x"
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        arun(store.create("s", lines=bad_lines()))
    assert store.names() == []
    assert os.listdir(store.sessions_dir) == []


def test_a_bad_last_line_that_is_complete_is_corruption_not_a_tear(state_dir: Path) -> None:
    store = FileStore(state_dir)
    _write_session(store, "s", 1)
    path = store.log_path("s")
    lines = path.read_bytes().splitlines(keepends=True)
    flipped = bytearray(lines[-1])
    flipped[20] ^= 0x04
    for damaged in (b"".join([*lines[:-1], bytes(flipped)]), b"".join([*lines, lines[-1]])):
        path.write_bytes(damaged)
        with pytest.raises(LogCorrupt):
            list(store.read("s"))
        with pytest.raises(LogCorrupt):
            arun(Journal.open(store, "s"))
        assert path.read_bytes() == damaged  # never cut


def test_zeroed_blocks_of_an_unfinished_batch_are_cut_with_what_follows(state_dir: Path) -> None:
    store = FileStore(state_dir)
    records = _write_session(store, "s", 2)
    path = store.log_path("s")
    raw = path.read_bytes()
    keep = raw.index(b"\n", len(raw) // 2) + 1  # a complete prefix
    kept_lines = raw[:keep].count(b"\n")
    # A power cut lost the first block of the next batch but kept a later one.
    damaged = raw[:keep] + b"\0" * 512 + raw[keep + 512 :]
    path.write_bytes(damaged)
    journal = arun(Journal.open(store, "s"))
    assert journal.state.repairs[0]["dropped_bytes"] == len(damaged) - keep
    arun(journal.close())
    assert list(store.read("s", upto=kept_lines)) == records[:kept_lines]


def test_the_repair_is_recorded_in_the_same_durable_step_as_the_cut(state_dir: Path) -> None:
    store = FileStore(state_dir)
    _write_session(store, "s", 1)
    with open(store.log_path("s"), "ab") as f:
        f.write(b'{"v":1,"torn')

    async def open_and_crash() -> None:
        log = await store.open_log("s")
        list(log.recover())  # cut and recorded; then the process "dies": no close, no append
        os.close(log._fd)

    arun(open_and_crash())
    last = list(store.read("s"))[-1]
    assert last["type"] == "log.repaired"
    assert last["data"]["dropped_bytes"] == 12


def test_an_append_racing_close_is_refused_clearly_never_left_hanging(state_dir: Path) -> None:
    store = FileStore(state_dir)

    async def go() -> None:
        log = await store.create("s")
        first = asyncio.ensure_future(log.append(LifecycleChanged(to="ready")))
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(log.close())
        await asyncio.sleep(0)
        with pytest.raises(LogFailed, match="is closed"):
            await log.append(LifecycleChanged(to="sleeping"))
        await asyncio.wait_for(asyncio.gather(first, closing), 10)
        assert first.result()["seq"] == 1

    arun(go())
    assert [r["seq"] for r in store.read("s")] == [1]


def test_snapshots_never_run_ahead_of_what_is_durable(state_dir: Path) -> None:
    import time

    def slow_fsync(fd: int) -> None:
        time.sleep(0.01)
        os.fsync(fd)

    store = FileStore(state_dir, hooks=IOHooks(fsync=slow_fsync))

    async def go() -> None:
        await (await store.create("s")).close()
        journal = await Journal.open(store, "s", snapshot_every=3)
        saved: list[tuple[int, int]] = []
        original = journal.snapshots.save

        def spy(snapshot: Any) -> None:
            saved.append((snapshot.position.offset, journal.log.synced_offset))  # type: ignore[attr-defined]
            original(snapshot)

        journal.snapshots.save = spy  # type: ignore[method-assign]
        await asyncio.gather(
            *(journal.append(MessageReceived(sender="w", text=str(i))) for i in range(60))
        )
        await journal.close()
        assert saved
        assert all(offset <= synced for offset, synced in saved)

    arun(go())


def test_a_checksummed_line_that_is_not_an_event_object_is_corruption(state_dir: Path) -> None:
    from sessiond.codec import frame

    store = FileStore(state_dir)
    _write_session(store, "s", 1)
    path = store.log_path("s")
    lines = path.read_bytes().splitlines(keepends=True)
    for odd in (frame(b"[1,2]"), frame(b'{"no":"seq"}'), frame(b'"text"')):
        path.write_bytes(b"".join([lines[0], odd, *lines[1:]]))
        with pytest.raises(LogCorrupt, match="line 2"):
            list(store.read("s"))


def test_read_after_a_position_reads_only_what_follows_and_knows_a_replaced_log(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    records = _write_session(store, "s", 3)
    every = list(store.read_after("s", START))
    assert [r for r, _ in every] == records
    assert every[-1][1].offset == store.log_path("s").stat().st_size
    middle = every[2][1]
    assert [r for r, _ in store.read_after("s", middle)] == records[3:]
    assert list(store.read_after("s", every[-1][1])) == []  # nothing new
    # The log replaced by another (an import): the position no longer names its event.
    _write_session(store, "t", 3)
    store.log_path("s").write_bytes(store.log_path("t").read_bytes())
    with pytest.raises(PositionMismatch):
        list(store.read_after("s", middle))
