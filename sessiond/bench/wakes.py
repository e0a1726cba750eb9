"""Wake latency benchmarks: a file write or a commit to the first instruction of a
probe program, beside a minimal watchfiles loop starting the same probe (the floor)."""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import watchfiles

from sessiond.bench.daemon import BenchDaemon, call

PROBE = "echo $EPOCHREALTIME > {ts}"


def _stamp(path: Path, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text().strip()
            if text:
                return float(text)
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} was not written")
        time.sleep(0.001)


def _settle(socket: Path, name: str) -> None:
    while call(socket, "show", {"name": name})["state"] not in ("sleeping", "terminated"):
        time.sleep(0.002)


# Both sides poll every step: a change is seen at the next step, and again one
# step later once nothing else changed. Writing at a fixed delay after the last
# sample would land at the same phase of the steps each time and bias a median
# by up to a step, for either side; a random extra delay spread over two steps
# makes every phase equally likely on both sides. Seeded: runs are repeatable.
_PHASE = random.Random(1)


def _pause(base: float) -> None:
    time.sleep(base + _PHASE.uniform(0, 0.03))


def watch_wake(root: Path, debounce: str, samples: int, step_ms: int) -> float:
    """Median ms from a file write to the probe's first instruction, through the daemon."""
    work = root / f"watch-{debounce}"
    (work / "data").mkdir(parents=True)
    ts = work / "ts"
    spec = (
        f'name = "w"\n[run]\nexec = ["bash", "-c", "{PROBE.format(ts=ts)}"]\ncwd = "{work}"\n'
        f"[limits]\nburst = 10000\n"  # measuring latency, not the rate limit
        f'[[trigger]]\ntype = "watch"\npaths = ["data/*"]\ndebounce = "{debounce}"\n'
    )
    d = BenchDaemon(work)
    d.config.write_text(f'log_format = "json"\nwatch_step_ms = {step_ms}\n')  # as the floor
    d.state_dir.mkdir()
    try:
        d.start()
        call(d.socket, "create", {"spec": spec, "base": str(work), "source": "w"})
        time.sleep(0.5)  # the watcher is up

        def settle() -> None:
            _settle(d.socket, "w")
            _pause(0.05)

        delays = _write_delays(work / "data", ts, samples, settle)
    finally:
        d.stop()
    return statistics.median(delays)


def watch_floor(root: Path, samples: int, step_ms: int) -> float:
    """The same write-to-probe path with nothing but a watchfiles loop in between."""
    work = root / "floor"
    (work / "data").mkdir(parents=True)
    ts = work / "ts"
    stop = threading.Event()

    def loop() -> None:
        for _ in watchfiles.watch(work / "data", step=step_ms, stop_event=stop, watch_filter=None):
            subprocess.Popen(["bash", "-c", PROBE.format(ts=ts)]).wait()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    time.sleep(0.5)
    delays = _write_delays(work / "data", ts, samples, lambda: _pause(0.1))
    stop.set()
    (work / "data" / "stop").write_text("x")
    thread.join(5)
    return statistics.median(delays)


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}  # fmt: skip
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _git_repo(root: Path) -> Path:
    """A repository with one commit of ``src/a.py``, for the git wake and its floor."""
    repo = root / "repo"
    (repo / "src").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "src" / "a.py").write_text("0\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")
    return repo


def _write_delays(folder: Path, ts: Path, samples: int, settle: Callable[[], None]) -> list[float]:
    """ms from each write of a new file in ``folder`` to the probe's stamp."""
    delays = []
    for i in range(samples):
        ts.unlink(missing_ok=True)
        start = time.time()
        (folder / f"f{i}").write_text(str(i))
        delays.append((_stamp(ts) - start) * 1000)
        settle()
    return delays


def _commit_delays(repo: Path, ts: Path, samples: int, settle: Callable[[], None]) -> list[float]:
    """ms from each finished `git commit` touching ``src/a.py`` to the probe's stamp."""
    delays = []
    for i in range(samples):
        ts.unlink(missing_ok=True)
        (repo / "src" / "a.py").write_text(f"{time.time_ns()}\n")
        _git(repo, "commit", "-q", "-am", f"c{i}")
        # from the moment the commit landed (its ref renamed into place), not from
        # git's exit: on a loaded host the wake can come before `git` has exited
        start = (repo / ".git" / "refs" / "heads" / "main").stat().st_mtime_ns / 1e9
        delays.append((_stamp(ts) - start) * 1000)
        settle()
    return delays


