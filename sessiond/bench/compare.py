"""``python -m sessiond.bench.compare [--quick] [--json] [--dir DIR]``: sessiond
side by side with what it is measured against, both sides in one invocation.

* ``sessionctl ps`` against ``supervisorctl status`` at 50 and 300 units, and
  stopping a daemon with 50 running programs against supervisord with 50;
* durable appends: group commit against a write+fsync-per-event loop writing the
  same framed lines, and encoding an event line against stdlib ``json``;
* replay against the raw read, checksum and orjson-parse floor of the same file;
* wake latency (watch, git) against a minimal watchfiles loop with the daemon's
  polling step that starts the same probe.

Each comparison is one row: both figures, their ratio (sessiond / the other), the
target and whether this run met it, and how long the row took. supervisor must
be installed (``make compare`` installs it into the venv); it runs on a private
socket in a temporary folder and is stopped afterwards.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from sessiond import __version__
from sessiond.bench import fsinfo, machine, run_async, storage, wakes
from sessiond.bench.daemon import BenchDaemon, call, write_sessions
from sessiond.codec import frame

BIN = Path(sys.executable).parent


def timed(argv: list[str], env: dict[str, str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


class Supervisor:
    def __init__(self, root: Path, programs: int) -> None:
        self.root = root
        self.conf = root / "supervisord.conf"
        sections = [
            "[unix_http_server]", f"file={root}/sup.sock", "",
            "[supervisord]", f"logfile={root}/supervisord.log", f"pidfile={root}/supervisord.pid",
            "nodaemon=true", f"childlogdir={root}", "",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface", "",
            "[supervisorctl]", f"serverurl=unix://{root}/sup.sock", "",
        ]  # fmt: skip
        for i in range(programs):
            sections += [f"[program:p{i}]", "command=sleep 3600", "autostart=true",
                         "startsecs=0", "stopwaitsecs=10", ""]  # fmt: skip
        self.conf.write_text("\n".join(sections))
        self.proc: subprocess.Popen[bytes] | None = None
        self.programs = programs

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(BIN / "supervisord"), "-c", str(self.conf)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = subprocess.run(
                [str(BIN / "supervisorctl"), "-c", str(self.conf), "status"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.stdout.count("RUNNING") == self.programs:
                return
            time.sleep(0.2)
        self.proc.kill()  # not left behind when the comparison gives up
        self.proc.wait()
        raise RuntimeError("supervisord did not start its programs")

    def status_ms(self, repeats: int) -> float:
        argv = [str(BIN / "supervisorctl"), "-c", str(self.conf), "status"]
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            subprocess.run(argv, check=False, stdout=subprocess.DEVNULL)  # exit 3 if any stopped
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)

    def stop_ms(self) -> float:
        assert self.proc is not None
        start = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        return (time.perf_counter() - start) * 1000


def sessiond_ps(root: Path, units: int, repeats: int) -> float:
    work = root / f"sd-{units}"
    work.mkdir()
    write_sessions(work / "state", units, 20)
    d = BenchDaemon(work)
    try:
        d.start()
        env = {**os.environ, "SESSIOND_SOCKET": str(d.socket)}
        return timed([str(BIN / "sessionctl"), "ps", "--json"], env, repeats)
    finally:
        d.stop()


def sessiond_stop_ms(root: Path, programs: int) -> float:
    work = root / "sd-stop"
    work.mkdir()
    d = BenchDaemon(work)
    d.config.write_text(f'log_format = "json"\nmax_running = {programs}\n')
    d.state_dir.mkdir()
    d.start()
    for i in range(programs):
        spec = f'name = "p{i}"\n[run]\nexec = ["sleep", "3600"]\ncwd = "{work}"\n'
        call(d.socket, "create", {"spec": spec, "base": str(work), "source": f"p{i}"})
        call(d.socket, "activate", {"name": f"p{i}"})
    assert d.proc is not None
    start = time.perf_counter()
    d.proc.send_signal(signal.SIGTERM)
    d.proc.wait(120)
    took = (time.perf_counter() - start) * 1000
    d.stop()
    return took


@dataclass(frozen=True)
class Sizes:
    """How much each comparison measures. The unit and program counts the targets
    are stated for (300 units, 50 programs, 32 writers) are the same in every size
    but the tiny one the tests use."""

    ps_units: tuple[int, ...] = (50, 300)
    repeats: int = 10  # sessionctl / supervisorctl runs per figure
    stop_programs: int = 50
    rounds: int = 3  # alternations of the fsync-each loop and group commit
    fsync_seconds: float = 3.0
    group_seconds: float = 4.0
    writers: int = 32
    encode_events: int = 50_000
    replay_events: int = 200_000
    replay_repeats: int = 7
    wake_samples: int = 40
    step_ms: int = 15  # the daemon's default watch_step_ms, given to both sides


FULL = Sizes()
QUICK = Sizes(
    repeats=3,
    rounds=1,
    fsync_seconds=1.0,
    group_seconds=1.5,
    encode_events=10_000,
    replay_events=50_000,
    replay_repeats=3,
    wake_samples=10,
)

# row key -> (comparison, bound) on the ratio sessiond / the other side
TARGETS: dict[str, tuple[str, float]] = {
    "ps_300": ("<=", 0.7),
    "stop_50": ("<=", 0.3),
    "group_commit": (">=", 10.0),
    "replay": (">=", 0.5),
    "watch_wake": ("<=", 1.5),
    "git_wake": ("<=", 1.5),
}


@dataclass(frozen=True)
class Row:
    """One comparison: sessiond's figure, the other side's, and their ratio."""

    key: str
    what: str
    ours: float
    theirs: float
    unit: str
    against: str
    seconds: float  # how long measuring both sides took
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.ours / self.theirs

    @property
    def target(self) -> tuple[str, float] | None:
        return TARGETS.get(self.key)

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        op, bound = self.target
        return self.ratio >= bound if op == ">=" else self.ratio <= bound

    def as_dict(self) -> dict[str, object]:
        target = self.target
        return {
            **asdict(self),
            "ratio": round(self.ratio, 3),
            "target": None if target is None else f"{target[0]} {target[1]:g}",
            "met": self.met,
        }


def _stopwatch() -> Callable[[], float]:
    start = time.perf_counter()
    return lambda: round(time.perf_counter() - start, 1)


def ps_rows(root: Path, sizes: Sizes, say: Callable[[str], None]) -> list[Row]:
    rows = []
    for units in sizes.ps_units:
        say(f"sessionctl ps / supervisorctl status at {units} units ...")
        took = _stopwatch()
        ours = sessiond_ps(root, units, sizes.repeats)
        sup_root = root / f"sup-{units}"
        sup_root.mkdir()
        sup = Supervisor(sup_root, units)
        sup.start()
        try:
            theirs = sup.status_ms(sizes.repeats)
        finally:
            sup.stop_ms()
        rows.append(Row(
            f"ps_{units}", f"`sessionctl ps --json`, {units} units", ours, theirs, "ms",
            "`supervisorctl status`", took(), f"median of {sizes.repeats} runs of each process",
        ))  # fmt: skip
    return rows


def stop_row(root: Path, sizes: Sizes, say: Callable[[str], None]) -> Row:
    n = sizes.stop_programs
    say(f"stopping each daemon with {n} running programs ...")
    took = _stopwatch()
    ours = sessiond_stop_ms(root, n)
    sup_root = root / "sup-stop"
    sup_root.mkdir()
    sup = Supervisor(sup_root, n)
    sup.start()
    theirs = sup.stop_ms()
    return Row(
        f"stop_{n}", f"SIGTERM to exit, {n} running programs", ours, theirs, "ms",
        "supervisord", took(), "the programs are `sleep 3600`",
    )  # fmt: skip


def group_commit_row(work: Path, sizes: Sizes, say: Callable[[str], None]) -> Row:
    """The two sides alternate, ``rounds`` times each, so that a slow phase of a
    shared host does not fall on one side only; the medians are compared."""
    say(f"durable appends: group commit ({sizes.writers} writers) / write+fsync per event ...")
    took = _stopwatch()
    each, grouped, per_fsync = [], [], []
    for i in range(sizes.rounds):
        folder = work / f"fsync-each-{i}"
        folder.mkdir()
        each.append(storage.fsync_each_eps(folder, sizes.fsync_seconds, max_events=1 << 40))
        shutil.rmtree(folder)
        folder = work / f"group-commit-{i}"
        folder.mkdir()
        eps, fsyncs = run_async(
            functools.partial(storage.group_commit_eps, folder, sizes.writers, sizes.group_seconds)
        )
        grouped.append(eps)
        per_fsync.append(eps * sizes.group_seconds / max(fsyncs, 1))
        shutil.rmtree(folder)
    return Row(
        "group_commit", f"durable appends, group commit, {sizes.writers} writers",
        statistics.median(grouped), statistics.median(each), "events/s", "write+fsync per event",
        took(), f"same framed lines; median of {sizes.rounds} alternated rounds; "
        f"~{statistics.median(per_fsync):.0f} appends per fsync",
    )  # fmt: skip


def encoding_row(sizes: Sizes, say: Callable[[str], None]) -> Row:
    say("encoding an event line: orjson / stdlib json ...")
    took = _stopwatch()
    record = {
        "v": 1, "session": "bench", "seq": 123, "id": "0" * 32, "ts": "2026-11-29T09:00:00.000000Z",
        "type": "tool.finished", "causation": None, "correlation": "c1",
        "data": {"call": "c1", "tool": "edit_file", "status": "ok", "exit_code": 0,
                 "hashes": {"docs/api.md": "a" * 64}, "truncated": False, "duration_ms": 12},
    }  # fmt: skip
    n = sizes.encode_events
    start = time.perf_counter()
    for _ in range(n):
        frame(orjson.dumps(record))
    ours = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(n):
        frame(json.dumps(record, separators=(",", ":")).encode())
    stdlib = time.perf_counter() - start
    return Row(
        "encoding", "encoding an event line: orjson + CRC", ours / n * 1e6, stdlib / n * 1e6,
        "µs", "stdlib `json` + CRC", took(), f"{n:,} lines each",
    )  # fmt: skip


def replay_row(work: Path, sizes: Sizes, say: Callable[[str], None]) -> Row:
    n = sizes.replay_events
    say(f"replay of a {n}-event log / its raw read-and-parse floor ...")
    took = _stopwatch()
    folder = work / "replay"
    folder.mkdir()
    ours, floor = run_async(lambda: storage.replay_eps(folder, n, repeats=sizes.replay_repeats))
    shutil.rmtree(folder)
    return Row(
        "replay", f"replay, {n:,} events (verify, fold)", ours, floor, "events/s",
        "read + CRC + orjson parse", took(),
        f"the floor does no fold and no seq check; median of {sizes.replay_repeats}, alternated",
    )  # fmt: skip


def wake_rows(root: Path, sizes: Sizes, say: Callable[[str], None]) -> list[Row]:
    """The daemon's watch trigger runs with debounce 0 here: the floor has none, and
    the default 200 ms would only add itself to the daemon's side."""
    root = (root / "wakes").resolve()
    root.mkdir()
    n, step = sizes.wake_samples, sizes.step_ms
    say(f"watch wake (debounce 0) / watchfiles loop, {n} samples each ...")
    took = _stopwatch()
    ours = wakes.watch_wake(root, "0ms", n, step)
    theirs = wakes.watch_floor(root, n, step)
    watch = Row(
        "watch_wake", "watch wake p50, debounce 0", ours, theirs, "ms",
        f"watchfiles loop, step {step} ms", took(),
        f"file write to the probe's first instruction; the daemon's default debounce (200 ms) "
        f"is set to 0 as the floor has none; both poll every {step} ms; {n} samples",
    )  # fmt: skip
    say(f"git wake / watchfiles loop on refs/heads, {n} samples each ...")
    took = _stopwatch()
    ours = wakes.git_wake(root, n)
    theirs = wakes.git_floor(root, n, step)
    git = Row(
        "git_wake", "git wake p50", ours, theirs, "ms",
        "watchfiles loop on refs/heads", took(),
        f"finished `git commit` to the probe's first instruction; the git trigger has no "
        f"debounce; both poll every {step} ms; {n} samples",
    )  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    return [watch, git]


