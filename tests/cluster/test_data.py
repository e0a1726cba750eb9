"""Export, import, fork and fsck on a real node on a real PostgreSQL, and bundles
crossing between the backends both ways (docs/design.md section 10: "the same
bundle format")."""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from sessiond.codec import encode_line, unframe
from sessiond.log.pgfsck import check_db
from sessiond.log.store.base import Snapshot
from sessiond.log.store.pg.pgparts import PgSnapshots
from sessiond.log.store.pg.pgstore import PgStore
from tests.cluster.test_node import DONE
from tests.e2e.harness import SESSIOND, Daemon, running, short_dir, wait_event


@pytest.fixture
def node(pg_dsn: str) -> Iterator[Daemon]:
    root = short_dir()
    daemon = Daemon(root, f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n1"\nlease_ttl = "3s"\n')
    try:
        yield daemon.start()
    finally:
        daemon.reap()
        shutil.rmtree(root, ignore_errors=True)


def _members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(bundle.read_bytes()))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def _pg_lines(dsn: str, name: str) -> list[bytes]:
    reader = PgStore(dsn, node="reader")
    try:
        return [line for _record, line in reader.read_lines(name)]
    finally:
        reader.close_sync()


def _epochs_rise(records: list[dict[str, Any]]) -> None:
    """Along the seqs, the epoch never decreases (events a files daemon wrote carry
    none); the last event, the cluster's, carries one."""
    epochs = [r["epoch"] for r in records if r.get("epoch") is not None]
    assert isinstance(records[-1].get("epoch"), int)
    assert epochs == sorted(epochs), epochs


def _fsck(dsn: str, *more: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [SESSIOND, "fsck", "--dsn", dsn, "--json", *more], capture_output=True, check=False
    )
    assert done.stdout, done.stderr
    return done.returncode, orjson.loads(done.stdout)


def _done(d: Daemon, name: str) -> None:
    d.ctl("activate", name, check=True)
    wait_event(d, name, "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")


def test_a_bundle_crosses_from_the_cluster_to_files_and_back_in_one_format(
    node: Daemon, pg_dsn: str, tmp_path: Path
) -> None:
    node.ctl("create", str(node.write_spec("job", DONE)), check=True)
    _done(node, "job")
    first = tmp_path / "from-cluster.bundle"
    node.ctl("export", "job", "-o", str(first), check=True)
    original = _members(first)
    lines = original["events.jsonl"].splitlines(keepends=True)
    assert any(m.startswith("artifacts/") for m in original)  # the run's diff comes along

    with running() as files:  # a daemon on plain files
        files.ctl("import", str(first), "--as", "moved", check=True)
        on_disk = (files.state_dir / "sessions" / "moved" / "events.jsonl").read_bytes()
        assert on_disk.splitlines(keepends=True)[: len(lines)] == lines  # verbatim
        assert files.json("show", "moved")["state"] == "terminated"
        second = tmp_path / "from-files.bundle"
        files.ctl("export", "moved", "-o", str(second), check=True)
        files.stop()
        fsck = subprocess.run(
            [SESSIOND, "fsck", "--state-dir", str(files.state_dir)],
            capture_output=True,
            check=False,
        )
        assert fsck.returncode == 0, fsck.stderr
    back = _members(second)
    assert sorted(back) == sorted(original)  # the same members, artifacts and all
    for member in original:
        if member.startswith("artifacts/"):
            assert back[member] == original[member]
    assert back["spec.toml"] == original["spec.toml"].replace(b'"job"', b'"moved"')
    manifests = [orjson.loads(m["manifest.json"]) for m in (original, back)]
    assert [sorted(m) for m in manifests] == [sorted(manifests[0])] * 2
    assert {(m["format"], m["version"]) for m in manifests} == {("sessiond-bundle", 1)}

    node.ctl("import", str(second), "--as", "home", check=True)
    stored = _pg_lines(pg_dsn, "home")
    assert stored[: len(lines)] == lines  # the cluster's own lines, byte for byte
    records = node.json("log", "home")
    assert [r["type"] for r in records[-2:]] == ["session.imported", "session.imported"]
    assert records[-1]["node"] == "n1"  # the arrival names its writer, as every event
    _epochs_rise(records)
    assert node.json("replay", "home")["seq"] == len(records)
    for view in ("messages", "trace", "audit"):  # every view, from the database
        shown = node.ctl("replay", "home", "--view", view, check=True).stdout
        assert shown.strip() or view == "messages", view
    assert "session.imported" in node.ctl("replay", "home", "--view", "trace").stdout
    code, report = _fsck(pg_dsn)
    assert (code, report["ok"], report["problems"]) == (0, True, [])
    assert report["sessions"] == 2
    assert report["events"] == len(lines) + len(records)
    assert report["artifacts"] >= 2


