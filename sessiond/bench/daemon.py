"""Benchmarks of the daemon as a process: RPC latency, ps, start-up, memory, sessionctl."""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from sessiond.bench import storage
from sessiond.codec import frame
from sessiond.log.event_data import (
    LifecycleChanged,
    MessageReceived,
    RunFinished,
    RunStarted,
    SessionCreated,
    WakeRequested,
)
from sessiond.log.store.base import Draft
from sessiond.log.store.lines import RecordBuilder
from sessiond.table.spec import parse_spec, spec_to_toml
from sessiond.wire import Params

BIN = Path(sys.executable).parent


def run_cycles() -> Iterator[list[Draft]]:
    """Run after run of a working session: a message wakes it, three tool calls
    (intent, policy, started, finished, observation), then it sleeps again."""
    run = 0
    while True:
        run += 1
        cycle = [
            Draft(MessageReceived(sender="bench", text=f"please do task {run}")),
            Draft(WakeRequested(trigger="message")),
            Draft(LifecycleChanged(from_state="sleeping", to="running", reason="message")),
            Draft(RunStarted(run=f"r{run}", pid=1000 + run)),
        ]
        for call in range(3):
            cycle += storage.tool_call(run * 10 + call)
        cycle += [
            Draft(RunFinished(run=f"r{run}", status="ok", exit_code=0, duration_ms=1500)),
            Draft(LifecycleChanged(from_state="running", to="sleeping", reason="done")),
        ]
        yield cycle


def session_events(name: str, goal: str, agent: str, events: int) -> list[Draft]:
    """What a session that has done some work holds: its creation, runs woken by
    messages, tool calls (intent, policy, started, finished, observation), then
    sleep — ``events`` of them in all."""
    drafts: list[Draft] = [
        Draft(SessionCreated(name=name, goal=goal, agent=agent)),
        Draft(LifecycleChanged(from_state="created", to="sleeping", reason="armed")),
    ]
    for cycle in run_cycles():
        if len(drafts) + len(cycle) > events:
            break
        drafts += cycle
    # Whole runs only (sleeping at the end, as after a clean stop), topped up
    # with messages that arrived since.
    while len(drafts) < events:
        drafts.append(Draft(MessageReceived(sender="bench", text="later")))
    return drafts


def write_sessions(state_dir: Path, count: int, events: int) -> None:
    """``count`` sessions of ``events`` events each, written straight to disk (setup
    only: the daemon reads them as it would after any restart)."""
    sessions = state_dir / "sessions"
    sessions.mkdir(parents=True, mode=0o700)
    for i in range(count):
        name = f"s{i:05d}"
        folder = sessions / name
        folder.mkdir(mode=0o700)
        (folder / "artifacts").mkdir(mode=0o700)
        (folder / "snapshots").mkdir(mode=0o700)
        spec = parse_spec(
            f'name = "{name}"\ngoal = "benchmark session {i}"\nagent = "a{i % 10}"\n',
            base=folder,
        )
        (folder / "spec.toml").write_text(spec_to_toml(spec))
        drafts = session_events(name, spec.goal, spec.agent, events)
        records, _ = RecordBuilder(name, time.time_ns).build(0, drafts)
        with open(folder / "events.jsonl", "wb") as f:
            f.write(b"".join(frame(orjson.dumps(r)) for r in records))
    os.sync()  # on disk, as a daemon's own appends would be


