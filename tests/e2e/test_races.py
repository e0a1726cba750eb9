"""A cancel, suspend or interrupt that comes while a run is starting takes effect on
the run that starts (docs/design.md section 9): the program is stopped or never started,
never left running under a terminated session; no event follows ``terminated``;
and the slot it held is free for the next session.

The start is held deterministically by the test-only ``fault_hold`` key: at
``before-spawn`` (the gate said ok, no program yet) or ``after-spawn`` (the program
runs, the daemon does not supervise it yet) until the test creates a file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import SESSIONCTL, Daemon, running, wait_event, wait_for

PROGRAM = """import os, sys, time
with open("runs.txt", "a") as f:
    f.write(os.environ["SESSIOND_RUN"] + "\\n")
time.sleep(300)
"""


def with_marker(marker: str) -> list[int]:
    """Pids of the processes whose command line holds ``marker`` (a test's own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline.split(b"\0"):
            found.append(int(entry.name))
    return found


def make_job(d: Daemon, marker: str) -> None:
    (d.root / "prog.py").write_text(PROGRAM)
    spec = (
        f'name = "job"\n[run]\nexec = ["{sys.executable}", "prog.py", "{marker}"]\n'
        'cwd = "."\nretries = 0\n'
    )
    d.ctl("create", str(d.write_spec("job", spec)), check=True)


def ctl_in_background(d: Daemon, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [SESSIONCTL, *args],
        env=d.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> None:
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"{proc.args!r} -> {proc.returncode}: {err}"


def log_of(d: Daemon, name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = d.json("log", name)
    return events


def after_first(events: list[dict[str, Any]], to: str) -> list[dict[str, Any]]:
    """The events that follow the first change to ``to``."""
    index = next(
        i
        for i, r in enumerate(events)
        if r["type"] == "lifecycle.changed" and r["data"]["to"] == to
    )
    return events[index + 1 :]


def hold_config(point: str, release: Path) -> str:
    return f'max_running = 1\nfault_hold = "{point}"\nfault_hold_until = "{release}"\n'


def held_start(d: Daemon, action: str, release: Path) -> None:
    """activate job; while its start is held, ask for ``action``; then let it go."""
    since = len(d.lines)
    activate = ctl_in_background(d, "activate", "job")
    d.wait_line("fault.held", match=lambda line: line.get("session") == "job", since=since)
    stop = ctl_in_background(d, action, "job")
    # The request is registered (it then waits for the start to end): let the start go.
    d.wait_line("stop.pending", match=lambda line: line.get("stop") == action, since=since)
    release.touch()
    finish(activate)
    finish(stop)


def next_session_runs(d: Daemon) -> None:
    """No slot is left held: with max_running = 1 another session starts and ends."""
    d.ctl("create", str(d.write_spec("next", 'name = "next"\n[run]\nexec = ["true"]\n')))
    d.ctl("activate", "next", check=True)
    done = wait_event(
        d, "next", "lifecycle.changed", match=lambda r: r["data"]["to"] == "terminated"
    )
    assert done["data"]["outcome"] == "completed"


def check_run_record(events: list[dict[str, Any]], point: str) -> None:
    """before-spawn: no program started, so no run; after-spawn: the run is on record
    as started and finished, before the state the stop asked for."""
    types = [r["type"] for r in events]
    if point == "before-spawn":
        assert "run.started" not in types
        return
    assert types.count("run.started") == 1
    assert types.count("run.finished") == 1
    assert types.index("run.started") < types.index("run.finished")
    finished = next(r for r in events if r["type"] == "run.finished")
    assert finished["data"]["status"] != "ok"  # stopped, not run to its end


@pytest.mark.parametrize("point", ["before-spawn", "after-spawn"])
def test_a_cancel_during_a_start_leaves_no_program_and_nothing_after_terminated(
    point: str,
) -> None:
    marker = f"sessiond-race-{uuid.uuid4().hex}"
    release = Path("/tmp") / f"{marker}.release"
    try:
        with running(hold_config(point, release)) as d:
            make_job(d, marker)
            held_start(d, "cancel", release)
            show = d.json("show", "job")
            assert show["state"] == "terminated", show
            assert show["outcome"] == "cancelled"
            wait_for(lambda: not with_marker(marker), timeout=30, what="the program to end")
            next_session_runs(d)
            events = log_of(d, "job")
            assert after_first(events, "terminated") == []
            check_run_record(events, point)
            runs = d.root / "runs.txt"
            if point == "before-spawn":
                assert not runs.exists()  # never started
            # A clean stop and a restart append nothing to it either.
            assert d.stop() == 0
            d.start()
            assert after_first(log_of(d, "job"), "terminated") == []
            assert not with_marker(marker)
    finally:
        for pid in with_marker(marker):  # a failing run must not leave its program
            os.kill(pid, 9)
        release.unlink(missing_ok=True)


@pytest.mark.parametrize("point", ["before-spawn", "after-spawn"])
@pytest.mark.parametrize(("action", "state"), [("suspend", "suspended"), ("interrupt", "sleeping")])
def test_a_suspend_or_interrupt_during_a_start_stops_the_run_it_starts(
    point: str, action: str, state: str
) -> None:
    marker = f"sessiond-race-{uuid.uuid4().hex}"
    release = Path("/tmp") / f"{marker}.release"
    try:
        with running(hold_config(point, release)) as d:
            make_job(d, marker)
            held_start(d, action, release)
            show = d.json("show", "job")
            assert show["state"] == state, show
            assert show["pid"] is None
            wait_for(lambda: not with_marker(marker), timeout=30, what="the program to end")
            next_session_runs(d)
            events = log_of(d, "job")
            last = events[-1]
            assert last["type"] == "lifecycle.changed", last
            assert last["data"]["to"] == state
            check_run_record(events, point)
            assert not with_marker(marker)
    finally:
        for pid in with_marker(marker):
            os.kill(pid, 9)
        release.unlink(missing_ok=True)


@pytest.mark.parametrize("point", ["before-spawn", "after-spawn"])
def test_a_merge_during_a_start_stops_the_run_and_nothing_follows_terminated(point: str) -> None:
    """merge took the child's state outside its lock, as cancel once did: a start
    under way then ran its program under a child already merged (terminated)."""
    marker = f"sessiond-race-{uuid.uuid4().hex}"
    release = Path("/tmp") / f"{marker}.release"
    try:
        with running(hold_config(point, release)) as d:
            make_job(d, marker)
            d.ctl("create", str(d.write_spec("parent", 'name = "parent"\n')), check=True)
            since = len(d.lines)
            activate = ctl_in_background(d, "activate", "job")
            d.wait_line("fault.held", match=lambda line: line.get("session") == "job", since=since)
            merge = ctl_in_background(d, "merge", "job", "--into", "parent", "--summary", "done")
            d.wait_line("stop.pending", match=lambda line: line.get("stop") == "merge", since=since)
            release.touch()
            finish(activate)
            finish(merge)
            show = d.json("show", "job")
            assert show["state"] == "terminated", show
            assert show["outcome"] == "merged"
            wait_for(lambda: not with_marker(marker), timeout=30, what="the program to end")
            events = log_of(d, "job")
            assert after_first(events, "terminated") == []
            check_run_record(events, point)
            merged = d.json("log", "parent", "--type", "session.merged")
            assert [e["data"]["summary"] for e in merged] == ["done"]
            next_session_runs(d)
            assert not with_marker(marker)
    finally:
        for pid in with_marker(marker):
            os.kill(pid, 9)
        release.unlink(missing_ok=True)
