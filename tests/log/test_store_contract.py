"""The storage contract: every backend (files, memory, PostgreSQL) must pass all of these."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sessiond.codec import encode_line
from sessiond.errors import (
    AlreadyExists,
    ArtifactMissing,
    BadArtifactRef,
    BadName,
    LogLocked,
    NoSuchSession,
)
from sessiond.log.event_data import LifecycleChanged, MessageReceived
from sessiond.log.store.base import START, LogPosition, PositionMismatch, Snapshot, Store
from sessiond.log.store.files import FileStore
from sessiond.log.store.memory import MemoryStore
from tests.helpers import arun, tool_call

Factory = Callable[[Path], Store]
BACKENDS: dict[str, Factory] = {
    "files": FileStore,
    "memory": lambda root: MemoryStore(),
}


@pytest.fixture(params=[*sorted(BACKENDS), "postgres"])
def store(request: pytest.FixtureRequest, state_dir: Path) -> Iterator[Store]:
    if request.param != "postgres":
        yield BACKENDS[request.param](state_dir)
        return
    # A real server (tests/pgserver.py), a database of its own, one node.
    from sessiond.log.store.pg.pgstore import PgStore

    pg = PgStore(request.getfixturevalue("pg_dsn"), node="n1", lease_ttl=60)
    try:
        yield pg
    finally:
        pg.close_sync()


def test_a_new_session_has_an_empty_log_and_its_spec(store: Store) -> None:
    async def go() -> None:
        log = await store.create("alpha", spec="name = 'alpha'\n")
        assert log.position == START
        await log.close()

    arun(go())
    assert store.names() == ["alpha"]
    assert store.exists("alpha")
    assert not store.exists("beta")
    assert store.read_spec("alpha") == "name = 'alpha'\n"
    assert list(store.read("alpha")) == []


def test_appends_assign_seqs_one_by_one_without_gaps(store: Store) -> None:
    async def go() -> list[int]:
        log = await store.create("alpha")
        first = await log.append(LifecycleChanged(to="ready"))
        batch = await log.append_many(tool_call("c1"))
        last = await log.append(MessageReceived(sender="bob", text="hi"), causation=first["id"])
        await log.close()
        assert last["causation"] == first["id"]
        assert all(r["correlation"] == "c1" for r in batch)
        return [first["seq"], *(r["seq"] for r in batch), last["seq"]]

    assert arun(go()) == [1, 2, 3, 4, 5, 6, 7]
    records = list(store.read("alpha"))
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert all(r["session"] == "alpha" for r in records)
    assert len({r["id"] for r in records}) == 7


def test_reads_filter_by_seq(store: Store) -> None:
    async def go() -> None:
        log = await store.create("alpha")
        await log.append_many(tool_call("c1") + tool_call("c2"))
        await log.close()

    arun(go())
    assert [r["seq"] for r in store.read("alpha", since=4, upto=7)] == [4, 5, 6, 7]
    lines = list(store.read_lines("alpha", upto=3))
    assert len(lines) == 3
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for _, line in lines)


def test_reopening_recovers_every_event_and_continues_the_seqs(store: Store) -> None:
    async def go() -> list[int]:
        log = await store.create("alpha")
        await log.append_many(tool_call("c1"))
        await log.close()
        log = await store.open_log("alpha")
        seen = [r["seq"] for r in log.recover()]
        record = await log.append(LifecycleChanged(to="sleeping"))
        await log.close()
        return [*seen, record["seq"]]

    assert arun(go()) == [1, 2, 3, 4, 5, 6]


def test_recovery_can_start_after_a_known_position(store: Store) -> None:
    async def go() -> None:
        log = await store.create("alpha")
        await log.append_many(tool_call("c1"))
        middle = log.position
        await log.append_many(tool_call("c2"))
        await log.close()
        log = await store.open_log("alpha")
        assert [r["seq"] for r in log.recover(middle)] == [6, 7, 8, 9, 10]
        assert log.position.seq == 10
        await log.close()

        log = await store.open_log("alpha")
        wrong = LogPosition(middle.seq, middle.offset, "f" * 32)
        with pytest.raises(PositionMismatch):
            list(log.recover(wrong))
        await log.close()

    arun(go())


def test_one_writer_per_log(store: Store) -> None:
    async def go() -> None:
        log = await store.create("alpha")
        with pytest.raises(LogLocked, match="another writer"):
            await store.open_log("alpha")
        await log.close()
        again = await store.open_log("alpha")  # free once closed
        await again.close()

    arun(go())


def test_appending_before_recovery_is_a_programming_error(store: Store) -> None:
    async def go() -> None:
        log = await store.create("alpha")
        await log.close()
        log = await store.open_log("alpha")
        with pytest.raises(RuntimeError, match="recover"):
            await log.append(LifecycleChanged(to="ready"))
        await log.close()

    arun(go())


def test_names_are_checked_and_unique(store: Store) -> None:
    async def go() -> None:
        await (await store.create("alpha")).close()
        with pytest.raises(AlreadyExists, match="exists already"):
            await store.create("alpha")
        for bad in ["", "Alpha", "../x", ".hidden", "a/b", "x" * 65, "-dash"]:
            with pytest.raises(BadName, match="not allowed"):
                await store.create(bad)

    arun(go())
    with pytest.raises(NoSuchSession):
        list(store.read("nobody"))
    with pytest.raises(NoSuchSession):
        arun(store.open_log("nobody"))


def test_a_session_can_start_with_copied_lines(store: Store) -> None:
    async def go() -> None:
        source = await store.create("alpha")
        await source.append_many(tool_call("c1"))
        await source.close()
        lines = [line for _, line in store.read_lines("alpha")]
        copy = await store.create("beta", lines=lines, artifacts=[b"evidence"])
        assert copy.position.seq == 5
        record = await copy.append(LifecycleChanged(to="ready"))
        assert record["seq"] == 6
        assert record["session"] == "beta"
        await copy.close()
        assert [line for _, line in store.read_lines("beta", upto=5)] == lines
        digest = hashlib.sha256(b"evidence").hexdigest()
        assert store.artifacts("beta").get(f"sha256:{digest}") == b"evidence"

    arun(go())


def test_artifacts_are_content_addressed_and_verified(store: Store) -> None:
    arun(_create(store, "alpha"))
    artifacts = store.artifacts("alpha")
    ref = artifacts.put(b"hello world", "stdout", "text/plain")
    assert ref.ref.startswith("sha256:")
    assert len(ref.ref) == 71
    assert (ref.name, ref.size, ref.media_type) == ("stdout", 11, "text/plain")
    assert artifacts.put(b"hello world", "again").ref == ref.ref  # idempotent
    assert artifacts.get(ref.ref) == b"hello world"
    assert artifacts.has(ref.ref)
    assert artifacts.digests() == [ref.digest]
    missing = "sha256:" + "0" * 64
    assert not artifacts.has(missing)
    with pytest.raises(ArtifactMissing, match="missing"):
        artifacts.get(missing)
    for bad in ["sha256:../../etc/passwd", "/etc/passwd", "sha256:" + "A" * 64, "md5:00"]:
        with pytest.raises(BadArtifactRef, match="sha256"):
            artifacts.get(bad)


def test_put_many_stores_each_as_put_would_repeats_included(store: Store) -> None:
    arun(_create(store, "alpha"))
    artifacts = store.artifacts("alpha")
    first = artifacts.put(b"already there", "old", "text/plain")
    items = [(b"already there", "again", "text/plain"), (b"new", "n", "text/plain")]
    refs = artifacts.put_many([*items, (b"new", "twice", "application/json")])
    assert refs[0].ref == first.ref
    assert [r.name for r in refs] == ["again", "n", "twice"]
    assert refs[1].ref == refs[2].ref == artifacts.put(b"new", "n", "text/plain").ref
    assert artifacts.get(refs[1].ref) == b"new"
    assert sorted(artifacts.digests()) == sorted({first.digest, refs[1].digest})


def test_the_gate_checks_verify_stored_artifacts_and_an_untouched_log(store: Store) -> None:
    async def go() -> None:
        log = await store.create("alpha")
        await log.append_many(tool_call("c1"))
        assert log.verify() is None  # nothing changed behind the writer's back
        await log.close()

    arun(go())
    artifacts = store.artifacts("alpha")
    ref = artifacts.put(b"hello world", "stdout").ref
    missing = "sha256:" + "0" * 64
    assert artifacts.verify(ref) is None
    problems = artifacts.verify_many([ref, missing, "sha256:../../etc/passwd"])
    assert sorted(problems) == sorted([missing, "sha256:../../etc/passwd"])
    assert "missing" in problems[missing]
    assert "sha256" in problems["sha256:../../etc/passwd"]


def test_snapshots_keep_the_newest_and_filter_by_reducer(store: Store) -> None:
    arun(_create(store, "alpha"))
    snaps = store.snapshots("alpha")
    assert snaps.latest(1) is None
    for seq in (10, 20, 30):
        snaps.save(Snapshot(1, "alpha", LogPosition(seq, seq * 100, "a" * 32), {"seq": seq}))
    assert snaps.seqs() == [20, 30]  # two kept
    latest = snaps.latest(1)
    assert latest is not None
    assert latest.position == LogPosition(30, 3000, "a" * 32)
    assert latest.state == {"seq": 30}
    assert snaps.latest(2) is None  # another reducer's snapshots are ignored
    assert snaps.load(20) is not None
    assert snaps.load(25) is None
    snaps.clear()
    assert snaps.seqs() == []


def test_specs_can_be_replaced(store: Store) -> None:
    arun(_create(store, "alpha"))
    store.write_spec("alpha", "name = 'alpha'\ngoal = 'new'\n")
    assert store.read_spec("alpha") == "name = 'alpha'\ngoal = 'new'\n"


def test_lines_written_are_the_framed_records(store: Store) -> None:
    async def go() -> None:
        log = await store.create("alpha")
        record = await log.append(LifecycleChanged(to="ready"))
        await log.close()
        ((read, line),) = list(store.read_lines("alpha"))
        assert read == record
        assert line == encode_line(record)

    arun(go())


async def _create(store: Store, name: str) -> None:
    await (await store.create(name)).close()


def test_a_gc_sees_each_artifact_and_snapshot_with_its_size_and_removes_them(
    store: Store,
) -> None:
    if isinstance(store, MemoryStore):
        pytest.skip("the memory store (tests only) has no gc")

    async def go() -> None:
        await (await store.create("alpha")).close()

    arun(go())
    artifacts = store.artifacts("alpha")
    before = time.time()
    kept, gone = artifacts.put(b"kept", "k").ref, artifacts.put(b"going", "g").ref
    stats = artifacts.stats()
    assert {ref: size for ref, (size, _at) in stats.items()} == {kept: 4, gone: 5}
    assert all(abs(at - before) < 60 for _size, at in stats.values())  # when stored
    artifacts.remove([gone])
    assert artifacts.digests() == [kept[7:]]
    assert not artifacts.has(gone)
    snapshots = store.snapshots("alpha")
    for seq in (3, 5):
        snapshots.save(Snapshot(1, "alpha", LogPosition(seq, seq, f"id{seq}"), {"seq": seq}))
    sizes = snapshots.sizes()
    assert sorted(sizes) == [3, 5]
    assert all(size > 0 for size in sizes.values())
    snapshots.drop(3)
    assert snapshots.seqs() == [5]
