"""A restart adds no wake that makes already-handled work run again (docs/design.md
section 8): an unfinished turn continues once, after the gate, with no new wake;
wakes that were pending stay pending, and one run carries them. And
``resolve --discard`` never starts the program it discarded.

The daemon is killed for real: by the test-only ``fault`` key at an exact point
of a run, or by the test with SIGKILL while its program runs. Each program
appends its run id to ``runs.txt``, so the test counts executions; the log gives
the wakes and the runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Daemon, short_dir, wait_event, wait_for

SPEC = """name = "job"
{trigger}[run]
exec = ["sh", "-c", "echo $SESSIOND_RUN >> runs.txt{tail}"]
cwd = "."
idempotency = "{idempotency}"
resume = "{resume}"
writes = [{writes}]
retries = 0
"""
PLAIN = 'log_format = "json"\nstop_grace = "2s"\nshutdown_grace = "3s"\n'


def spec(
    *, idempotency: str, resume: str, writes: str = "", tail: str = "", trigger: str = ""
) -> str:
    return SPEC.format(
        idempotency=idempotency, resume=resume, writes=writes, tail=tail, trigger=trigger
    )


def executions(root: Path) -> list[str]:
    """The run ids the program ran under, once per execution."""
    runs = root / "runs.txt"
    return runs.read_text().split() if runs.exists() else []


def of_type(d: Daemon, etype: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = d.json("log", "job", "--type", etype)
    return events


def crash_on_activate(d: Daemon, text: str) -> None:
    """Create and activate job; the daemon's fault point kills it on the way."""
    d.ctl("create", str(d.write_spec("job", text)), check=True)
    d.ctl("activate", "job")
    assert d.proc is not None
    assert d.proc.wait(30) == -9


def restart(d: Daemon) -> None:
    d.config.write_text(PLAIN)
    d.start()


def test_a_crash_between_spawn_and_run_started_continues_the_turn_once() -> None:
    """Found as "a third run starts": the restart appended a `restart` wake for the
    cut-off run and another for the wake it found pending (the cut-off run's own,
    never taken by a run.started), so two more runs followed the crash."""
    root = short_dir()
    try:
        d = Daemon(root, 'fault = "after-spawn"\n')
        d.start()
        # safe, and it declares no paths to check: the gate lets the turn continue
        crash_on_activate(d, spec(idempotency="safe", resume="replay-from-event"))
        restart(d)
        done = wait_event(
            d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
        )
        assert done["data"]["outcome"] == "completed"
        wakes = of_type(d, "wake.requested")
        assert [w["data"]["trigger"] for w in wakes] == ["manual"]  # no wake added
        started = [r["data"]["run"] for r in of_type(d, "run.started")]
        assert started == ["r2"]  # the turn continued once, under a new run id
        ran = executions(root)
        # r1 ran only if its program got going before the crash; never twice, no r3
        assert ran.count("r2") == 1
        assert len(ran) == len(set(ran))
        assert set(ran) <= {"r1", "r2"}
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_wake_pending_at_a_crash_waits_for_the_next_turn_and_runs_once() -> None:
    """A wake that came while the run ran is pending at the crash. The restart adds no
    wake of its own: the cut-off turn continues once (seeing its own wake), then the
    pending wake starts the next turn, once (docs/design.md section 8: wakes that arrive
    during a turn wait for the next one)."""
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        text = spec(
            idempotency="safe",
            resume="replay-from-event",
            tail="; while [ ! -e go ]; do sleep 0.05; done",
            trigger='[[trigger]]\ntype = "message"\n',
        )
        d.ctl("create", str(d.write_spec("job", text)), check=True)
        d.ctl("send", "job", "one", check=True)
        first = wait_event(d, "job", "run.started")
        d.ctl("send", "job", "two", check=True)  # pending while r1 runs
        two = wait_event(d, "job", "wake.requested", since=first["seq"])
        wait_for(lambda: executions(root) == ["r1"], what="r1 to run")
        d.kill9()
        restart(d)
        second = wait_event(d, "job", "run.started", since=first["seq"] + 1)
        assert second["data"]["run"] == "r2"
        assert second["data"]["turn"] == first["data"]["turn"] == 1  # the same turn
        assert second["data"]["wakes"] == first["data"]["wakes"]  # its own wake, "one"
        (root / "go").touch()
        third = wait_event(d, "job", "run.started", since=second["seq"] + 1)
        assert third["data"]["turn"] == 2
        assert [w["seq"] for w in third["data"]["wakes"]] == [two["seq"]]
        wait_event(d, "job", "run.finished", since=third["seq"])
        # A barrier: cancel takes the session's lock, so whatever the end of r3 led
        # to (another run, if a wake counted twice) is on record when it returns.
        d.ctl("cancel", "job", check=True)
        wakes = of_type(d, "wake.requested")
        assert [w["data"]["trigger"] for w in wakes] == ["message", "message"]
        assert [r["data"]["run"] for r in of_type(d, "run.started")] == ["r1", "r2", "r3"]
        assert executions(root) == ["r1", "r2", "r3"]
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(("option", "state"), [("discard", "sleeping"), ("accept", "terminated")])
@pytest.mark.parametrize("point", ["during-work", "after-spawn"])
def test_discard_or_accept_of_a_cut_off_unsafe_command_never_runs_it_again(
    point: str, option: str, state: str
) -> None:
    """README, "The resume gate": for a command whose cut-off program had started for
    every wake there was, --discard puts the session to sleep and --accept ends the
    run as a finished run would (terminated: it has no triggers); neither starts the
    program again, not even after another restart."""
    root = short_dir()
    try:
        d = Daemon(root, f'fault = "{point}"\n')
        d.start()
        crash_on_activate(
            d,
            spec(idempotency="unsafe", resume="require-user-confirmation", writes='"runs.txt"'),
        )
        restart(d)
        blocked = wait_event(
            d, "job", "lifecycle.changed", match=lambda r: r["data"]["to"] == "blocked"
        )
        assert "tool calls" in blocked["data"]["reason"]
        started_before = [r["data"]["run"] for r in of_type(d, "run.started")]
        assert started_before == (["r1"] if point == "during-work" else [])
        ran = executions(root)
        assert len(ran) <= 1
        d.ctl("resolve", "job", f"--{option}", check=True)
        show = d.json("show", "job")
        assert show["state"] == state, show
        assert [r["data"]["run"] for r in of_type(d, "run.started")] == started_before
        assert executions(root) == ran
        # Nor does a restart run it: the resolved turn left no wake pending.
        assert d.stop() == 0
        d.start()
        if state == "sleeping":
            d.ctl("suspend", "job", check=True)  # a barrier: it waits for the session's lock
        assert [r["data"]["run"] for r in of_type(d, "run.started")] == started_before
        assert executions(root) == ran
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
