"""The gate's storage checks are real (docs/design.md section 9): "log intact" notices a
log changed behind the daemon's back, "artifacts intact" an artifact whose bytes
changed; `durability = "os"` syncs each log within `sync_interval`.

Each test damages the state dir of a running daemon the way a person, a script
or a failing disk would, then asks the real `sessionctl gate` and wakes the
session with the real `sessionctl activate`: the program must not run again.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import orjson

from tests.e2e.harness import Daemon, running, wait_event, wait_for

JOB = """name = "job"
[run]
exec = ["sh", "-c", "echo output of the run"]
[[trigger]]
type = "message"
"""


def run_once(d: Daemon) -> dict[str, Any]:
    """Create the session, run it once to its sleep; the run.finished event."""
    d.ctl("create", str(d.write_spec("job", JOB)), check=True)
    d.ctl("activate", "job", check=True)
    finished = wait_event(d, "job", "run.finished")
    wait_event(
        d,
        "job",
        "lifecycle.changed",
        since=finished["seq"],
        match=lambda r: r["data"]["to"] == "sleeping",
    )
    return finished


def log_path(d: Daemon) -> Path:
    return d.state_dir / "sessions" / "job" / "events.jsonl"


def gate(d: Daemon) -> tuple[int, dict[str, Any]]:
    done = d.ctl("--json", "gate", "job")
    report: dict[str, Any] = orjson.loads(done.stdout)
    return done.returncode, report


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in report["checks"] if c["name"] == name)
    return found


def runs_started(d: Daemon) -> int:
    return int(d.json("show", "job")["runs"])


def assert_a_wake_does_not_run(d: Daemon, *words: str) -> None:
    """`activate` gates, finds the damage, blocks the session naming it; no new run."""
    before = runs_started(d)
    d.ctl("activate", "job")
    shown = d.json("show", "job")
    assert shown["state"] == "blocked", shown
    for word in words:
        assert word in shown["reason"], shown["reason"]
    assert shown["runs"] == before


def test_an_unchanged_session_gates_ok_also_after_restarts() -> None:
    with running() as d:
        run_once(d)
        for _ in range(2):  # the second gate checks only what the first did not
            code, report = gate(d)
            assert code == 0, report
            assert check(report, "log intact")["ok"]
            assert check(report, "artifacts intact")["ok"]
        assert d.stop() == 0
        d.start()
        code, report = gate(d)
        assert code == 0, report
        d.ctl("send", "job", "again", check=True)  # a message wakes it: gate, run
        wait_event(d, "job", "run.finished", match=lambda r: r["data"]["run"] == "r2")
        d.kill9()
        d.start()  # recovers from the log alone: its new end is what it read
        code, report = gate(d)
        assert code == 0, report
        assert check(report, "artifacts intact")["detail"].startswith("1 needed")  # r2's stdout


def test_an_overwritten_artifact_fails_the_gate_naming_it() -> None:
    with running() as d:
        finished = run_once(d)
        stdout = finished["data"]["stdout"]
        assert gate(d)[0] == 0
        artifact = d.state_dir / "sessions" / "job" / "artifacts" / stdout["ref"][7:]
        size = artifact.stat().st_size
        with open(artifact, "r+b") as f:  # same name, same inode, same size
            f.write(b"X" * size)
        code, report = gate(d)
        assert code == 1
        assert report["ok"] is False
        found = check(report, "artifacts intact")
        assert found["ok"] is False
        assert "stdout" in found["detail"]
        assert stdout["ref"] in found["detail"]
        assert "changed" in found["detail"]
        assert_a_wake_does_not_run(d, "artifacts intact", stdout["ref"])


def test_a_log_truncated_behind_the_daemon_fails_the_gate() -> None:
    with running() as d:
        run_once(d)
        path = log_path(d)
        data = path.read_bytes()
        cut = data.rstrip(b"\n").rfind(b"\n") + 1  # the last line goes
        os.truncate(path, cut)
        code, report = gate(d)
        assert code == 1
        detail = check(report, "log intact")["detail"]
        assert f"shorter than the daemon's end ({cut} < {len(data)} bytes): truncated" in detail
        assert "fsck" in detail
        assert_a_wake_does_not_run(d, "truncated")


def test_a_log_replaced_by_a_copy_fails_the_gate() -> None:
    with running() as d:
        run_once(d)
        path = log_path(d)
        appended_to = path.stat().st_ino
        copy = path.with_name("events.copy")
        copy.write_bytes(path.read_bytes())  # the very same bytes
        os.rename(copy, path)
        code, report = gate(d)
        assert code == 1
        detail = check(report, "log intact")["detail"]
        new = path.stat().st_ino
        assert f"events.jsonl was replaced (inode {new}, the daemon appended to {appended_to})" in (
            detail
        )
        assert_a_wake_does_not_run(d, "replaced")


def test_a_broken_line_in_the_middle_fails_the_gate() -> None:
    with running() as d:
        run_once(d)
        # The lines of the run came after the last gate (at the activate): the next
        # gate is the first to check them. Break one of them, not the last.
        started = d.json("log", "job", "--type", "tool.started")[0]
        path = log_path(d)
        data = path.read_bytes()
        lines = data.splitlines(keepends=True)
        at = sum(len(line) for line in lines[: started["seq"] - 1])
        line = lines[started["seq"] - 1]
        where = at + line.index(b'"tool.started"') + 1
        with open(path, "r+b") as f:
            f.seek(where)
            f.write(b"T")  # "Tool.started": one byte, same length
        code, report = gate(d)
        assert code == 1
        detail = check(report, "log intact")["detail"]
        assert f"the line at seq {started['seq']}" in detail
        assert "fails its checksum" in detail
        assert_a_wake_does_not_run(d, "checksum")


def test_os_durability_syncs_each_log_within_sync_interval() -> None:
    """In `os` mode an append is not waited for, but the log is synced within
    `sync_interval` (default 1 s): the test hook reports each synced offset."""
    with running() as d:
        synced = d.root / "synced"
        d.stop()
        d.config.write_text(
            d.config.read_text() + f'durability = "os"\nrecord_synced = "{synced}"\n'
        )
        d.start()
        run_once(d)
        end = log_path(d).stat().st_size

        def synced_to() -> int:
            offsets = [
                int(line.split()[1])
                for line in synced.read_text().splitlines()
                if line.split()[0] == "job"
            ]
            return max(offsets, default=0)

        # Bounded wait on what the daemon reports, not a sleep: the sync covers
        # every byte written before the session went to sleep.
        wait_for(lambda: synced_to() >= end, timeout=30, what=f"job synced to {end}")
        assert d.stop(signal.SIGTERM) == 0
