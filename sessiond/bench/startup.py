"""Start-up with many sessions: the first answer, and the full recovery, beside floors.

``N`` sessions of 100 events (10,000 by default) are written straight to disk and
opened once (no index yet), then stopped cleanly (every session snapshotted, the
table index written). Then, in turns, several times each, side by side:

- ``startup_*_clean``: a start after a clean stop;
- ``startup_*_kill9``: a start after a kill -9 of a daemon that had served (its
  background load under way or done);
- ``python_pass_s``: ``python -c pass`` from the same interpreter, and
  ``daemon_import_s``: a process that only imports the daemon's service module;
- ``index_read_s``: reading the table index and checking every entry against its
  log and spec (``sessiond.table.index``), in a process of its own, its imports
  excluded (and ``index_read_gc_off_s``, the same with the cyclic collector off, as
  the early server reads it: shown beside the bound, not in it);
- ``recovery_floor_s``: a bare Python process (orjson, zlib) that reads and parses
  what a start reads of each session: its spec cache, its newest snapshot (both
  lines, checksums and JSON), and its log from the snapshot's offset (each line's
  checksum and JSON).

The first answer's bound is 3 x ``python_pass_s`` + ``index_read_s``, the ratio
``startup_first_answer_ratio`` the worse first ``ps`` over it, all medians; beside
it, ``startup_first_answer_ratio_paired`` (and ``baseline_first_answer_ratio_paired``)
is the median of each round's ratio to the bound measured just before and just
after that round's starts (see _round).

For each start: the first ``ping`` answered, the first ``ps`` answered (from exec to
the answer's last byte; its rows, all of them, are decoded and counted after the
clock stops: decoding 10,000 rows is the client's own work, 15-30 ms), and the full
recovery (the daemon's ``daemon.ready`` line: every session's state proven, every
wake armed; a baseline older than that waits for every session to be open). Figures
are medians; the page cache is warm for all of them. The daemon's bytecode (this
tree's, and the baseline's) is compiled first, as an installed package's is: with
PYTHONDONTWRITEBYTECODE set (or a read-only tree) every start would compile each
module it imports again, which no installed daemon does, and which holds the GIL the
early server needs for its answers.
"""

from __future__ import annotations

import compileall
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

import sessiond
from sessiond.bench.daemon import BIN, BenchDaemon, write_sessions

FLOOR = r"""
import os, sys, zlib, orjson
root = sys.argv[1]
def body(line):
    b = line[:-9]
    if zlib.crc32(b) != int(line[-8:], 16):
        raise SystemExit("bad checksum")
    return orjson.loads(b)
events = 0
for name in os.listdir(root):
    if name[0] == ".":
        continue
    d = f"{root}/{name}"
    try:
        with open(f"{d}/spec.cache.json", "rb") as f:
            orjson.loads(f.read()[65:])
    except FileNotFoundError:
        open(f"{d}/spec.toml", "rb").read()
    offset = 0
    seqs = sorted(int(n[6:-5]) for n in os.listdir(f"{d}/snapshots") if n.startswith("state-"))
    if seqs:
        with open(f"{d}/snapshots/state-{seqs[-1]}.json", "rb") as f:
            header, state = f.read().split(b"\n")[:2]
        offset = body(header)["offset"]
        body(state)
    with open(f"{d}/events.jsonl", "rb") as f:
        f.seek(offset)
        data = f.read()
    for line in data.split(b"\n"):
        if line:
            body(line)
            events += 1
print(events)
"""

INDEX_READ = r"""
import sys, time
from pathlib import Path
from sessiond.table.index import plan, read_index
root = Path(sys.argv[1])
start = time.perf_counter()
entries, _ = read_index(root / "table.index")
planned = plan(root / "sessions", entries)
took = time.perf_counter() - start
assert not planned["first"], planned["first"][:5]
print(took)
"""


