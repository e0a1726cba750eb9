"""A crash between a command's observation and its ``run.finished`` (found by the
kill -9 campaign: a power cut kept the fsynced observation and lost the end that
followed it). The turn's one step had finished ``ok`` and its call was closed, so
the restart saw a run cut off with nothing in flight, left the turn open, and the
gate let the unsafe command run again under the same ``SESSIOND_TURN``: work that
must not be done twice, done twice, with nobody asked."""

from __future__ import annotations

import shutil

from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for
from tests.faults.checks import records

SPEC = """name = "job"
[run]
exec = ["sh", "-c", "t=t$SESSIOND_TURN; echo begin $t >> turns.txt; echo end $t >> turns.txt"]
cwd = "."
writes = ["turns.txt"]
idempotency = "unsafe"
resume = "require-user-confirmation"
retries = 0
[[trigger]]
type = "every"
interval = "1s"
"""


def test_a_crash_after_the_observation_never_runs_the_turn_again() -> None:
    root = short_dir()
    try:
        d = Daemon(root, 'fault = "after-observation"\n')
        d.start()
        d.ctl("create", str(d.write_spec("job", SPEC)), check=True)
        assert d.proc is not None
        assert d.proc.wait(30) == -9  # turn 1 ran, was observed, then the daemon died
        turns = root / "turns.txt"
        assert turns.read_text() == "begin t1\nend t1\n"
        log = d.state_dir / "sessions" / "job" / "events.jsonl"
        observed = records(log, b"observation.projected")
        assert [r["data"]["source"] for r in observed] == ["finished"]
        assert records(log, b"run.finished") == []
        d.config.write_text('log_format = "json"\nstop_grace = "2s"\n')
        d.start()
        # the next `every` wake is turn 2: whatever the restart ran came before it
        wait_for(lambda: "end t2\n" in turns.read_text(), timeout=30, what="turn 2 to end")
        lines = turns.read_text().splitlines()
        assert lines.count("begin t1") == 1, lines
        ended = d.json("log", "job", "--type", "run.finished")[0]["data"]
        assert (ended["run"], ended["status"], ended["ends_turn"]) == ("r1", "ok", True)
        assert "daemon restarted during run" in ended["error"]
        started = d.json("log", "job", "--type", "run.started")
        assert [r["data"]["turn"] for r in started][:2] == [1, 2]
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


ONCE = """name = "once"
[run]
exec = ["sh", "-c", "echo ran t$SESSIOND_TURN >> runs.txt"]
cwd = "."
writes = ["runs.txt"]
idempotency = "unsafe"
resume = "require-user-confirmation"
retries = 0
"""


def test_a_crash_after_the_run_ended_its_turn_runs_nothing_more() -> None:
    """The same one step later: ``run.finished`` (the turn ended) on record, the
    session's next state not. A session with no trigger is done after its one run;
    the restart must complete it, not start a turn nobody asked for."""
    root = short_dir()
    try:
        d = Daemon(root, 'fault = "after-run-finished"\n')
        d.start()
        d.ctl("create", str(d.write_spec("once", ONCE)), check=True)
        d.ctl("activate", "once")
        assert d.proc is not None
        assert d.proc.wait(30) == -9
        runs = root / "runs.txt"
        assert runs.read_text() == "ran t1\n"
        log = d.state_dir / "sessions" / "once" / "events.jsonl"
        assert [r["data"]["ends_turn"] for r in records(log, b"run.finished")] == [True]
        d.config.write_text('log_format = "json"\nstop_grace = "2s"\n')
        d.start()
        done = wait_event(
            d, "once", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        assert done["data"]["outcome"] == "completed"
        assert runs.read_text() == "ran t1\n"
        assert len(records(log, b"run.started")) == 1
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