def test_a_fork_or_import_of_a_session_claimed_many_times_keeps_its_epochs_rising(
    node: Daemon, pg_dsn: str, tmp_path: Path
) -> None:
    node.ctl("create", str(node.write_spec("job", DONE)), check=True)
    for _ in range(3):  # each start claims it under a new epoch
        node.kill9()
        node.start()
    _done(node, "job")
    assert node.json("log", "job")[-1]["epoch"] >= 4
    node.ctl("fork", "job", "--as", "child", check=True)
    bundle = tmp_path / "job.bundle"
    node.ctl("export", "job", "-o", str(bundle), check=True)
    node.ctl("import", str(bundle), "--as", "copy", check=True)
    node.ctl("fork", "child", "--as", "grandchild", check=True)
    node.kill9()  # claimed again, above the epochs it copied
    node.start()
    _done(node, "grandchild")  # a fork runs on, under the new claim
    for name in ("child", "grandchild", "copy"):
        _epochs_rise(node.json("log", name))
    code, report = _fsck(pg_dsn)
    assert (code, report["problems"]) == (0, [])


def test_fsck_of_the_database_finds_gaps_stale_epochs_missing_artifacts_and_bad_snapshots(
    node: Daemon, pg_dsn: str
) -> None:
    node.ctl("create", str(node.write_spec("job", DONE)), check=True)
    _done(node, "job")
    node.stop()  # a clean stop saves the snapshots
    code, report = _fsck(pg_dsn)
    assert (code, report["ok"]) == (0, True), report
    load = PgSnapshots.load

    def pruned_meanwhile(self: PgSnapshots, seq: int) -> Snapshot | None:
        self.drop(seq)  # as a live node keeping its newest few does, after the listing
        return load(self, seq)

    with pytest.MonkeyPatch.context() as patch:  # the campaign found this race
        patch.setattr(PgSnapshots, "load", pruned_meanwhile)
        assert check_db(pg_dsn).problems == []
    node.start()  # the snapshot again, for what follows
    node.stop()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM snapshots").fetchone() == (1,)
        conn.execute("UPDATE snapshots SET state = '{\"seq\": 1}'::bytea")
        conn.execute("DELETE FROM session_artifacts")
    code, report = _fsck(pg_dsn)
    assert code == 1
    assert sorted(p["kind"] for p in report["problems"]) == [
        "artifact-missing", "snapshot-mismatch"
    ], report["problems"]  # fmt: skip
    code, report = _fsck(pg_dsn, "--repair")
    repaired = [p["kind"] for p in report["problems"] if p["repaired"]]
    assert repaired == ["snapshot-mismatch"]  # a lost artifact is never "repaired"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM snapshots").fetchone() == (0,)
        conn.execute("DELETE FROM events WHERE session = 'job' AND seq = 5")
        (raw,) = conn.execute("SELECT line FROM events WHERE seq = 7").fetchall()
        torn = bytes(raw[0]).replace(b'"', b"'", 1)
        conn.execute("UPDATE events SET line = %s WHERE seq = 7", (torn,))
        (row,) = conn.execute("SELECT line FROM events WHERE seq = 12").fetchall()
        stale = {**orjson.loads(unframe(bytes(row[0])) or b""), "epoch": 1}  # below 2
        conn.execute("UPDATE events SET line = %s WHERE seq = 12", (encode_line(stale)[:-1],))
        conn.execute("UPDATE sessions SET last_seq = 15")  # two beyond what was written
    code, report = _fsck(pg_dsn)
    assert code == 1
    details = [(p["kind"], p["detail"].split(";")[0]) for p in report["problems"]]
    assert details[:4] == [
        ("seq-gap", "seq 5 missing from the log"),
        ("corrupt-line", "seq 7 fails its checksum"),
        ("epoch-decreased", "seq 12 was written under epoch 1 after epoch 2: a stale "
         "owner's write got through its fence"),
        ("seq-gap", "seqs 14..15 missing from the log"),
    ], details  # fmt: skip
    assert [p["kind"] for p in report["problems"][4:]] == ["artifact-missing"]


