"""``python -m sessiond.bench.compare``: sessiond beside supervisord, in one run.

Both sides run on this machine in the same invocation, and each comparison is
reported as a ratio: `sessionctl ps` against `supervisorctl status` at 50 and 300
units, and stopping a daemon with 50 running programs. supervisor must be
installed (``make compare`` installs it into the venv); it is started on a
private socket in a temporary folder and stopped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

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


def encoding_ratio(n: int = 50_000) -> dict[str, float]:
    record = {
        "v": 1, "session": "bench", "seq": 123, "id": "0" * 32, "ts": "2026-11-29T09:00:00.000000Z",
        "type": "tool.finished", "causation": None, "correlation": "c1",
        "data": {"call": "c1", "tool": "edit_file", "status": "ok", "exit_code": 0,
                 "hashes": {"docs/api.md": "a" * 64}, "truncated": False, "duration_ms": 12},
    }  # fmt: skip
    start = time.perf_counter()
    for _ in range(n):
        frame(orjson.dumps(record))
    ours = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(n):
        frame(json.dumps(record, separators=(",", ":")).encode())
    stdlib = time.perf_counter() - start
    return {
        "encode_orjson_us": round(ours / n * 1e6, 2),
        "encode_json_us": round(stdlib / n * 1e6, 2),
        "encode_ratio": round(ours / stdlib, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessiond.bench.compare", description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    if shutil.which("supervisord", path=str(BIN)) is None:
        print(
            "supervisor is not installed in this environment: run 'make compare'", file=sys.stderr
        )
        return 2
    root = Path(tempfile.mkdtemp(prefix="cmp-", dir="/tmp"))
    results: dict[str, Any] = {}
    try:
        for units in (50, 300):
            print(f"ps / status at {units} units ...", file=sys.stderr)
            ours = sessiond_ps(root, units, args.repeats)
            sup_root = root / f"sup-{units}"
            sup_root.mkdir()
            sup = Supervisor(sup_root, units)
            sup.start()
            try:
                theirs = sup.status_ms(args.repeats)
            finally:
                sup.stop_ms()
            results[f"sessionctl_ps_{units}_ms"] = round(ours, 1)
            results[f"supervisorctl_status_{units}_ms"] = round(theirs, 1)
            results[f"ps_ratio_{units}"] = round(ours / theirs, 2)
        print("stopping with 50 running programs ...", file=sys.stderr)
        results["sessiond_stop_50_ms"] = round(sessiond_stop_ms(root, 50), 1)
        sup_root = root / "sup-stop"
        sup_root.mkdir()
        sup = Supervisor(sup_root, 50)
        sup.start()
        results["supervisord_stop_50_ms"] = round(sup.stop_ms(), 1)
        results["stop_ratio_50"] = round(
            results["sessiond_stop_50_ms"] / results["supervisord_stop_50_ms"], 2
        )
        results.update(encoding_ratio())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
    else:
        for key, value in results.items():
            print(f"{key:<28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
