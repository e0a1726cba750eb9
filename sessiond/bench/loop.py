"""Does the daemon stay responsive while it works through a big session?

One session of 100,000 events (tool calls whose output is a real artifact, runs
woken by messages). While another process asks the daemon to ``log``,
``replay``, ``fork`` or ``export`` it, this one sends ``ping`` after ``ping`` on
its own connection and times each round trip: the p50, p99 and worst of those
pings are the figures (``loop_<op>_ping_p99_ms``; target <= 10 ms). The clock
runs from the moment the other process has sent its request to the moment it
has its whole answer, so what it does with the answer afterwards is not counted.

``python -m sessiond.bench --loop-only --baseline SRC`` measures the same with
the daemon of another source tree (say an older commit, unpacked with ``git
archive``) side by side, in the same run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

import orjson

from sessiond.bench import hold
from sessiond.bench.daemon import BenchDaemon
from sessiond.codec import frame
from sessiond.log.event_data import (
    ArtifactRef,
    LifecycleChanged,
    MessageReceived,
    ObservationProjected,
    PolicyDecided,
    RiskContract,
    RunFinished,
    RunStarted,
    SessionCreated,
    ToolFinished,
    ToolIntent,
    ToolStarted,
    WakeRequested,
)
from sessiond.log.store.base import Draft
from sessiond.log.store.lines import RecordBuilder


class Op(TypedDict):
    """A request whose answer the loop serves while it is pinged."""

    method: str
    params: dict[str, str]


OPS: dict[str, Op] = {
    "log": {"method": "log", "params": {"name": "big"}},
    "replay": {"method": "replay", "params": {"name": "big", "view": "messages"}},
    "fork": {"method": "fork", "params": {"name": "big", "new": "child"}},
    "export": {"method": "export", "params": {"name": "big"}},
}

# The other process: send one request, read the whole answer (and an export's
# body), say when it sent and when it had everything.
CLIENT = r"""
import socket, sys
import orjson
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
request = {"id": 1, "method": sys.argv[2], "params": orjson.loads(sys.argv[3])}
sock.sendall(orjson.dumps(request) + b"\n")
print("sent", flush=True)
buf = bytearray()
while (end := buf.find(b"\n")) < 0:
    chunk = sock.recv(1 << 20)
    if not chunk:
        sys.exit("the daemon closed the connection")
    buf += chunk
head = orjson.loads(bytes(buf[:end]))
if not head.get("ok"):
    sys.exit(f"refused: {head}")
left = int(head.get("body", 0)) - (len(buf) - end - 1)
while left > 0:
    chunk = sock.recv(1 << 20)
    if not chunk:
        sys.exit("the body ended early")
    left -= len(chunk)