def test_fsck_takes_a_state_dir_or_a_database_not_both() -> None:
    both = subprocess.run(
        [SESSIOND, "fsck", "--dsn", "x", "--state-dir", "/tmp"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr


def test_gc_on_a_cluster_node_removes_from_the_database_what_retention_says(
    pg_dsn: str, tmp_path: Path
) -> None:
    root = short_dir()
    config = (
        f'[cluster]\ndsn = "{pg_dsn}"\nnode = "n1"\nlease_ttl = "3s"\n'
        '[retention]\nterminated = "0s"\nsnapshots = 1\n'
    )
    d = Daemon(root, config)
    try:
        d.start()
        d.ctl("create", str(d.write_spec("job", DONE)), check=True)
        _done(d, "job")
        d.ctl("fork", "job", "--as", "child", check=True)  # shares the run's diff
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            (digest,) = conn.execute(
                "SELECT digest FROM session_artifacts WHERE session = 'job'"
            ).fetchone() or ("",)
        planned = d.json("gc", "--dry-run")
        assert planned["artifacts"] == 1
        done = d.json("gc")
        assert [(s["name"], len(s["artifacts"])) for s in done["sessions"]] == [("job", 1)]
        assert done["sessions"][0]["artifacts"][0]["ref"] == f"sha256:{digest}"
        assert done["bytes"] > 0
        (collected,) = [r for r in d.json("log", "job") if r["type"] == "gc.collected"]
        assert collected["node"] == "n1"
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            held = conn.execute("SELECT session FROM session_artifacts").fetchall()
            assert held == [("child",)]  # the fork still holds it: the bytes stay
            assert conn.execute("SELECT count(*) FROM artifacts").fetchone() == (1,)
        assert d.json("gc")["artifacts"] == 0  # nothing more to do
        code, report = _fsck(pg_dsn)
        assert (code, report["problems"], report["collected"]) == (0, [], 1)
        bundle = tmp_path / "job.bundle"
        d.ctl("export", "job", "-o", str(bundle), check=True)
        assert not [m for m in _members(bundle) if m.startswith("artifacts/")]
        d.ctl("cancel", "child", check=True)  # terminated now: its artifacts go too
        assert d.json("gc")["artifacts"] == 1
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM artifacts").fetchone() == (0,)
    finally:
        d.reap()
        shutil.rmtree(root, ignore_errors=True)


def test_fsck_of_the_database_reports_events_whose_session_row_is_missing(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # no foreign key stops it (schema step 5): only the fence does, for nodes
        conn.execute(
            "INSERT INTO events (session, seq, id, line) VALUES "
            "('ghost', 1, 'a', 'x'), ('ghost', 2, 'b', 'y')"
        )
    code, report = _fsck(pg_dsn)
    assert (code, report["ok"], report["events"]) == (1, False, 2)
    [problem] = report["problems"]
    assert (problem["session"], problem["kind"], problem["repairable"]) == (
        "ghost", "orphan-events", False
    ), problem  # fmt: skip
    assert problem["detail"].startswith("2 events (seqs 1..2) belong to no session")
