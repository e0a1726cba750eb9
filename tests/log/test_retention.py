"""Chunked contexts (sessiond.log.chunks), what a gc plans (sessiond.log.retention)
and what fsck says after one, on a real file store."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiond.config import RetentionConfig
from sessiond.errors import ArtifactCorrupt
from sessiond.log.chunks import CHUNK_THRESHOLD, CHUNKED_MEDIA, cut, parts, put_context
from sessiond.log.chunks import read_context as read_back
from sessiond.log.event_data import (
    ArtifactRef,
    CollectedArtifact,
    GcCollected,
    LifecycleChanged,
    ModelRequested,
    ModelResponded,
    RunFinished,
)
from sessiond.log.evidence import Evidence
from sessiond.log.fsck import check
from sessiond.log.journal import Journal
from sessiond.log.retention import FRESH, Plan, needed, plan, remove
from sessiond.log.store.fileartifacts import FileArtifacts
from sessiond.log.store.files import FileStore
from tests.helpers import arun


def conversation(n: int, size: int = 900) -> bytes:
    history = [{"role": "user", "content": f"{i}:" + "x" * size} for i in range(n)]
    return orjson.dumps({"model": "m", "messages": history, "tools": [{"name": "t"}]})


def test_a_small_context_is_stored_whole(tmp_path: Path) -> None:
    files = FileArtifacts(tmp_path)
    ref = put_context(files, b'{"messages":[]}', "context.json")
    assert ref.media_type == "application/json"
    assert files.get(ref.ref) == b'{"messages":[]}'


def test_contexts_that_share_a_history_share_its_chunks(tmp_path: Path) -> None:
    files = FileArtifacts(tmp_path)
    refs = [put_context(files, conversation(n), "context.json") for n in range(20, 60)]
    assert {r.media_type for r in refs} == {CHUNKED_MEDIA}
    for n, ref in zip(range(20, 60), refs, strict=True):
        assert read_back(files, ref) == conversation(n)
    whole = sum(len(conversation(n)) for n in range(20, 60))
    stored = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert stored < whole / 5  # the new history and one partial chunk a call


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=0, max_size=3 * CHUNK_THRESHOLD), st.integers(0, 50))
def test_any_bytes_cut_and_join_back_exactly(data: bytes, repeat: int) -> None:
    data = data + b"},{" * repeat + data
    assert b"".join(cut(data)) == data


def test_a_chunk_that_does_not_match_its_manifest_is_corruption(tmp_path: Path) -> None:
    files = FileArtifacts(tmp_path)
    ref = put_context(files, conversation(40), "context.json")
    manifest = orjson.loads(files.get(ref.ref))
    manifest["sha256"] = "0" * 64
    forged = files.put(orjson.dumps(manifest), "context.json", CHUNKED_MEDIA)
    with pytest.raises(ArtifactCorrupt):
        read_back(files, forged)


# --- planning a gc ---------------------------------------------------------------------


def _ref(files: FileArtifacts, data: bytes, name: str = "out") -> ArtifactRef:
    return files.put(data, name, "text/plain")


def _old(files: FileArtifacts, seconds: float = 2 * FRESH) -> None:
    for path in files.folder.iterdir():
        st = path.stat()
        os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


def _session(store: FileStore, name: str, terminate: bool) -> tuple[Journal, dict[str, str]]:
    """Two finished model calls on a long shared history, three runs' output, then
    (maybe) the end: what each artifact is, by name."""
    files = store.artifacts(name)

    async def go() -> tuple[Journal, dict[str, str]]:
        await (await store.create(name)).close()
        j = await Journal.open(store, name)
        names: dict[str, str] = {}
        for i, n in enumerate((40, 41)):
            ctx = put_context(files, conversation(n), "context.json")
            names[f"context{i}"] = ctx.ref
            await j.append(ModelRequested(model="m", request_id=f"q{i}", context=ctx))
            resp = files.put(b'{"say":"ok %d"}' % i, "response.json")
            names[f"response{i}"] = resp.ref
            await j.append(ModelResponded(model="m", request_id=f"q{i}", response=resp))
        for i in range(3):
            out = _ref(files, f"run {i} output".encode(), "stdout")
            names[f"stdout{i}"] = out.ref
            await j.append(RunFinished(run=f"r{i}", status="ok", stdout=out))
        if terminate:
            await j.append(LifecycleChanged(to="terminated", outcome="completed"))
        return j, names

    return arun(go())


def _plan(store: FileStore, j: Journal, rules: RetentionConfig, days: float = 0.0) -> Plan:
    evidence = Evidence().add_all(store.read(j.session))
    now = datetime.now(UTC) + timedelta(days=days)
    files = store.artifacts(j.session)
    return plan(
        j.session,
        needed(j.state, evidence, files),
        j.state.state != "terminated",
        evidence,
        store.artifacts(j.session),
        store.snapshots(j.session),
        rules,
        now,
        time.time(),
    )


def test_a_terminated_session_keeps_its_evidence_until_its_age(state_dir: Path) -> None:
    store = FileStore(state_dir)
    j, names = _session(store, "done", terminate=True)
    rules = RetentionConfig(terminated=86400)
    assert not _plan(store, j, rules)  # ended just now
    p = _plan(store, j, rules, days=2)
    gone = {r.ref for r in p.artifacts}
    # everything but the last run's output (what show and a fork of it need)
    assert names["stdout2"] not in gone
    assert {names["stdout0"], names["context0"], names["response1"]} <= gone
    assert gone | {names["stdout2"]} == {f"sha256:{d}" for d in store.artifacts("done").digests()}
    arun(j.close())


def test_keep_artifacts_keeps_the_newest_and_a_shared_chunk_stays_with_its_kept_context(
    state_dir: Path,
) -> None:
    store = FileStore(state_dir)
    j, names = _session(store, "live", terminate=False)
    files = store.artifacts("live")
    _old(files)
    p = _plan(store, j, RetentionConfig(keep_artifacts=3))
    gone = {r.ref: r.rule for r in p.artifacts}
    # newest three by the event naming them: stdout2 is needed anyway (the last run),
    # so the three kept are stdout1, stdout0 and response1
    assert names["context1"] in gone
    assert names["context0"] in gone
    assert names["response0"] in gone
    assert names["stdout0"] not in gone
    assert names["response1"] not in gone
    # Both contexts go here, and with them all their chunks:
    parts0 = set(parts(files, names["context0"]))
    assert parts0 <= gone.keys()
    # With one context kept, the chunks it shares with the other one stay.
    p = _plan(store, j, RetentionConfig(keep_artifacts=5))
    gone = {r.ref: r.rule for r in p.artifacts}
    assert names["context0"] in gone
    assert names["context1"] not in gone
    parts1 = set(parts(files, names["context1"]))
    assert gone.keys().isdisjoint(parts1)
    assert {ref for ref, rule in gone.items() if rule == "chunk"} == parts0 - parts1
    arun(j.close())


def test_a_live_sessions_fresh_files_and_what_its_gate_needs_are_never_planned(
    state_dir: Path,
) -> None:
    store = FileStore(state_dir)
    j, names = _session(store, "live", terminate=False)
    files = store.artifacts("live")
    stray = files.put(b"no event names me", "stray")
    assert not _plan(store, j, RetentionConfig(keep_artifacts=0, unreferenced=0))  # all fresh
    _old(files)
    p = _plan(store, j, RetentionConfig(keep_artifacts=0, unreferenced=0))
    gone = {r.ref: r.rule for r in p.artifacts}
    assert gone[stray.ref] == "unreferenced"
    assert names["stdout2"] not in gone  # the last run's output: the gate checks it
    # A context in use again is fresh again (put touches it), so it stays.
    put_context(files, conversation(41), "context.json")
    p = _plan(store, j, RetentionConfig(keep_artifacts=0))
    assert names["context1"] not in {r.ref for r in p.artifacts}
    arun(j.close())


def test_fsck_calls_an_artifact_a_gc_recorded_collected_not_missing(state_dir: Path) -> None:
    store = FileStore(state_dir)
    j, _names = _session(store, "done", terminate=True)
    p = _plan(store, j, RetentionConfig(terminated=0))
    gone = p.artifacts
    assert gone
    # Removed without a record: fsck reports damage.
    files = store.artifacts("done")
    victim = gone[0]
    data = files.get(victim.ref)
    (files.folder / victim.ref[7:]).unlink()
    report = check(state_dir)
    assert not report.ok
    files.put(data, "restored")
    # Recorded first, then removed (what the daemon's gc does): fsck is content.
    record = GcCollected(
        artifacts=tuple(CollectedArtifact(artifact=r.ref, size=r.size, rule=r.rule) for r in gone),
        bytes=p.bytes,
    )
    arun(j.append(record))
    remove(files, store.snapshots("done"), p)
    arun(j.close())
    report = check(state_dir)
    assert report.ok, [pr.line() for pr in report.problems]
    # the references events make: two contexts, two responses, two runs' output (the
    # contexts' chunks are named by their manifests only)
    assert report.collected == 6
