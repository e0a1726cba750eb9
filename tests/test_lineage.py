"""Forking: the child's log starts with the parent's events unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.errors import AlreadyExists, InvalidInput
from sessiond.event_data import MessageReceived, RunFinished
from sessiond.journal import Journal
from sessiond.lineage import fork
from sessiond.store.files import FileStore
from tests.helpers import arun, tool_call


def test_a_fork_copies_events_one_to_n_unchanged_then_records_the_fork(state_dir: Path) -> None:
    store = FileStore(state_dir)
    store_ref = None

    async def go() -> None:
        nonlocal store_ref
        await (await store.create("parent", spec="name = 'parent'\n")).close()
        parent = await Journal.open(store, "parent")
        await parent.append_many(tool_call("c1"))
        store_ref = store.artifacts("parent").put(b"run output", "stdout")
        await parent.append(RunFinished(run="r1", status="ok", stdout=store_ref))
        await parent.append(MessageReceived(sender="u", text="after the fork point"))
        child = await fork(store, parent, "child", at_seq=6)
        assert child.state.parent == "parent"
        assert child.state.fork_seq == 6
        assert child.state.name == "child"
        assert parent.state.children == ["child"]
        await child.close()
        await parent.close()

    arun(go())
    parent_lines = [line for _, line in store.read_lines("parent")]
    child_lines = [line for _, line in store.read_lines("child")]
    assert child_lines[:6] == parent_lines[:6]  # byte for byte: same ids, seqs, session
    forked = list(store.read("child"))[6]
    assert forked["seq"] == 7
    assert forked["type"] == "session.forked"
    assert forked["session"] == "child"
    assert forked["data"]["at_seq"] == 6
    assert list(store.read("parent"))[-1]["type"] == "session.forked"
    assert store_ref is not None
    assert store.artifacts("child").get(store_ref.ref) == b"run output"  # resolves locally
    assert store.read_spec("child") == "name = 'parent'\n"


def test_a_fork_outside_the_log_or_onto_a_name_in_use_is_refused(state_dir: Path) -> None:
    store = FileStore(state_dir)

    async def go() -> None:
        await (await store.create("parent")).close()
        await (await store.create("taken")).close()
        parent = await Journal.open(store, "parent")
        await parent.append_many(tool_call("c1"))
        with pytest.raises(InvalidInput, match=r"events 1\.\.5"):
            await fork(store, parent, "child", at_seq=9)
        with pytest.raises(AlreadyExists):
            await fork(store, parent, "taken")
        await parent.close()

    arun(go())
    assert store.names() == ["parent", "taken"]
