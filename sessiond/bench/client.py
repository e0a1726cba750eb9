"""What one ``sessionctl`` process costs, beside the floor of any Python client.

The floor is ``python -c "import socket, json"`` from the same interpreter: a
process that could talk to the daemon and read its answer, and does nothing
else. ``sessionctl ping``, ``ps`` and ``send`` run against a daemon with a few
sessions, one after the other with the floor in each round, so the load of the
machine falls on all of them alike; the figure is the median of each, and the
ratio of the medians (target <= 1.3). Wall time is what a script waits for;
CPU time (user + system, of the process alone) moves less with the machine's
load and is given beside it.

The daemon's import is measured the same way: ``python -c "import
sessiond.daemon.service"`` (what ``sessiond`` imports before it reads a session)
beside ``python -c pass``, and the number of modules that brings in.

Bytecode is compiled first (``compileall``): a fresh checkout, or an environment
with ``PYTHONDONTWRITEBYTECODE`` set, would otherwise compile every sessiond
module in every process, which no installed sessionctl does.

``--client-only --baseline SRC`` measures the same with the source tree ``SRC``
(say the commit before, unpacked with ``git archive``), in the same rounds.
"""

from __future__ import annotations

import compileall
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sessiond.bench.daemon import BenchDaemon, call, write_sessions

BIN = Path(sys.executable).parent
FLOOR = [sys.executable, "-c", "import socket, json"]
BARE = [sys.executable, "-c", "pass"]
# sessionctl of another tree: its main, as the installed script calls it (-P: not
# the current folder first on sys.path, which may be this tree)
OTHER_CTL = "import sys; from sessiond.ctl import main; sys.exit(main())"
COMMANDS: dict[str, list[str]] = {
    "ping": ["ping"],
    "ps": ["ps"],
    "send": ["send", "s00001", "hello from the bench"],
    # with an option: read by argparse (a plain line is not: sessiond/ctl/__init__.py)
    "send_from": ["send", "s00001", "hello from the bench", "--from", "bench"],
}


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one process; it must succeed."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err.decode()[-500:]}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def interleaved(
    programs: dict[str, tuple[list[str], dict[str, str]]], rounds: int
) -> dict[str, tuple[float, float]]:
    """Each program once per round, in turn; the (wall, CPU) medians in ms. One
    round first that is not counted (the file system's caches)."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in programs}
    for n in range(rounds + 1):
        for name, (argv, env) in programs.items():
            taken = run_once(argv, env)
            if n:
                times[name].append(taken)
    return {
        name: (
            statistics.median(w for w, _ in taken),
            statistics.median(c for _, c in taken),
        )
        for name, taken in times.items()
    }


def _compiled(tree: Path) -> None:
    compileall.compile_dir(str(tree / "sessiond"), quiet=1, workers=1)


def measure(
    work: Path,
    quick: bool,
    say: Callable[[str], None],
    baseline: Path | None = None,
) -> dict[str, object]:
    here = Path(__file__).resolve().parents[2]
    results: dict[str, object] = {"load_average_before": _load()}
    for tree in (here, *([baseline] if baseline else [])):
        _compiled(tree)
    root = work / "client"
    root.mkdir()
    write_sessions(root / "state", 20, 20)  # ps prints rows; send has a session
    d = BenchDaemon(root)
    try:
        d.start()
        call(d.socket, "ping", {})
        env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIOND_")}
        env["SESSIOND_SOCKET"] = str(d.socket)
        programs: dict[str, tuple[list[str], dict[str, str]]] = {"floor": (FLOOR, env)}
        for name, args in COMMANDS.items():
            programs[name] = ([str(BIN / "sessionctl"), *args], env)
        if baseline is not None:
            old = {**env, "PYTHONPATH": str(baseline)}
            for name, args in COMMANDS.items():
                argv = [sys.executable, "-P", "-c", OTHER_CTL, *args]
                programs[f"baseline_{name}"] = (argv, old)
        rounds = 15 if quick else 41
        say(f"measuring sessionctl ping, ps, send beside the floor ({rounds} rounds) ...")
        figures = interleaved(programs, rounds)
    finally:
        d.stop()
    shutil.rmtree(root)
    floor_wall, floor_cpu = figures["floor"]
    results["client_floor_ms"] = round(floor_wall, 1)
    results["client_floor_cpu_ms"] = round(floor_cpu, 1)
    for name, (wall, cpu) in figures.items():
        if name == "floor":
            continue
        command = name.removeprefix("baseline_")
        key = ("baseline_" if command != name else "") + f"sessionctl_{command}"
        results[f"{key}_process_ms"] = round(wall, 1)
        results[f"{key}_ratio"] = round(wall / floor_wall, 2)
        results[f"{key}_cpu_ratio"] = round(cpu / floor_cpu, 2)
    results.update(daemon_import(quick, say, baseline))
    results["load_average_after"] = _load()
    if baseline is not None:
        results["baseline_source"] = str(baseline)
    return results


IMPORT = "import sys, sessiond.daemon.service; print(len(sys.modules))"


def daemon_import(
    quick: bool, say: Callable[[str], None], baseline: Path | None
) -> dict[str, object]:
    """The import of the daemon's code beside ``python -c pass``; and its modules."""
    say("measuring the daemon's import ...")
    env = dict(os.environ)
    programs = {"bare": (BARE, env), "daemon": ([sys.executable, "-P", "-c", IMPORT], env)}
    if baseline is not None:
        programs["baseline"] = (
            [sys.executable, "-P", "-c", IMPORT],
            {**env, "PYTHONPATH": str(baseline)},
        )
    figures = interleaved(programs, 7 if quick else 21)
    bare = figures["bare"][0]
    results: dict[str, object] = {"python_pass_ms": round(bare, 1)}
    for name, (argv, penv) in programs.items():
        if name == "bare":
            continue
        prefix = "baseline_daemon" if name == "baseline" else "daemon"
        modules = subprocess.run(argv, env=penv, capture_output=True, text=True, check=True)
        results[f"{prefix}_import_ms"] = round(figures[name][0], 1)
        results[f"{prefix}_import_cpu_ms"] = round(figures[name][1], 1)
        results[f"{prefix}_import_modules"] = int(modules.stdout.strip())
    return results


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