class BenchDaemon:
    def __init__(self, root: Path, source: Path | None = None, config: str = "") -> None:
        self.root = root
        self.source = source  # another source tree's daemon (a baseline), else this one
        self.state_dir = root / "state"
        # in a folder of its own: never a session's workspace (the runs' uid may write that)
        self.socket = root / "sock" / "s.sock"
        self.config = root / "sessiond.toml"
        self.config.write_text('log_format = "json"\nlog_level = "info"\n' + config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready = threading.Event()

    def start(self) -> float:
        """Start; seconds until the daemon logged that it serves."""
        self.ready.clear()
        started = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIOND_")}
        program = [str(BIN / "sessiond")]
        if self.source is not None:
            # -P: not the current folder first on sys.path (it may be this tree)
            program = [sys.executable, "-P", "-m", "sessiond"]
            env["PYTHONPATH"] = str(self.source)
        self.proc = subprocess.Popen(
            [
                *program,
                "--config",
                str(self.config),
                "--state-dir",
                str(self.state_dir),
                "--socket",
                str(self.socket),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        threading.Thread(target=self._watch, daemon=True).start()
        if not self.ready.wait(300) or self.proc.poll() is not None:
            raise RuntimeError("the benchmark daemon did not start")
        return time.perf_counter() - started

    def _watch(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            if b'"daemon.ready"' in raw:
                self.ready.set()
        self.ready.set()

    def rss_mb(self) -> float:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(120)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()


def rpc_latencies_ms(path: Path, method: str, count: int) -> list[float]:
    """Round trips of one method on one open connection."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    request = orjson.dumps({"id": 1, "method": method, "params": {}}) + b"\n"
    times = []
    buf = b""
    try:
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(request)
            while b"\n" not in buf:
                buf += sock.recv(1 << 20)
            _, buf = buf.split(b"\n", 1)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        sock.close()
    return times


def sessionctl_ms(path: Path, args: list[str], repeats: int) -> float:
    """Median wall time of a whole `sessionctl` process."""
    env = {**os.environ, "SESSIOND_SOCKET": str(path)}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(
            [str(BIN / "sessionctl"), *args], env=env, check=True, stdout=subprocess.DEVNULL
        )
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(work: Path, quick: bool, say: Any) -> dict[str, float]:
    results: dict[str, float] = {}
    big = 10_000

    root = work / "ps300"
    root.mkdir()
    write_sessions(root / "state", 300, 20)
    d = BenchDaemon(root)
    try:
        d.start()
        say("measuring rpc_ping_p50_ms, sessionctl_ps_300_ms ...")
        results["rpc_ping_p50_ms"] = round(
            statistics.median(rpc_latencies_ms(d.socket, "ping", 2000)), 3
        )
        results["sessionctl_ps_300_ms"] = round(
            sessionctl_ms(d.socket, ["ps", "--json"], 10 if quick else 30), 1
        )
        results["sessionctl_ping_ms"] = round(
            sessionctl_ms(d.socket, ["ping"], 10 if quick else 30), 1
        )
    finally:
        d.stop()
    shutil.rmtree(root)

    say("measuring wake_to_exec_p50_ms, sdk_tool_roundtrip_p50_ms ...")
    results.update(wake_and_sdk(work, quick))

    say(f"writing {big} sessions of 100 events ...")
    root = work / "big"
    root.mkdir()
    write_sessions(root / "state", big, 100)
    d = BenchDaemon(root)
    try:
        say("measuring startup_10k_cold_s (no snapshots) ...")
        results["startup_10k_cold_s"] = round(d.start(), 2)
        d.stop()  # a clean stop snapshots every session
        say("measuring startup_10k_s, ps_10k_ms, daemon_rss_10k_mb ...")
        results["startup_10k_s"] = round(d.start(), 2)
        results["daemon_rss_10k_mb"] = round(d.rss_mb(), 1)
        results["ps_10k_ms"] = round(
            statistics.median(rpc_latencies_ms(d.socket, "ps", 5 if quick else 15)), 1
        )
    finally:
        d.stop()
    shutil.rmtree(root)
    return results


SDK_PROBE = """
import statistics, time, sys
from sessiond.sdk import connect
with connect() as run:
    times = []
    for i in range({n}):
        start = time.perf_counter()
        run.step("probe", lambda: None, args={{"i": i}}, side_effect="none", idempotency="safe")
        times.append((time.perf_counter() - start) * 1000)
    open("sdk.ms.tmp", "w").write(str(statistics.median(times)))
    __import__("os").rename("sdk.ms.tmp", "sdk.ms")
"""


def _wait_file(path: Path, timeout: float = 30.0) -> str:
    """The file's content once it has some (a writer may have created it empty)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text().strip()
            if text:
                return text
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} was not written")
        time.sleep(0.001)


def wake_and_sdk(work: Path, quick: bool) -> dict[str, float]:
    """``wake_to_exec_p50_ms``: from the activate request to the first instruction of
    a shell one-liner probe (gate included), its run confined by the sandbox as by
    default, and ``wake_to_exec_unconfined_p50_ms`` the same with ``[run] sandbox =
    "off"``; ``sdk_tool_roundtrip_p50_ms``: one ``run.step`` with an empty body, its
    events durable (sessiond.bench.steps has the step figures beside their floor)."""
    n = 20 if quick else 100
    confined, sdk_ms = _wake(work / "wake", n, sdk=200 if quick else 1000)
    unconfined, _ = _wake(work / "wake-off", n, config='[run]\nsandbox = "off"\n')
    return {
        "wake_to_exec_p50_ms": confined,
        "wake_to_exec_unconfined_p50_ms": unconfined,
        "sandbox_wake_overhead_ms": round(confined - unconfined, 2),
        "sdk_tool_roundtrip_p50_ms": round(sdk_ms, 2),
    }


def _wake(root: Path, n: int, *, sdk: int = 0, config: str = "") -> tuple[float, float]:
    """The median wake-to-exec of ``n`` wakes (ms), and of ``sdk`` steps, if any."""
    root = root.resolve()
    root.mkdir()
    probe = root / "ts"
    spec = (
        f'name = "probe"\n[run]\nexec = ["bash", "-c", "echo $EPOCHREALTIME > {probe}"]\n'
        f'cwd = "{root}"\n[[trigger]]\ntype = "message"\n'
    )
    sdk_script = root / "sdk_probe.py"
    sdk_script.write_text(SDK_PROBE.format(n=sdk))
    pythonpath = str(Path(__file__).parents[2])
    sdk_spec = (
        f'name = "sdkprobe"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{sdk_script}"]\n'
        f'cwd = "{root}"\nenv = {{ PYTHONPATH = "{pythonpath}" }}\n'
    )
    d = BenchDaemon(root, config=config)
    d.state_dir.mkdir(parents=True)
    sdk_ms = 0.0
    try:
        d.start()
        for name, text in (("probe", spec), ("sdkprobe", sdk_spec)):
            call(d.socket, "create", {"spec": text, "base": str(root), "source": name})
        delays = []
        for _ in range(n):
            probe.unlink(missing_ok=True)
            start = time.time()
            call(d.socket, "activate", {"name": "probe"})
            stamp = float(_wait_file(probe))
            while True:  # the run ends (sleeping again) before the next activate
                if call(d.socket, "show", {"name": "probe"})["state"] == "sleeping":
                    break
                time.sleep(0.001)
            delays.append((stamp - start) * 1000)
        if sdk:
            call(d.socket, "activate", {"name": "sdkprobe"})
            sdk_ms = float(_wait_file(root / "sdk.ms", timeout=300))
    finally:
        d.stop()
    shutil.rmtree(root)
    return round(statistics.median(delays), 2), sdk_ms


def call(path: Path, method: str, params: Params) -> Any:
    from sessiond.wire import Connection

    with Connection(path) as conn:
        return conn.call(method, params)
