"""Forking: the child's log starts with the parent's events unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiond.errors import AlreadyExists, InvalidInput
from sessiond.log.event_data import MessageReceived, RunFinished
from sessiond.log.journal import Journal
from sessiond.log.lineage import fork
from sessiond.log.store.files import FileStore
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


def test_only_typed_fields_are_taken_for_artifact_references() -> None:
    from typing import get_args

    from pydantic import BaseModel, JsonValue

    from sessiond.log.event_data import PAYLOAD_BY_TYPE, ArtifactRef
    from sessiond.log.evidence import FREE_FORM
    from sessiond.log.lineage import artifact_refs

    def mentions(annotation: object, target: object) -> bool:
        if annotation is target:
            return True
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return any(mentions(f.annotation, target) for f in annotation.model_fields.values())
        return any(mentions(a, target) for a in get_args(annotation))

    # Every field that may hold any JSON is skipped, and none that may hold a reference.
    for model in PAYLOAD_BY_TYPE.values():
        for name, field in model.model_fields.items():
            assert mentions(field.annotation, JsonValue) == (name in FREE_FORM), (model, name)
            assert not (name in FREE_FORM and mentions(field.annotation, ArtifactRef))
    fake = {"ref": "sha256:" + "0" * 64, "name": "x", "size": 1}
    real = {"ref": "sha256:" + "1" * 64, "name": "out", "size": 1}
    data = {"call": "c1", "args": {"quoted": fake}, "output": real}
    assert list(artifact_refs(data)) == [real["ref"]]