def git_wake(root: Path, samples: int) -> float:
    """Median ms from a finished `git commit` touching the paths to the probe."""
    root = root / "git"
    repo = _git_repo(root)
    ts = root / "git-ts"
    spec = (
        f'name = "g"\n[run]\nexec = ["bash", "-c", "{PROBE.format(ts=ts)}"]\ncwd = "{repo}"\n'
        f'writable = ["{root}"]\n'  # its stamp lies beside the repository, not in it
        '[limits]\nburst = 10000\n[[trigger]]\ntype = "git"\npaths = ["src/**"]\n'
    )
    (root / "gitd").mkdir()
    d = BenchDaemon(root / "gitd")
    d.state_dir.mkdir()

    def settle() -> None:
        _settle(d.socket, "g")
        _pause(0.05)

    try:
        d.start()
        call(d.socket, "create", {"spec": spec, "base": str(repo), "source": "g"})
        time.sleep(0.5)
        delays = _commit_delays(repo, ts, samples, settle)
    finally:
        d.stop()
    return statistics.median(delays)


def git_floor(root: Path, samples: int, step_ms: int) -> float:
    """The same commit-to-probe path with nothing but a watchfiles loop on the
    branch's ref folder in between: it starts the probe when the ref file itself
    changes (git writes ``main.lock`` and renames it over ``main``)."""
    root = root / "git-floor"
    repo = _git_repo(root)
    ts = root / "git-ts"
    heads = repo / ".git" / "refs" / "heads"
    ref = str(heads / "main")
    stop = threading.Event()

    def loop() -> None:
        for changes in watchfiles.watch(heads, step=step_ms, stop_event=stop, watch_filter=None):
            if any(path == ref for _, path in changes):
                subprocess.Popen(["bash", "-c", PROBE.format(ts=ts)]).wait()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    time.sleep(0.5)
    try:
        delays = _commit_delays(repo, ts, samples, lambda: _pause(0.1))
    finally:
        stop.set()
        (heads / "stop").write_text("x")  # wakes the watcher so that it sees the stop
        thread.join(5)
    return statistics.median(delays)


def storm(root: Path, sessions: int, changes: int) -> dict[str, float]:
    """``changes`` file writes in about a second across ``sessions`` watching sessions."""
    work = root / "storm"
    work.mkdir()
    d = BenchDaemon(work)
    d.state_dir.mkdir()
    try:
        d.start()
        for i in range(sessions):
            folder = work / f"w{i}"
            (folder / "data").mkdir(parents=True)
            spec = (
                f'name = "w{i}"\n[run]\nexec = ["sh", "-c", "echo run >> runs"]\ncwd = "{folder}"\n'
                '[[trigger]]\ntype = "watch"\npaths = ["data/*"]\n'
            )
            call(d.socket, "create", {"spec": spec, "base": str(folder), "source": f"w{i}"})
        time.sleep(1.0)
        start = time.monotonic()
        for n in range(changes):
            (work / f"w{n % sessions}" / "data" / f"f{n // sessions}").write_text(str(n))
        elapsed = time.monotonic() - start
        time.sleep(3.0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = call(d.socket, "ps", {})
            if all(r["state"] == "sleeping" for r in rows):
                break
            time.sleep(0.2)
        runs = sum(
            (work / f"w{i}" / "runs").read_text().count("run")
            for i in range(sessions)
            if (work / f"w{i}" / "runs").exists()
        )
        cpu = _idle_cpu(d, seconds=5.0)
    finally:
        d.stop()
    return {"storm_runs": runs, "storm_write_s": round(elapsed, 2), "idle_cpu_percent": cpu}


def _idle_cpu(d: BenchDaemon, seconds: float) -> float:
    assert d.proc is not None

    def ticks() -> int:
        with open(f"/proc/{d.proc.pid}/stat", "rb") as f:  # type: ignore[union-attr]
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    first = ticks()
    time.sleep(seconds)
    return round((ticks() - first) / os.sysconf("SC_CLK_TCK") / seconds * 100, 2)


def measure(work: Path, quick: bool, say: Any) -> dict[str, float]:
    root = (work / "wakes").resolve()
    root.mkdir()
    samples = 15 if quick else 40
    results: dict[str, float] = {}
    say("measuring watch_wake_p50_ms (debounce 200ms, then 0) and watch_floor_p50_ms ...")
    results["watch_wake_p50_ms"] = round(watch_wake(root, "200ms", samples, 15), 1)
    results["watch_wake_d0_p50_ms"] = round(watch_wake(root, "0ms", samples, 15), 1)
    results["watch_floor_p50_ms"] = round(watch_floor(root, samples, 15), 1)
    results["watch_floor_ratio"] = round(
        results["watch_wake_d0_p50_ms"] / results["watch_floor_p50_ms"], 2
    )
    say("measuring git_wake_p50_ms ...")
    results["git_wake_p50_ms"] = round(git_wake(root, samples), 1)
    say("measuring storm_runs (10,000 changes across 100 sessions) and idle CPU ...")
    results.update(storm(root, 100, 10_000))
    shutil.rmtree(root, ignore_errors=True)
    return results
