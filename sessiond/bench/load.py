"""`make load`: many concurrent clients against a big, busy daemon.

A daemon holds 10,000 sessions (written to disk first, as after any restart)
while 50 of them run programs. 1,000 clients, each an asyncio connection in
this one process, send requests back to back for 30 seconds: mostly `show` of
a random session, some `ping`, `log` tails and `send`s, and now and then a
full `ps`. The report gives throughput, p50/p99 latency per method, errors
(which must be 0) and the daemon's RSS before and after. Not part of `make test`.

    python -m sessiond.bench.load [--clients N] [--seconds S] [--sessions N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import orjson

from sessiond.bench.daemon import BenchDaemon, call, write_sessions
from sessiond.wire import Params

RUNNERS = 50
RSS_GROWTH_BOUND_MB = 64.0  # after warm-up; more than this is reported as a failure


def mix(rng: random.Random, sessions: int, runners: list[str]) -> tuple[str, Params]:
    """One request, drawn the way a fleet of harnesses and dashboards would send them."""
    roll = rng.random()
    name = f"s{rng.randrange(sessions):05d}"
    if roll < 0.60:
        return "show", {"name": name}
    if roll < 0.80:
        return "ping", {}
    if roll < 0.90:
        return "log", {"name": rng.choice(runners), "since": 1, "limit": 20}
    if roll < 0.999:  # a full ps of 10,000 rows costs ~30 ms: a dashboard's rate, not more
        return "send", {"to": name, "text": "load", "sender": "load"}
    return "ps", {}


class MethodFigures(TypedDict):
    count: int
    p50_ms: float
    p99_ms: float


class LoadReport(TypedDict):
    """What a load run reports (``--json`` prints it as it is)."""

    machine: str
    clients: int
    seconds: float
    sessions: int
    running_during_load: int
    running_after_load: int
    requests: int
    throughput_rps: int
    p50_ms: float | None
    p99_ms: float | None
    per_method: dict[str, MethodFigures]
    errors: int
    first_errors: list[str]
    rss_before_mb: float
    rss_after_mb: float
    rss_growth_bound_mb: float


@dataclass
class Storm:
    path: Path
    sessions: int
    runners: list[str]
    until: float
    lat: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)


async def client(storm: Storm, seed: int) -> None:
    rng = random.Random(seed)
    reader, writer = await asyncio.open_unix_connection(str(storm.path), limit=1 << 26)
    try:
        n = 0
        while time.monotonic() < storm.until:
            method, params = mix(rng, storm.sessions, storm.runners)
            n += 1
            frame = orjson.dumps({"id": n, "method": method, "params": params}) + b"\n"
            start = time.perf_counter()
            writer.write(frame)
            line = await reader.readline()
            took = (time.perf_counter() - start) * 1000
            reply = orjson.loads(line)
            if reply.get("id") != n or "error" in reply:
                storm.errors.append(f"{method}: {reply.get('error')}")
            else:
                storm.lat[method].append(took)
    except (OSError, ValueError) as exc:
        storm.errors.append(f"client {seed}: {exc!r}")
    finally:
        writer.close()


async def blow(
    path: Path, clients: int, seconds: float, sessions: int, runners: list[str]
) -> tuple[dict[str, list[float]], list[str], float]:
    start = time.monotonic()
    storm = Storm(path, sessions, runners, start + seconds)
    await asyncio.gather(*(client(storm, i) for i in range(clients)))
    return storm.lat, storm.errors, time.monotonic() - start


def wait_running(d: BenchDaemon, wanted: int, timeout: float = 30.0) -> int:
    """How many sessions run, once ``wanted`` do (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        running = sum(1 for r in call(d.socket, "ps", {}) if r["state"] == "running")
        if running >= wanted or time.monotonic() > deadline:
            return running
        time.sleep(0.1)


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


def run(clients: int, seconds: float, sessions: int, say: Any) -> LoadReport:
    raise_fd_limit(clients + 256)
    root = Path(tempfile.mkdtemp(prefix="sd-load-"))
    try:
        say(f"writing {sessions} sessions ...")
        write_sessions(root / "state", sessions, 20)
        d = BenchDaemon(root)
        d.config.write_text(f'log_format = "json"\nlog_level = "info"\nmax_running = {RUNNERS}\n')
        say("starting the daemon ...")
        d.start()
        try:
            runners = [f"run{i:02d}" for i in range(RUNNERS)]
            for name in runners:
                spec = (
                    f'name = "{name}"\n[run]\nexec = ["sh", "-c", "sleep {int(seconds) + 120}"]\n'
                    f'cwd = "{root}"\nside_effect = "none"\nidempotency = "safe"\n'
                )
                call(d.socket, "create", {"spec": spec, "base": str(root)})
                call(d.socket, "activate", {"name": name})
            running = wait_running(d, RUNNERS)
            say(f"{running} sessions running; warming up ...")
            # Warm-up at full concurrency, so the RSS compared below is that of
            # the same load before and after, not of 1,000 connections opening.
            asyncio.run(blow(d.socket, clients, 5.0, sessions, runners))
            rss_before = d.rss_mb()
            say(f"{clients} clients for {seconds:.0f} s ...")
            lat, errors, took = asyncio.run(blow(d.socket, clients, seconds, sessions, runners))
            rss_after = d.rss_mb()
            still = sum(1 for r in call(d.socket, "ps", {}) if r["state"] == "running")
        finally:
            d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total = sum(len(v) for v in lat.values())
    every = sorted(x for v in lat.values() for x in v)
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, {platform.python_version()}",
        "clients": clients,
        "seconds": round(took, 1),
        "sessions": sessions,
        "running_during_load": running,
        "running_after_load": still,
        "requests": total,
        "throughput_rps": round(total / took),
        "p50_ms": round(statistics.median(every), 2) if every else None,
        "p99_ms": round(every[int(len(every) * 0.99)], 2) if every else None,
        "per_method": {
            m: {
                "count": len(v),
                "p50_ms": round(statistics.median(v), 2),
                "p99_ms": round(sorted(v)[int(len(v) * 0.99)], 2),
            }
            for m, v in sorted(lat.items())
        },
        "errors": len(errors),
        "first_errors": errors[:5],
        "rss_before_mb": round(rss_before, 1),
        "rss_after_mb": round(rss_after, 1),
        "rss_growth_bound_mb": RSS_GROWTH_BOUND_MB,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m sessiond.bench.load", description=__doc__)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    def say(text: str) -> None:
        print(f"load: {text}", file=sys.stderr, flush=True)

    result = run(args.clients, args.seconds, args.sessions, say)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        for key, value in result.items():
            if key != "per_method":
                print(f"{key:>22}  {value}")
        print(f"{'method':>22}  {'count':>8} {'p50 ms':>8} {'p99 ms':>8}")
        for method, f in result["per_method"].items():
            print(f"{method:>22}  {f['count']:>8} {f['p50_ms']:>8} {f['p99_ms']:>8}")
    grew = result["rss_after_mb"] - result["rss_before_mb"]
    failed = []
    if result["errors"]:
        failed.append(f"{result['errors']} errors (first: {result['first_errors']})")
    if grew > RSS_GROWTH_BOUND_MB:
        failed.append(f"RSS grew {grew:.0f} MB, more than {RSS_GROWTH_BOUND_MB:.0f} MB")
    if result["running_after_load"] < result["running_during_load"]:
        failed.append("running sessions were lost during the load")
    for reason in failed:
        print(f"load: FAILED: {reason}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
