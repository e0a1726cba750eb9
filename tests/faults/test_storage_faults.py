"""Storage faults against the real daemon: a full disk in the middle of a run, a
state dir it cannot write, and a power cut (each log cut back to what was fsynced).

The faults are injected through the daemon's test-only keys (sessiond/daemon/faults.py):
a test running as root cannot make a folder unwritable with permission bits, and
filling a real disk is not something a test suite should do to its machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sessiond.log.fsck import check
from tests.e2e.harness import SESSIOND, Daemon, running, short_dir, wait_event, wait_for

JOB = """name = "job"
[run]
exec = ["sh", "-c", "echo ran >> out.txt; while [ ! -e go ]; do sleep 0.02; done; echo done"]
cwd = "."
writes = ["out.txt"]
idempotency = "unsafe"
resume = "require-user-confirmation"
retries = 0
"""


def test_a_full_disk_during_a_run_blocks_the_session_and_keeps_the_log(tmp_path: Path) -> None:
    full = tmp_path / "disk-is-full"
    with running(f'fault_full_disk = "{full}"\n') as d:
        d.ctl("create", str(d.write_spec("job", JOB)), check=True)
        d.ctl("create", str(d.write_spec("notes", 'name = "notes"\n')), check=True)
        d.ctl("activate", "job", check=True)
        wait_event(d, "job", "run.started")
        log = d.state_dir / "sessions" / "job" / "events.jsonl"
        before = log.read_bytes()
        full.touch()  # from now on every log write fails with ENOSPC
        (d.root / "go").touch()  # the program ends; its end cannot be recorded
        shown = wait_for(
            lambda: (s := d.json("show", "job"))["state"] == "blocked" and s,
            what="job blocked",
        )
        assert shown["held"] is True
        assert "no space left on the device" in shown["reason"]
        assert shown["reason"].endswith("(not recorded yet)")
        assert shown["pid"] is None  # blocked, not `running` with no program
        assert log.read_bytes() == before  # nothing partial was written
        refused = d.ctl("send", "notes", "hello")
        assert refused.returncode != 0
        assert "no space left on the device" in refused.stderr  # says what and what to do
        refused = d.ctl("resolve", "job", "--accept")
        assert "is blocked" in refused.stderr
        assert "records the block" in refused.stderr
        assert d.json("ping")["sessions"] == 2  # still serving
        full.unlink()  # space again: the daemon records the block by itself
        block = wait_event(
            d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert "could not be recorded" in block["data"]["reason"]
        assert log.read_bytes().startswith(before)
        assert d.json("show", "job")["held"] is False
        d.ctl("resolve", "job", "--accept", check=True)  # the program's work is kept as done
        d.ctl("send", "notes", "hello again", check=True)
        assert (d.root / "out.txt").read_text() == "ran\n"  # it ran once, never again
        d.stop()
        assert check(d.state_dir).ok


@pytest.mark.parametrize(("fault", "why"), [("EROFS", "read-only"), ("EACCES", "permission")])
def test_a_state_dir_it_cannot_write_stops_start_up_with_the_reason(
    tmp_path: Path, fault: str, why: str
) -> None:
    config = tmp_path / "sessiond.toml"
    config.write_text(f'fault_state_dir = "{fault}"\n')
    started = time.monotonic()
    done = subprocess.run(
        [
            SESSIOND,
            "--config",
            str(config),
            "--state-dir",
            str(tmp_path / "state"),
            "--socket",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert f"cannot write to the state dir {tmp_path / 'state'}" in done.stderr
    assert why in done.stderr
    assert "--state-dir" in done.stderr  # and what to do
    assert not (tmp_path / "s").exists()  # it never served
    assert time.monotonic() - started < 20


def test_a_create_cut_off_by_a_crash_leaves_nothing_after_the_restart() -> None:
    with running() as d:
        d.ctl("create", str(d.write_spec("notes", 'name = "notes"\n')), check=True)
        d.kill9()
        leftover = d.state_dir / "sessions" / ".new-side-0a1b2c3d"  # a fork cut off mid-copy
        (leftover / "snapshots").mkdir(parents=True)
        (leftover / "events.jsonl").write_bytes(b'{"v":1,"session":"no')
        d.start()
        assert not leftover.exists()
        assert any(line.get("event") == "leftover.removed" for line in d.lines)
        assert [row["name"] for row in d.json("ps")] == ["notes"]
        d.stop()
        assert check(d.state_dir).ok


def test_a_real_full_disk_on_a_small_tmpfs_blocks_the_run_and_keeps_the_log() -> None:
    """The same as the injected ENOSPC above, on a real 4 MB tmpfs (where the machine
    lets the test mount one: root with CAP_SYS_ADMIN)."""
    root = short_dir()
    state = root / "state"
    state.mkdir()
    mount = shutil.which("mount")
    mounted = (
        subprocess.run(
            [mount, "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(state)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mount is not None
        else None
    )
    if mounted is None or mounted.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        why = "no mount command" if mounted is None else mounted.stderr.strip() or "mount failed"
        pytest.skip(f"cannot mount a tmpfs here: {why}")
    d = Daemon(root)
    try:
        d.start()
        d.ctl("create", str(d.write_spec("job", JOB)), check=True)
        d.ctl("activate", "job", check=True)
        wait_event(d, "job", "run.started")
        log = d.state_dir / "sessions" / "job" / "events.jsonl"
        before = log.read_bytes()
        ballast = state / "ballast"
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # fill the file system to the last byte, in ever smaller writes
            for size in (65536, 4096, 1):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
        (root / "go").touch()  # the program ends; its end cannot be recorded
        shown = wait_for(
            lambda: (s := d.json("show", "job"))["state"] == "blocked" and s,
            what="job blocked",
        )
        after = log.read_bytes()
        assert after.startswith(before)  # what was acknowledged is kept whole
        if shown["held"]:  # nothing could be written: blocked in memory until space returns
            assert "no space left" in shown["reason"].lower()
            assert after == before  # nothing partial was kept
        # else the run's end (its output's files) could not be written, but the block
        # fitted in the free bytes of the log's last page (tmpfs gives whole pages):
        # recorded at once, which is as good; the injected ENOSPC above always holds
        assert d.json("ping")["sessions"] == 1
        ballast.unlink()  # space again
        block = wait_event(
            d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert "could not be recorded" in block["data"]["reason"]
        d.ctl("resolve", "job", "--accept", check=True)
        assert (root / "out.txt").read_text() == "ran\n"
        d.stop()
        assert check(d.state_dir).ok
    finally:
        d.reap()
        subprocess.run(["umount", str(state)], capture_output=True, check=False)  # mount has it
        shutil.rmtree(root, ignore_errors=True)
