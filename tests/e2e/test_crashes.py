"""Crashes at exact points of a run (the test-only `fault` setting makes the daemon
SIGKILL itself there), for every risk contract: after the restart nothing with a
side effect is repeated blindly, unsafe work is blocked, safe work is run again,
missing observations are rebuilt, and no acknowledged event is lost."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sessiond.log.fsck import check
from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for

POINTS = [
    "before-intent",
    "after-intent",
    "after-policy",
    "after-started",
    "during-work",
    "after-finished",
]
CONTRACTS = {
    "safe/replay-from-event": ("safe", "replay-from-event"),
    "conditional/rerun-after-check": ("conditional", "rerun-after-check"),
    "unsafe/rerun-after-check": ("unsafe", "rerun-after-check"),
    "conditional/require-user-confirmation": ("conditional", "require-user-confirmation"),
    "conditional/never-rerun": ("conditional", "never-rerun"),
}
SPEC = """name = "job"
[run]
exec = ["sh", "-c", "echo ran >> out.txt; {tail}"]
cwd = "."
idempotency = "{idempotency}"
resume = "{resume}"
writes = ["out.txt"]
retries = 0
"""


def expected(point: str, idempotency: str, resume: str) -> tuple[str, int]:
    """(final state, times the program ran) that docs/design.md section 5 prescribes."""
    if point in ("before-intent", "after-intent", "after-policy"):
        return "terminated", 1  # it never started: the first (and only) run happens now
    if point == "after-started":  # started, never spawned: the written file is unchanged
        unsafe = idempotency == "unsafe" or resume in ("require-user-confirmation", "never-rerun")
        return ("blocked", 0) if unsafe else ("terminated", 1)
    if point == "during-work":  # the program wrote out.txt: its before-hash no longer holds
        return "blocked", 1
    return "terminated", 1  # after-finished: done; only the observation is rebuilt


def settle(d: Daemon) -> dict[str, Any]:
    return wait_event(
        d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] in ("terminated", "blocked")
    )


@pytest.mark.parametrize("contract", sorted(CONTRACTS))
@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_each_point_resumes_as_the_table_says(point: str, contract: str) -> None:
    idempotency, resume = CONTRACTS[contract]
    root = short_dir()
    try:
        d = Daemon(root, f'fault = "{point}"\n')
        d.start()
        # during-work: the daemon dies once the program has written (its first output)
        tail = "echo working; sleep 30" if point == "during-work" else "echo done"
        spec = d.write_spec("job", SPEC.format(tail=tail, idempotency=idempotency, resume=resume))
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "job")  # the daemon dies on the way
        assert d.proc is not None
        assert d.proc.wait(30) == -9
        out = root / "out.txt"
        if point == "during-work":
            # written before the daemon died (the fault waits for the first output;
            # the dead daemon's spawner then stops the program)
            wait_for(out.exists, timeout=30, what="the program to write out.txt")
        before = _log_lines(d)
        d.config.write_text('log_format = "json"\nstop_grace = "2s"\n')
        d.start()
        final = settle(d)
        state, runs = expected(point, idempotency, resume)
        assert final["data"]["to"] == state, final["data"]["reason"]
        assert (out.read_text().count("ran") if out.exists() else 0) == runs
        after = _log_lines(d)
        assert after[: len(before)] == before  # no acknowledged event lost
        log = d.json("log", "job")
        assert [r["seq"] for r in log] == list(range(1, len(log) + 1))
        if point == "after-finished":
            rebuilt = d.json("log", "job", "--type", "observation.projected")
            assert rebuilt[-1]["data"]["source"] == "rebuilt"
        if state == "blocked":
            gate = d.json("log", "job", "--type", "gate.evaluated")[-1]["data"]
            assert gate["options"] == ["rerun", "discard", "accept"]
        d.stop()
        assert check(d.state_dir).ok
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _log_lines(d: Daemon) -> list[bytes]:
    return (d.state_dir / "sessions" / "job" / "events.jsonl").read_bytes().splitlines()


def test_a_file_edited_between_crash_and_restart_blocks_until_accepted() -> None:
    root = short_dir()
    try:
        d = Daemon(root, 'fault = "after-started"\n')
        d.start()
        spec = d.write_spec(
            "job",
            SPEC.format(tail="echo done", idempotency="conditional", resume="rerun-after-check"),
        )
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "job")
        assert d.proc is not None
        d.proc.wait(30)
        (root / "out.txt").write_text("edited by hand\n")
        d.config.write_text('log_format = "json"\n')
        d.start()
        blocked = settle(d)
        assert blocked["data"]["to"] == "blocked"
        assert "changed out.txt" in blocked["data"]["reason"]
        gate = d.ctl("gate", "job")
        assert gate.returncode == 1
        assert "FAIL tool calls" in gate.stdout
        d.ctl("resolve", "job", "--accept", check=True)
        done = wait_event(
            d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        assert done["data"]["outcome"] == "completed"
        assert (root / "out.txt").read_text() == "edited by hand\nran\n"  # exactly once
        resolved = d.json("log", "job", "--type", "recovery.resolved")[0]["data"]
        assert resolved["option"] == "accept"
        assert "out.txt" in resolved["hashes"]
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_discard_drops_the_half_finished_step_and_runs_afresh() -> None:
    root = short_dir()
    try:
        d = Daemon(root, 'fault = "after-started"\n')
        d.start()
        spec = d.write_spec(
            "job", SPEC.format(tail="echo done", idempotency="unsafe", resume="never-rerun")
        )
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "job")
        assert d.proc is not None
        d.proc.wait(30)
        d.config.write_text('log_format = "json"\n')
        d.start()
        assert settle(d)["data"]["to"] == "blocked"
        d.ctl("resolve", "job", "--discard", check=True)
        wait_event(d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
        assert (root / "out.txt").read_text() == "ran\n"
        observations = d.json("log", "job", "--type", "observation.projected")
        assert observations[0]["data"]["source"] == "discarded"
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_resolve_is_refused_for_a_session_that_is_not_blocked(tmp_path: Path) -> None:
    from tests.e2e.harness import running

    with running() as d:
        d.ctl("create", str(d.write_spec("n", 'name = "n"\n')), check=True)
        done = d.ctl("resolve", "n", "--rerun")
        assert done.returncode == 1
        assert "resolve is for a blocked session" in done.stderr
        assert subprocess.run(["true"], check=False).returncode == 0


def test_a_run_cut_off_before_its_run_started_never_lends_its_ids_to_the_next() -> None:
    """Found by the kill -9 campaign: the program was started, the daemon died before
    `run.started`, the block was accepted, and the next run (the wake was still
    pending) got the same run and call id: one call id, two executions. Now the
    program cut off there is held and never runs; the next run still gets new ids."""
    root = short_dir()
    try:
        d = Daemon(root, 'fault = "after-spawn"\n')
        d.start()
        spec = d.write_spec(
            "job",
            'name = "job"\n[run]\nexec = ["sh", "-c", "echo $SESSIOND_RUN $SESSIOND_CALL >> '
            'calls.txt"]\ncwd = "."\nwrites = ["calls.txt"]\nidempotency = "unsafe"\n'
            'resume = "require-user-confirmation"\nretries = 0\n',
        )
        d.ctl("create", str(spec), check=True)
        d.ctl("activate", "job")
        assert d.proc is not None
        assert d.proc.wait(30) == -9
        calls = root / "calls.txt"
        d.config.write_text('log_format = "json"\nstop_grace = "2s"\n')
        d.start()
        assert settle(d)["data"]["to"] == "blocked"  # unsafe, cut off: a person decides
        assert not calls.exists()  # held at the crash, it never ran
        # The person has it run: as a new call, under new ids. (Its wake was taken
        # by r1's `running`, so --accept or --discard would not run it: see
        # tests/e2e/test_restart_wakes.py.)
        d.ctl("resolve", "job", "--rerun", check=True)
        wait_event(d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated")
        assert calls.read_text() == "r2 r2.command\n"
        started = d.json("log", "job", "--type", "run.started")
        assert [r["data"]["run"] for r in started] == ["r2"]
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