print("done", end - 1, flush=True)
"""


def big_session(state_dir: Path, name: str, events: int) -> None:
    """``name`` with ``events`` events, written straight to disk; every tool call's
    output is one real artifact, so fork and export carry it."""
    folder = state_dir / "sessions" / name
    (folder / "artifacts").mkdir(parents=True, mode=0o700)
    (folder / "snapshots").mkdir(mode=0o700)
    blob = b"".join(b"line %d of the tool's output\n" % i for i in range(40))
    digest = hashlib.sha256(blob).hexdigest()
    (folder / "artifacts" / digest).write_bytes(blob)
    out = ArtifactRef(
        ref=f"sha256:{digest}", name="stdout", size=len(blob), media_type="text/plain"
    )
    risk = RiskContract(side_effect="workspace-write", resume="rerun-after-check")
    drafts = [Draft(SessionCreated(name=name, goal="a long session", agent="bench"))]
    run = 0
    while len(drafts) < events:
        run += 1
        drafts += [
            Draft(MessageReceived(sender="bench", text=f"please do task {run}")),
            Draft(WakeRequested(trigger="message")),
            Draft(
                LifecycleChanged(
                    from_state="created" if run == 1 else "sleeping", to="running", reason="message"
                )
            ),
            Draft(RunStarted(run=f"r{run}", pid=1000 + run)),
        ]
        for i in range(3):
            call, path = f"c{run}.{i}", "docs/api.md"
            drafts += [
                Draft(
                    ToolIntent(
                        call=call,
                        tool="edit_file",
                        args={"path": path, "line": i},
                        risk=risk,
                        writes=(path,),
                    )
                ),
                Draft(PolicyDecided(call=call, tool="edit_file", decision="allow", rule="allow")),
                Draft(ToolStarted(call=call, tool="edit_file", hashes={path: "cd" * 32})),
                Draft(
                    ToolFinished(
                        call=call,
                        tool="edit_file",
                        status="ok",
                        exit_code=0,
                        hashes={path: "cd" * 32},
                        output=out,
                        duration_ms=12,
                    )
                ),
                Draft(ObservationProjected(call=call, tool="edit_file", text=f"rewrote line {i}")),
            ]
        drafts += [
            Draft(RunFinished(run=f"r{run}", status="ok", exit_code=0, duration_ms=1500)),
            Draft(LifecycleChanged(from_state="running", to="sleeping", reason="done")),
        ]
    records, _ = RecordBuilder(name, time.time_ns).build(0, drafts[:events])
    with open(folder / "events.jsonl", "wb") as f:
        f.write(b"".join(frame(orjson.dumps(r)) for r in records))
    (folder / "spec.toml").write_text(f'name = "{name}"\ngoal = "a long session"\n')
    os.sync()


def _ping_while(sock_path: Path, op: Op) -> tuple[list[float], float]:
    """Ping round trips (ms) while the other process's request is in the daemon, and
    how long that request took (s)."""
    client = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLIENT,
            str(sock_path),
            op["method"],
            orjson.dumps(op["params"]).decode(),
        ],
        stdout=subprocess.PIPE,
    )
    assert client.stdout is not None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(sock_path))
    sock.setblocking(False)
    request = b'{"id":1,"method":"ping","params":{}}\n'
    times: list[float] = []
    try:
        out = client.stdout.fileno()
        first = b""
        while not first.endswith(b"\n") and (byte := os.read(out, 1)):
            first += byte
        if first != b"sent\n":
            raise RuntimeError(f"the {op['method']} client failed: {first!r}")
        started = time.perf_counter()
        os.set_blocking(out, False)
        tail = b""
        while b"done" not in tail:
            t0 = time.perf_counter()
            sock.sendall(request)
            buf = b""
            while not buf.endswith(b"\n"):
                try:
                    buf += sock.recv(4096)
                except BlockingIOError:
                    socket_wait(sock)
            times.append((time.perf_counter() - t0) * 1000)
            with contextlib.suppress(BlockingIOError):
                tail += os.read(out, 4096)
            if client.poll() is not None:
                with contextlib.suppress(BlockingIOError):
                    tail += os.read(out, 4096)
                if b"done" not in tail:
                    raise RuntimeError(f"the {op['method']} client failed ({client.returncode})")
        took = time.perf_counter() - started
    finally:
        sock.close()
        client.wait(600)
        client.stdout.close()
    return times, took


def socket_wait(sock: socket.socket) -> None:
    import select

    select.select([sock], [], [], 1.0)


def _figures(times: list[float]) -> dict[str, float]:
    """p50 and p99 weighted by time, and the worst. Pings go one after another, so a
    stall of a second is one sample among thousands of quick ones; weighted by how
    long each took, the percentile says what a ping sent at a random moment during
    the work waits (p99: 99 % of that time, a ping would have waited at most this)."""
    times = sorted(times)
    total = sum(times)

    def weighted(q: float) -> float:
        seen = 0.0
        for t in times:
            seen += t
            if seen >= q * total:
                return t
        return times[-1]

    return {
        "p50": round(weighted(0.5), 2),
        "p99": round(weighted(0.99), 2),
        "max": round(times[-1], 1),
        "pings": len(times),
    }


def measure_one(root: Path, events: int, source: Path | None, say: Any) -> dict[str, float]:
    """The figures for one daemon (this tree's, or the one in ``source``)."""
    root.mkdir(parents=True)
    big_session(root / "state", "big", events)
    d = BenchDaemon(root, source=source)
    results: dict[str, float] = {}
    try:
        d.start()
        results["loop_idle_ping_p99_ms"] = _figures(_idle_pings(d.socket, 500))["p99"]
        for name, op in OPS.items():
            say(f"measuring ping during {name} of {events} events ...")
            times, took = _ping_while(d.socket, op)
            fig = _figures(times)
            results[f"loop_{name}_ping_p50_ms"] = fig["p50"]
            results[f"loop_{name}_ping_p99_ms"] = fig["p99"]
            results[f"loop_{name}_ping_max_ms"] = fig["max"]
            results[f"loop_{name}_pings"] = fig["pings"]
            results[f"loop_{name}_s"] = round(took, 2)
    finally:
        d.stop()
    say("measuring how long the loop is held (CPU time, in-process) ...")
    results.update(hold.measure(root, source))
    shutil.rmtree(root)
    return results


def _idle_pings(sock_path: Path, count: int) -> list[float]:
    from sessiond.bench.daemon import rpc_latencies_ms

    return rpc_latencies_ms(sock_path, "ping", count)


def measure(
    work: Path, quick: bool, say: Any, baseline: Path | None = None, events: int = 100_000
) -> dict[str, object]:
    """The figures of this tree's daemon, and of ``baseline``'s if given. (100,000
    events even with --quick: the work takes seconds, not minutes.)"""
    del quick
    results: dict[str, object] = {**measure_one(work / "loop", events, None, say)}
    if baseline is not None:
        say(f"the same with the daemon of {baseline} ...")
        before = measure_one(work / "loop-baseline", events, baseline, say)
        results.update({f"baseline_{k}": v for k, v in before.items()})
        results["baseline_source"] = str(baseline)
    return results