class Start:
    """One start of the benchmark daemon, timed from exec: first ping, first full
    ps, the ``daemon.ready`` line."""

    def __init__(self, d: BenchDaemon, count: int, source: Path | None = None) -> None:
        self.d = d
        self.count = count
        self.ready_at = 0.0
        self._ready = threading.Event()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIOND_")}
        program = [str(BIN / "sessiond")]
        if source is not None:  # another tree's daemon (a baseline), as BenchDaemon runs it
            program = [sys.executable, "-P", "-m", "sessiond"]
            env["PYTHONPATH"] = str(source)
        self.t0 = time.perf_counter()
        d.proc = subprocess.Popen(
            [*program, "--config", str(d.config), "--state-dir", str(d.state_dir),
             "--socket", str(d.socket)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        threading.Thread(target=self._watch, daemon=True).start()
        self.ping_at, self.ps_at = self._first_answers()

    def _watch(self) -> None:
        proc = self.d.proc
        assert proc is not None
        assert proc.stderr is not None
        try:
            for raw in proc.stderr:
                if b'"daemon.ready"' in raw and not self._ready.is_set():
                    self.ready_at = time.perf_counter() - self.t0
                    self._ready.set()
        except (ValueError, OSError):
            pass  # _kill9 closed the stream under this read: the daemon is gone
        self._ready.set()

    def _first_answers(self) -> tuple[float, float]:
        path = str(self.d.socket)
        while True:
            assert self.d.proc is not None
            if self.d.proc.poll() is not None:
                raise RuntimeError("the benchmark daemon exited")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                time.sleep(0.002)
                continue
            try:
                ping = _ask(sock, "ping")
                ping_at = time.perf_counter() - self.t0
                rows = _ask(sock, "ps")
                ps_at = time.perf_counter() - self.t0
            finally:
                sock.close()
            # decoded and checked after the clock stops: answered is the last byte
            # here; decoding 10,000 rows here (15-30 ms) is this client's own work
            assert orjson.loads(ping)["ok"], ping
            result = orjson.loads(rows)["result"]
            assert len(result) == self.count, len(result)
            return ping_at, ps_at

    def wait_ready(self) -> float:
        if not self._ready.wait(600) or not self.ready_at:
            raise RuntimeError("the benchmark daemon did not get ready")
        return self.ready_at


def _ask(sock: socket.socket, method: str) -> bytes:
    """The answer's bytes, to its last (a newline); not decoded (see Start)."""
    sock.sendall(orjson.dumps({"id": 1, "method": method, "params": {}}) + b"\n")
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1 << 22)
        if not chunk:
            raise RuntimeError("the daemon closed the connection")
        buf += chunk
    return bytes(buf)


def _kill9(d: BenchDaemon) -> None:
    assert d.proc is not None
    d.proc.kill()
    d.proc.wait(60)
    if d.proc.stderr is not None:
        d.proc.stderr.close()


def _timed(args: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(args, check=True, capture_output=True, text=True)
    return time.perf_counter() - start, done.stdout.strip()


def measure(
    work: Path,
    quick: bool,
    say: Any,
    count: int | None = None,
    *,
    repeats: int | None = None,
    baseline: Path | None = None,
) -> dict[str, float]:
    """The figures; with ``baseline`` (another source tree), its daemon's starts
    after a clean stop and after a kill -9 too, in each round (``baseline_*``)."""
    count = count or (2_000 if quick else 10_000)
    repeats = repeats or (3 if quick else 5)
    root = work / "startup"
    root.mkdir()
    for tree in (Path(sessiond.__file__).parent, baseline and baseline / "sessiond"):
        if tree:  # the bytecode as installed (see the module's docstring)
            compileall.compile_dir(tree, quiet=1)
    say(f"writing {count} sessions of 100 events ...")
    write_sessions(root / "state", count, 100)
    d = BenchDaemon(root)
    figures: dict[str, list[float]] = {}
    try:
        say("startup: a first start (no index, no snapshots), then a clean stop ...")
        first = Start(d, count)
        figures["startup_no_index_ps_s"] = [first.ps_at]
        figures["startup_no_index_ready_s"] = [first.wait_ready()]
        d.stop()
        for i in range(repeats):
            say(f"startup: round {i + 1} of {repeats} (clean, kill -9, floors) ...")
            for name, value in _round(d, count, baseline).items():
                figures.setdefault(name, []).append(value)
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)
    paired = {name: figures.pop(name) for name in list(figures) if name.endswith("_paired")}
    out = {name: round(statistics.median(values), 3) for name, values in figures.items()}
    # the medians of the rounds' own ratios, each start beside the bound measured
    # just before and just after it (see _round), the worse of the clean and the
    # kill -9 start's: reported beside the ratio of medians
    for which in ("startup", "baseline"):
        clean, kill9 = (paired.get(f"{which}_ps_{how}_ratio_paired") for how in ("clean", "kill9"))
        if clean and kill9:
            out[f"{which}_first_answer_ratio_paired"] = round(
                max(statistics.median(clean), statistics.median(kill9)), 2
            )
            say(f"startup: {which}'s first ps over its bound, by round: clean "
                f"{', '.join(f'{v:.2f}' for v in clean)}; kill -9 "
                f"{', '.join(f'{v:.2f}' for v in kill9)}")  # fmt: skip
    bound = 3 * out["python_pass_s"] + out["index_read_s"]
    out["startup_first_answer_bound_s"] = round(bound, 3)
    worst = max(out["startup_ps_clean_s"], out["startup_ps_kill9_s"])
    out["startup_first_answer_s"] = worst
    out["startup_first_answer_ratio"] = round(worst / bound, 2)
    # (informative: the bound with the index read as the early server reads it)
    gc_off = 3 * out["python_pass_s"] + out["index_read_gc_off_s"]
    out["startup_first_answer_ratio_gc_off"] = round(worst / gc_off, 2)
    out["full_recovery_floor_ratio"] = round(
        out["full_recovery_kill9_s"] / out["recovery_floor_s"], 2
    )
    out["startup_sessions"] = count
    return out


def _round(d: BenchDaemon, count: int, baseline: Path | None) -> dict[str, float]:
    """One round, side by side: a clean start, a start after kill -9, the floors
    (and the baseline's, both).

    Each tree's two starts are also put beside the bound measured just before and
    just after them (``_bound``: ``python -c pass`` and the index read, in processes
    of their own), and their ratio to the mean of the two is this round's
    ``*_ps_*_ratio_paired``. The medians below are each taken over all the
    rounds of one phase: on a shared machine the load moves between the phases of
    one round (a reference read once took 0.119 s and once 0.204 s in two quiet runs
    while the daemon's figure moved much less), and a ratio of medians taken in
    different phases carries that drift; a start and the references around it see
    about the same load."""
    out: dict[str, float] = {}
    before = _bound(d)
    s = Start(d, count)
    out["startup_ping_clean_s"], out["startup_ps_clean_s"] = s.ping_at, s.ps_at
    out["startup_ready_clean_s"] = s.wait_ready()
    _kill9(d)  # after it served and loaded: what the next start recovers from
    s = Start(d, count)
    out["startup_ping_kill9_s"], out["startup_ps_kill9_s"] = s.ping_at, s.ps_at
    out["full_recovery_kill9_s"] = s.wait_ready()
    d.stop()  # clean again for the next round
    between = _bound(d)
    for how in ("clean", "kill9"):
        out[f"startup_ps_{how}_ratio_paired"] = 2 * out[f"startup_ps_{how}_s"] / (before + between)
    if baseline is not None:
        s = Start(d, count, baseline)
        out["baseline_ping_clean_s"], out["baseline_ps_clean_s"] = s.ping_at, s.ps_at
        out["baseline_ready_clean_s"] = s.wait_ready()
        _kill9(d)
        s = Start(d, count, baseline)
        out["baseline_ping_kill9_s"], out["baseline_ps_kill9_s"] = s.ping_at, s.ps_at
        out["baseline_ready_kill9_s"] = s.wait_ready()
        d.stop()
        after = _bound(d)
        for how in ("clean", "kill9"):
            ratio = 2 * out[f"baseline_ps_{how}_s"] / (between + after)
            out[f"baseline_ps_{how}_ratio_paired"] = ratio
    out["python_pass_s"] = _timed([sys.executable, "-c", "pass"])[0]
    # what a start pays before it can read anything (issue 27's lean import path)
    out["daemon_import_s"] = _timed([sys.executable, "-c", "import sessiond.daemon.service"])[0]
    _, said = _timed([sys.executable, "-c", INDEX_READ, str(d.state_dir)])
    out["index_read_s"] = float(said)
    # beside it, not in the bound: the same read with the cyclic collector off, as
    # the early server reads the index (sessiond.ipc.early.open_server)
    _, said = _timed([sys.executable, "-c", "import gc; gc.disable()\n" + INDEX_READ,
                      str(d.state_dir)])  # fmt: skip
    out["index_read_gc_off_s"] = float(said)
    floor = [sys.executable, "-I", "-c", FLOOR, str(d.state_dir / "sessions")]
    out["recovery_floor_s"] = _timed(floor)[0]
    return out


def _bound(d: BenchDaemon) -> float:
    """The first answer's bound measured now: 3 x ``python -c pass`` + the index
    read (the same read and check as ``index_read_s``, on the state dir as a clean
    stop left it, which is what the next start reads)."""
    passed = _timed([sys.executable, "-c", "pass"])[0]
    _, said = _timed([sys.executable, "-c", INDEX_READ, str(d.state_dir)])
    return 3 * passed + float(said)