def run(
    root: Path, work: Path, sizes: Sizes, say: Callable[[str], None], *, supervisor: bool = True
) -> list[Row]:
    """Every comparison; daemons and sockets under ``root`` (short paths), event logs
    under ``work`` (the disk the daemon would write to). Without ``supervisor``,
    the rows against supervisord are left out."""
    rows = []
    if supervisor:
        rows += ps_rows(root, sizes, say)
        rows.append(stop_row(root, sizes, say))
    rows.append(group_commit_row(work, sizes, say))
    rows.append(encoding_row(sizes, say))
    rows.append(replay_row(work, sizes, say))
    rows += wake_rows(root, sizes, say)
    return rows


def _figure(value: float, unit: str) -> str:
    if unit == "events/s":
        return f"{value:,.0f}/s"
    if unit == "ms" and value >= 1000:
        return f"{value:,.0f} ms"
    return f"{value:.3g} {unit}" if value < 10 else f"{value:.1f} {unit}"


def render(rows: list[Row]) -> list[str]:
    """The table: one line per comparison."""
    header = ("sessiond", "", "against", "", "ratio", "target", "met", "took")
    table = [header]
    for row in rows:
        target = row.target
        met = {None: "", True: "yes", False: "MISSED"}[row.met]
        table.append((
            row.what, _figure(row.ours, row.unit), row.against, _figure(row.theirs, row.unit),
            f"{row.ratio:.2f}", "" if target is None else f"{target[0]} {target[1]:g}", met,
            f"{row.seconds:.0f} s",
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", "ratio = sessiond / the other side. Notes:"]
    lines += [f"  {row.what}: {row.note}" for row in rows if row.note]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessiond.bench.compare", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and samples (~45 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to write the event logs (default: a temporary folder under .bench-work/ "
        "in the current folder, the disk the daemon would use)",
    )
    args = parser.parse_args(argv)
    if shutil.which("supervisord", path=str(BIN)) is None:
        print(
            "supervisor is not installed in this environment: run 'make compare'", file=sys.stderr
        )
        return 2
    sizes = QUICK if args.quick else FULL

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    base = args.dir or Path(".bench-work")
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cmp-", dir=base))
    # Daemons and supervisord listen on AF_UNIX sockets: their paths must stay short.
    root = Path(tempfile.mkdtemp(prefix="cmp-", dir="/tmp"))
    total = _stopwatch()
    try:
        fs = fsinfo.fs_type(work)
        fsync_ms = fsinfo.fsync_median_ms(work)
        rows = run(root, work, sizes, say)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "sessiond": __version__,
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "dir": str(work.parent.resolve()),
        "fs_type": fs,
        "fsync_median_ms": round(fsync_ms, 3),
        "rows": [r.as_dict() for r in rows],
        "seconds": total(),
    }
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_APPEND_NEWLINE))
        return 0
    m = report["machine"]
    print(f"sessiond {__version__}, {report['date']}, {m['cpu']} ({m['cores']} cores), "
          f"Python {m['python']}, Linux {m['kernel']}")  # fmt: skip
    print(f"event logs on {fs} in {report['dir']}, median fsync {fsync_ms:.2f} ms")
    print()
    for line in render(rows):
        print(line)
    print()
    print(f"took {report['seconds']:.0f} s" + (" (--quick)" if args.quick else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
