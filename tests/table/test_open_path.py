"""A session's opening, as the start-up does it 10,000 times: what its cheaper path
keeps (the same state from a snapshot, the whole of a file read, one writer per
log, no cyclic garbage for the start-up's collector to find)."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

import orjson
import pytest

from sessiond.config import DaemonConfig
from sessiond.errors import LogLocked
from sessiond.log.event_data import MessageReceived
from sessiond.log.journal import Journal
from sessiond.log.replay import replay
from sessiond.log.state import State
from sessiond.log.store.durable import read_regular
from sessiond.log.store.files import FileStore
from sessiond.table.sessions import Table
from tests.helpers import arun
from tests.table.test_index import row


def test_a_snapshots_state_is_the_same_by_position_as_by_name() -> None:
    state = State(session="a", seq=7, labels={"k": "v"}, children=["b"], runs=3)
    data = orjson.loads(orjson.dumps(state.to_dict()))
    assert State.from_dict(data) == state
    backwards = dict(reversed(list(data.items())))  # another order: still by name
    assert State.from_dict(backwards) == state
    fewer = {k: v for k, v in data.items() if k != "runs"}  # an older snapshot
    assert State.from_dict(fewer) == State(**{**fewer})
    swapped = {**fewer, "bogus": 1}  # as many keys as fields, one unknown
    assert len(swapped) == len(data)
    with pytest.raises(ValueError, match=r"unknown fields.*bogus"):
        State.from_dict(swapped)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, (1 << 20) + 3])
def test_a_regular_file_is_read_whole(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    data = os.urandom(size)
    path.write_bytes(data)
    assert read_regular(path) == data
    assert read_regular(str(path)) == data


def sessions(tmp_path: Path, count: int) -> FileStore:
    """``count`` sessions with a snapshot and a few events after it."""
    store = FileStore(tmp_path)

    async def make() -> None:
        for i in range(count):
            name = f"s{i}"
            await (await store.create(name, spec=f'name = "{name}"\n')).close()
            journal = await Journal.open(store, name)
            for n in range(3):
                await journal.append(MessageReceived(sender="x", text=str(n)))
            await journal.snapshot()
            await journal.append(MessageReceived(sender="x", text="after"))
            await journal.close()

    arun(make())
    return store


def table(tmp_path: Path, store: FileStore) -> Table:
    return Table(DaemonConfig(state_dir=tmp_path, socket=tmp_path / "s.sock"), store)


def test_opening_sessions_leaves_no_cyclic_garbage(tmp_path: Path) -> None:
    """The daemon freezes what the background load made without collecting it
    first (sessiond.daemon.opening.young_frozen): opening makes no cycles."""
    store = sessions(tmp_path, 8)
    names = store.names()

    async def load() -> list[int]:
        t = table(tmp_path, store)
        found = []
        gc.collect()
        gc.disable()
        try:
            t.pending = {name: row(name) for name in names}
            await t.open_pending()
            found.append(gc.collect())
        finally:
            gc.enable()
        assert sorted(t.sessions) == names
        # from the snapshot (3 events) and the one after it
        assert [s.journal.state.seq for s in t] == [4] * len(names)
        assert {s.journal.from_snapshot for s in t} == {3}
        for s in t:
            await s.journal.close()
        return found

    assert arun(load()) == [0]


def test_a_session_opened_by_one_table_is_refused_to_another(tmp_path: Path) -> None:
    """One writer per log: the lock is still taken at the opening."""
    store = sessions(tmp_path, 1)

    async def go() -> None:
        first = await table(tmp_path, store).open_session("s0")
        assert first.journal_or_none is not None
        with pytest.raises(LogLocked, match="another writer"):
            await table(tmp_path, FileStore(tmp_path)).open_session("s0")
        await first.journal.close()

    arun(go())


def test_a_request_during_the_load_waits_for_its_session(tmp_path: Path) -> None:
    """The background load opens sessions in its own task; a request naming one
    it is opening (or has not reached) gets it opened once, and in the table."""
    store = sessions(tmp_path, 6)
    names = store.names()

    async def go() -> None:
        t = table(tmp_path, store)
        t.pending = {name: row(name) for name in names}
        opened: list[str] = []
        t.opened = lambda s: opened.append(s.name)
        load = asyncio.ensure_future(t.open_pending())
        await asyncio.gather(t.ensure(names[-1]), t.ensure(names[0]), load)
        assert sorted(opened) == names  # each once
        assert sorted(t.sessions) == names
        assert not t.pending
        for s in t:
            await s.journal.close()

    arun(go())


def test_a_snapshot_hint_is_read_first_and_the_log_still_wins(tmp_path: Path) -> None:
    """The index's seq for a session (``FileStore.snapshot_hints``) names the
    snapshot its opening reads, without listing the folder; a hint with no
    snapshot there falls back to the newest one listed; whatever the snapshot,
    the state is the log's."""
    store = sessions(tmp_path, 1)  # a snapshot at seq 3, the log at 4

    async def opened(hint: int | None) -> tuple[int | None, State]:
        if hint is not None:
            store.snapshot_hints["s0"] = hint
        journal = await Journal.open(store, "s0")
        await journal.close()
        assert "s0" not in store.snapshot_hints  # used once
        return journal.from_snapshot, journal.state

    async def go() -> None:
        assert await opened(None) == (3, truth_at(store))
        # a second snapshot, at the log's end (4): the hint's
        journal = await Journal.open(store, "s0")
        journal.snapshot_every = 1
        await journal.append(MessageReceived(sender="x", text="five"))  # snapshot at 5
        await journal.close()
        assert store.snapshots("s0").seqs() == [3, 5]
        assert await opened(5) == (5, truth_at(store))
        assert await opened(3) == (3, truth_at(store))  # an older one: as good a start
        assert await opened(4) == (5, truth_at(store))  # none there: the newest listed

    arun(go())


def truth_at(store: FileStore) -> State:
    """The state the whole log folds to."""
    state = State(session="s0")
    replay(list(store.read("s0")), state)
    return state


def test_a_last_pending_session_another_writer_holds_ends_the_load(tmp_path: Path) -> None:
    """A session another writer holds (a cluster's other node) leaves the pending
    list unopened; if it was the last one, what waits for every session
    (``ensure_all``: gc, the console's rows) goes on rather than waiting forever."""
    store = sessions(tmp_path, 2)
    names = store.names()

    async def go() -> None:
        other = await table(tmp_path, FileStore(tmp_path)).open_session(names[-1])
        t = table(tmp_path, store)
        t.pending = {name: row(name) for name in names}
        t.set_ready()
        await t.ensure(names[0])
        assert not t.loaded.is_set()
        await t.ensure(names[-1])  # held by the other: left unopened, off the list
        assert not t.pending
        await asyncio.wait_for(t.ensure_all(), timeout=60)
        assert t.loaded.is_set()
        assert not t.loading
        for s in t:
            await s.journal.close()
        await other.journal.close()

    arun(go())
