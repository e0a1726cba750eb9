"""`sessiond fsck`, run as the real console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiond.log.event_data import RunFinished
from sessiond.log.journal import Journal
from sessiond.log.store.files import FileStore
from tests.helpers import arun, tool_call

SESSIOND = Path(sys.executable).with_name("sessiond")


def fsck(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SESSIOND), "fsck", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def fsck_json(state_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = fsck(state_dir, "--json", *args)
    return done.returncode, orjson.loads(done.stdout)


@pytest.fixture
def populated(state_dir: Path) -> FileStore:
    store = FileStore(state_dir)

    async def go() -> None:
        for name in ("alpha", "beta"):
            await (await store.create(name)).close()
            journal = await Journal.open(store, name, snapshot_every=4)
            for i in range(3):
                await journal.append_many(tool_call(f"c{i}"))
            ref = store.artifacts(name).put(f"{name} output".encode(), "stdout")
            await journal.append(RunFinished(run="r1", status="ok", stdout=ref))
            await journal.close()

    arun(go())
    return store


def test_a_healthy_state_dir_passes(populated: FileStore, state_dir: Path) -> None:
    done = fsck(state_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""
    assert "2 sessions, 32 events, 2 artifacts checked; 0 problem(s)" in done.stderr
    code, report = fsck_json(state_dir)
    assert code == 0
    assert report["ok"] is True
    assert report["problems"] == []


def test_a_torn_tail_is_reported_and_repaired(populated: FileStore, state_dir: Path) -> None:
    with open(populated.log_path("alpha"), "ab") as f:
        f.write(b'{"v":1,"sess')
    done = fsck(state_dir)
    assert done.returncode == 1
    assert "alpha: torn-tail: 12 bytes after seq 16" in done.stdout
    assert "repairable with --repair" in done.stdout

    done = fsck(state_dir, "--repair")
    assert done.returncode == 0, done.stdout
    assert "(repaired)" in done.stdout
    last = list(populated.read("alpha"))[-1]
    assert last["type"] == "log.repaired"
    assert last["data"]["dropped_bytes"] == 12
    assert fsck(state_dir).returncode == 0


def test_corruption_in_the_middle_is_reported_never_cut(
    populated: FileStore, state_dir: Path
) -> None:
    path = populated.log_path("beta")
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"c1"') + 1] = ord("X")
    path.write_bytes(bytes(raw))
    code, report = fsck_json(state_dir, "--repair")
    assert code == 1
    (problem,) = report["problems"]
    assert problem["session"] == "beta"
    assert problem["kind"] == "corrupt-line"
    assert "line 6" in problem["detail"]
    assert problem["repaired"] is False
    assert path.read_bytes() == bytes(raw)


def test_artifacts_snapshots_and_modes_are_checked(populated: FileStore, state_dir: Path) -> None:
    artifacts = populated.artifacts("alpha")
    (digest,) = artifacts.digests()
    (artifacts.folder / digest).write_bytes(b"tampered")
    snaps = populated.snapshots("beta")
    seq = snaps.seqs()[-1]
    snap = snaps.load(seq)
    assert snap is not None
    snap.state["runs"] = 99
    snaps.save(snap)
    os.chmod(populated.log_path("beta"), 0o644)
    code, report = fsck_json(state_dir)
    assert code == 1
    kinds = {(p["session"], p["kind"]) for p in report["problems"]}
    assert kinds == {
        ("alpha", "artifact-corrupt"),
        ("beta", "snapshot-mismatch"),
        ("beta", "permissions"),
    }
    code, report = fsck_json(state_dir, "--repair")
    assert code == 1  # the corrupt artifact needs a backup
    fixed = {p["kind"] for p in report["problems"] if p["repaired"]}
    assert fixed == {"snapshot-mismatch", "permissions"}
    assert os.stat(populated.log_path("beta")).st_mode & 0o777 == 0o600


def test_a_missing_artifact_is_reported(populated: FileStore, state_dir: Path) -> None:
    artifacts = populated.artifacts("beta")
    (digest,) = artifacts.digests()
    (artifacts.folder / digest).unlink()
    code, report = fsck_json(state_dir)
    assert code == 1
    assert [p["kind"] for p in report["problems"]] == ["artifact-missing"]


def test_fsck_refuses_a_path_that_is_no_folder(tmp_path: Path) -> None:
    done = fsck(tmp_path / "nope")
    assert done.returncode == 2
    assert "is not a folder" in done.stderr


def test_repair_leaves_a_log_held_by_a_running_writer_alone(
    populated: FileStore, state_dir: Path
) -> None:
    with open(populated.log_path("alpha"), "ab") as f:
        f.write(b"torn")

    async def hold_and_check() -> subprocess.CompletedProcess[str]:
        log = await populated.open_log("alpha")  # a "daemon" holds the writer lock
        try:
            return fsck(state_dir, "--repair")
        finally:
            await log.close()

    done = arun(hold_and_check())
    assert done.returncode == 1
    assert "not repaired: the log is open by a running daemon" in done.stdout


def test_a_planted_symlink_is_a_problem_not_a_crash(
    populated: FileStore, state_dir: Path, tmp_path: Path
) -> None:
    log = populated.log_path("alpha")
    target = tmp_path / "elsewhere.jsonl"
    log.rename(target)
    log.symlink_to(target)
    code, report = fsck_json(state_dir)
    assert code == 1
    assert [(p["session"], p["kind"]) for p in report["problems"]] == [("alpha", "unreadable")]


def test_a_folder_left_by_an_interrupted_create_is_deleted_by_repair(
    populated: FileStore, state_dir: Path
) -> None:
    leftover = state_dir / "sessions" / ".new-fork-1-0a1b2c3d"
    (leftover / "artifacts").mkdir(parents=True)
    (leftover / "events.jsonl").write_bytes(b"half a copy")
    code, report = fsck_json(state_dir)
    assert code == 1
    assert report["problems"][0]["kind"] == "leftover"
    assert "--repair deletes it" in report["problems"][0]["detail"]
    code, report = fsck_json(state_dir, "--repair")
    assert code == 0
    assert report["problems"][0]["repaired"] is True
    assert not leftover.exists()
    assert populated.names() == ["alpha", "beta"]  # the real sessions are untouched
