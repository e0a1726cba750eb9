"""Nothing outlives its run (docs/design.md section 9), against the real daemon.

Hostile programs leave children behind — one holding the output pipes, one
double-forked into a session of its own, one ignoring SIGTERM — each carrying a
unique marker argument. After the leader's exit, `cancel`, a `timeout`, a
SIGTERM shutdown and a kill -9 of the daemon, the whole process table is
searched for the marker: nothing may be left. And a crash between spawning a
program and recording `run.started` (or between that and letting it go) never
makes the program run twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, alive, running, short_dir, wait_event, wait_for

SLEEPER = "import time; time.sleep(1000)"
# forks, the child starts a session of its own and forks again: the grandchild
# is nobody's child but a subreaper's
DOUBLE_FORK = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(1000)\n"
    "    os._exit(0)\n"
    "print('started', flush=True)\n"
)
IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"
)


def programs(m: str, *, leader_waits: bool) -> dict[str, list[str]]:
    """Each hostile program; with ``leader_waits`` its leader stays too (until stopped)."""
    tail = "; exec python3 -c 'import time; time.sleep(1000)'" if leader_waits else ""
    return {
        "pipe-holder": ["sh", "-c", f"python3 -c '{SLEEPER}' {m} & echo started{tail}"],
        "double-fork": ["sh", "-c", f'python3 -c "{DOUBLE_FORK}" {m}{tail}'],
        "ignores-term": [
            "sh",
            "-c",
            f"trap '' TERM; python3 -c '{IGNORES_TERM}' {m} & echo started{tail}",
        ],
    }


def marked(m: str) -> list[int]:
    """Every process whose command line carries the marker (the whole table)."""
    found = []
    needle = m.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read() and alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def wait_gone(m: str, timeout: float = 20.0) -> None:
    """Processes take a moment to die after SIGKILL: wait, bounded."""
    try:
        wait_for(lambda: not marked(m), timeout, what=f"no process with {m}")
    except AssertionError:
        raise AssertionError(f"left running: {[_cmdline(p) for p in marked(m)]}") from None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"{pid} (gone)"


@pytest.fixture
def mark() -> Iterator[str]:
    """A unique marker; whatever carries it is killed at the end, pass or fail."""
    m = f"marker-{uuid.uuid4().hex}"
    yield m
    for pid in marked(m):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def spec(argv: list[str], extra: str = "") -> str:
    quoted = ", ".join(json.dumps(a) for a in argv)  # a TOML basic string too
    return f'name = "job"\n[run]\nexec = [{quoted}]\ncwd = "."\nretries = 0\n{extra}'


def start(d: Daemon, argv: list[str], extra: str = "", *, dies: bool = False) -> None:
    d.ctl("create", str(d.write_spec("job", spec(argv, extra))), check=True)
    d.ctl("activate", "job", check=not dies)  # a daemon at a fault point dies on the way


def finished(d: Daemon, timeout: float = 30.0) -> dict[str, object]:
    data: dict[str, object] = wait_event(d, "job", "run.finished", timeout=timeout)["data"]
    return data


def under_way(d: Daemon, m: str, waits: bool) -> None:
    """The program's children are there — or, its leader gone at once, its run has
    ended already (their life may be too short to see)."""
    wait_for(
        lambda: marked(m) or (not waits and d.json("log", "job", "--type", "run.finished")),
        what="the program's children",
    )


KINDS = ["pipe-holder", "double-fork", "ignores-term"]
# (kind, does the leader stay): the pipe holder whose leader exits at once is the
# case that wedged a session; the others stop a run whose leader is still there.
STOPS = [("pipe-holder", False), *((kind, True) for kind in KINDS)]
STAYS = '[[trigger]]\ntype = "message"\n'  # the session outlives a run that ends early


@pytest.mark.parametrize("kind", KINDS)
def test_the_leaders_exit_ends_the_run_and_everything_it_left(kind: str, mark: str) -> None:
    with running() as d:
        start(d, programs(mark, leader_waits=False)[kind])
        # `sleep 1000` keeps the pipes open for 1000 s: the run ends anyway, now
        done = finished(d)
        assert done["status"] == "ok", done
        wait_gone(mark)
        assert d.json("show", "job")["state"] != "running"


@pytest.mark.parametrize(("kind", "waits"), STOPS)
def test_cancel_returns_promptly_and_stops_the_whole_run(kind: str, waits: bool, mark: str) -> None:
    with running() as d:
        start(d, programs(mark, leader_waits=waits)[kind], STAYS)
        under_way(d, mark, waits)
        began = time.monotonic()
        d.ctl("cancel", "job", check=True, timeout=30)
        assert time.monotonic() - began < 20  # stop_grace is 2 s
        wait_gone(mark)
        assert d.json("show", "job")["state"] == "terminated"


@pytest.mark.parametrize("kind", KINDS)
def test_a_timeout_stops_the_whole_run(kind: str, mark: str) -> None:
    with running() as d:
        start(d, programs(mark, leader_waits=True)[kind], 'timeout = "2s"\n')
        done = finished(d)
        assert done["status"] == "timeout", done
        wait_gone(mark)


@pytest.mark.parametrize(("kind", "waits"), STOPS)
def test_shutdown_stops_every_run_and_says_so(kind: str, waits: bool, mark: str) -> None:
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        start(d, programs(mark, leader_waits=waits)[kind], STAYS)
        under_way(d, mark, waits)
        assert d.stop() == 0
        wait_gone(mark)
        assert (d.state_dir / "clean-shutdown").exists()
        d.start()
        # stopped by the shutdown; or, its leader gone at once, ended before it. A
        # run the shutdown stopped left its turn open: the restart continues it once
        # (docs/design.md section 8), so look at the first end only.
        ends = d.json("log", "job", "--type", "run.finished")
        statuses = ("interrupted", "killed") if waits else ("ok", "interrupted")
        assert ends[0]["data"]["status"] in statuses, ends
        if ends[0]["data"]["status"] != "ok":
            assert ends[0]["data"]["ends_turn"] is False
        d.ctl("cancel", "job", check=True, timeout=30)
        wait_gone(mark)
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("kind", KINDS)
def test_kill9_of_the_daemon_leaves_nothing_running(kind: str, mark: str) -> None:
    """The daemon never restarts here: its spawner alone stops the run."""
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        start(d, programs(mark, leader_waits=True)[kind])
        wait_for(lambda: marked(mark), what="the program's children")
        assert d.proc is not None
        os.kill(d.proc.pid, signal.SIGKILL)  # the daemon only, not its process group
        assert d.stop() == -9
        wait_gone(mark)
        d.start()  # and the restart records the run as cut off
        ends = d.json("log", "job", "--type", "run.finished")
        assert [e["data"]["status"] for e in ends] == ["lost"], ends
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_restart_kills_what_a_dead_daemon_and_a_dead_spawner_left(mark: str) -> None:
    """The fallback: the daemon, its spawner and the run's holder all die at once
    (SIGKILL); the program's processes, orphaned, carry the run marker in their
    environment, and the next start finds them by it."""
    root = short_dir()
    try:
        # Unconfined: in the sandbox the run's pid namespace dies with bubblewrap,
        # which dies with the holder, so nothing is left for this fallback to find
        # (test_a_sandboxed_run_dies_with_its_holder_whatever_else_dies below).
        d = Daemon(root, '[run]\nsandbox = "off"\n')
        d.start()
        start(d, programs(mark, leader_waits=True)["double-fork"])
        holder = wait_for(lambda: d.json("show", "job")["pid"], what="the run's holder")

        def escaped() -> bool:
            # the setsid'd grandchild, in a session of its own: the one that would
            # outlive everything (the processes before it come and go, and the
            # leader execs away its marker, so counting them races)
            with contextlib.suppress(ProcessLookupError):
                return any(os.getsid(p) != os.getsid(holder) for p in marked(mark))
            return False

        wait_for(escaped, what="the program's setsid'd grandchild")
        spawner = next(line["pid"] for line in d.lines if line.get("event") == "spawner.started")
        assert d.proc is not None
        # Stopped first, so that it cannot clean up after the holder: the worst case.
        os.kill(spawner, signal.SIGSTOP)
        os.kill(holder, signal.SIGKILL)
        os.kill(d.proc.pid, signal.SIGKILL)
        os.kill(spawner, signal.SIGKILL)
        d.stop()
        wait_for(lambda: not alive(spawner), what="the spawner's end")
        assert marked(mark), "the orphans should be running until the restart"
        d.start()
        wait_gone(mark)
        assert any(line.get("event") == "leftover.killed" for line in d.lines)
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


CONTRACTS = {
    "safe": ("safe", "replay-from-event"),
    "rerun-after-check": ("conditional", "rerun-after-check"),
    "unsafe": ("unsafe", "rerun-after-check"),
}


@pytest.mark.parametrize("contract", sorted(CONTRACTS))
@pytest.mark.parametrize("point", ["after-spawn", "after-record"])
def test_a_crash_in_the_spawn_window_never_runs_the_program_twice(
    point: str, contract: str, mark: str
) -> None:
    idempotency, resume = CONTRACTS[contract]
    root = short_dir()
    try:
        d = Daemon(root, f'fault = "{point}"\n')
        d.start()
        argv = ["sh", "-c", f"echo ran-$SESSIOND_RUN >> out.txt; : {mark}"]
        extra = f'idempotency = "{idempotency}"\nresume = "{resume}"\nwrites = ["out.txt"]\n'
        start(d, argv, extra, dies=True)
        assert d.proc is not None
        assert d.proc.wait(30) == -9  # died at the fault point
        d.stop()
        wait_gone(mark)
        out = root / "out.txt"
        assert not out.exists(), "the held program ran although the daemon died before go"
        d.config.write_text('log_format = "json"\nstop_grace = "2s"\n')
        d.start()
        final = wait_event(
            d,
            "job",
            "lifecycle.changed",
            match=lambda r: r["data"]["to"] in ("terminated", "blocked"),
        )
        lines = out.read_text().splitlines() if out.exists() else []
        runs = [r["data"]["run"] for r in d.json("log", "job", "--type", "run.started")]
        # Every execution is a run on record, each once; r1, cut off held, never ran.
        # (How many runs the restart's wakes make is the wake path's business: one,
        # once the extra restart wake is gone.)
        assert len(set(lines)) == len(lines), lines
        assert set(lines) <= {f"ran-{run}" for run in runs}, (lines, runs)
        assert "ran-r1" not in lines
        if contract == "unsafe":
            assert final["data"]["to"] == "blocked"  # it may have run: a person decides
            assert lines == []
        else:
            assert final["data"]["to"] == "terminated", final["data"]
            assert lines
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_sandboxed_run_dies_with_its_holder_whatever_else_dies(mark: str) -> None:
    """The daemon, its spawner and the run's holder all die at once (SIGKILL), the
    spawner stopped first so that it cleans up nothing: the run's processes, a
    double-forked ``setsid`` one included, die with bubblewrap's pid namespace."""
    root = short_dir()
    try:
        d = Daemon(root)
        d.start()
        start(d, programs(mark, leader_waits=True)["double-fork"])
        holder = wait_for(lambda: d.json("show", "job")["pid"], what="the run's holder")

        def grandchild() -> bool:  # the setsid'd one: its parent has exited
            return any(_cmdline(p).startswith("python3") for p in marked(mark))

        wait_for(grandchild, what="the program's setsid'd grandchild")
        spawner = next(line["pid"] for line in d.lines if line.get("event") == "spawner.started")
        assert d.proc is not None
        os.kill(spawner, signal.SIGSTOP)
        os.kill(holder, signal.SIGKILL)
        os.kill(d.proc.pid, signal.SIGKILL)
        os.kill(spawner, signal.SIGKILL)
        d.stop()
        wait_gone(mark)  # no restart needed: the kernel ended them
    finally:
        shutil.rmtree(root, ignore_errors=True)
