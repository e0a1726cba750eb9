"""The model gateway's figures, each beside its floor, measured in one run.

A real daemon with its gateway in front of the scripted upstream (on a thread of
this process, answering at once), and runs that call it over plain HTTP
(keep-alive ``http.client``: no SDK's own time in the figures):

* ``gateway_added_p50_ms`` / ``_p99_ms``: a non-streamed call through the gateway
  (a durable step: ``model.requested`` and ``model.responded`` written) minus the
  same call sent to the upstream directly, alternately, by the same run.
* ``gateway_ttft_added_p50_ms``: the same for a stream, to its first event.
* ``gateway_durable_floor_p50_ms``: what a recorded call cannot avoid on this
  disk, measured in the same run right after the calls, with no daemon: a new
  file made durable in a folder (the response: write, fsync, rename, fsync the
  folder), then a line appended to a log and fsynced (``model.responded``);
  ``gateway_added_over_floor_p50_ms`` is the added latency less that.
* ``gateway_calls_per_s``: 50 runs at once, each sending its calls one after the
  other, all through one daemon, the upstream with no limit.
* ``gateway_jain_index``: 10 runs of equal priority sending calls in a loop to a
  provider that takes 2 at a time (saturated): Jain's fairness index of the calls
  each got in the window where all ten were asking.
* ``gateway_replay_p50_ms`` over ``gateway_roundtrip_p50_ms``: a call of an
  earlier run of the turn answered from the log (nothing sent upstream), against
  an HTTP round trip to a handler that does nothing on the same server stack.
* ``sched_call_us`` / ``sched_saturated_call_us``: the scheduler alone (no HTTP, no
  log): 50 tasks sending calls that answer at once, with no limit, and with a
  concurrency of 2 (every call queues): microseconds of the loop per call.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from sessiond.bench import run_async
from sessiond.bench.daemon import BenchDaemon, _wait_file, call
from sessiond.replies import JsonObject

HEAD = """
import http.client, json, os, statistics, sys, time, urllib.parse
from pathlib import Path

gw = urllib.parse.urlsplit(os.environ["ANTHROPIC_BASE_URL"])
HEADERS = {{"content-type": "application/json", "x-api-key": os.environ["ANTHROPIC_API_KEY"],
           "anthropic-version": "2023-06-01"}}


def body(model, text="hi", stream=False):
    return json.dumps({{"model": model, "max_tokens": 16, "stream": stream,
                       "messages": [{{"role": "user", "content": text}}]}})


def post(conn, path, data, first_line=False):
    start = time.perf_counter()
    conn.request("POST", path, data, HEADERS)
    resp = conn.getresponse()
    if first_line:
        resp.readline()
        took = time.perf_counter() - start
        resp.read()
    else:
        resp.read()
        took = time.perf_counter() - start
    assert resp.status == 200, resp.status
    return took * 1000
"""

PROBE = (
    HEAD
    + """
N = {n}
up = urllib.parse.urlsplit("{direct}")
g = http.client.HTTPConnection(gw.hostname, gw.port)
d = http.client.HTTPConnection(up.hostname, up.port)
path = gw.path + "/v1/messages"
if not Path("first.json").exists():
    via, direct, via_ttft, direct_ttft = [], [], [], []
    for i in range(N):
        direct.append(post(d, "/v1/messages", body("claude-fast")))
        via.append(post(g, path, body("claude-fast")))
        direct_ttft.append(post(d, "/v1/messages", body("claude-fast", stream=True), True))
        via_ttft.append(post(g, path, body("claude-fast", stream=True), True))
    # whole or not at all: the bench reads it as soon as it is there
    Path("first.tmp").write_text(json.dumps(
        {{"via": via, "direct": direct, "via_ttft": via_ttft, "direct_ttft": direct_ttft}}))
    os.replace("first.tmp", "first.json")
    sys.exit(1)  # the turn goes on in a later run, which gets its calls from the log
replay, floor = [], []
for i in range(N):
    replay.append(post(g, path, body("claude-fast")))
    post(g, path, body("claude-fast", stream=True), True)
    start = time.perf_counter()
    d.request("GET", "/_count")
    d.getresponse().read()
    floor.append((time.perf_counter() - start) * 1000)
Path("replay.tmp").write_text(json.dumps({{"replay": replay, "floor": floor}}))
os.replace("replay.tmp", "replay.json")
"""
)

LOAD = (
    HEAD
    + """
model, calls = sys.argv[1], int(sys.argv[2])
me = os.environ["SESSIOND_SESSION"]
g = http.client.HTTPConnection(gw.hostname, gw.port)
path = gw.path + "/v1/messages"
Path("ready").touch()
while not Path("{go}").exists():
    time.sleep(0.001)
start = time.time()
for i in range(calls):
    post(g, path, body(model, text=me))
Path("done.tmp").write_text(json.dumps({{"start": start, "end": time.time()}}))
os.replace("done.tmp", "done.json")
"""
)

CONFIG = """
max_running = 100
[run]
sandbox = "off"
[[model.provider]]
name = "fast"
kind = "anthropic"
base_url = "{url}"
models = ["claude-fast"]
[[model.provider]]
name = "tight"
kind = "anthropic"
base_url = "{url}"
models = ["claude-tight"]
concurrency = 2
"""


def spec(name: str, program: Path, cwd: Path, args: list[str], retries: int = 0) -> str:
    argv = orjson.dumps([sys.executable, str(program), *args]).decode()
    return (
        f'name = "{name}"\n[run]\nkind = "sdk"\nexec = {argv}\ncwd = "{cwd}"\n'
        f'retries = {retries}\n[model]\nallow = ["claude-*"]\n'
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def jain(counts: list[int]) -> float:
    """Jain's fairness index: 1 when every one got the same, 1/n when one got all."""
    total = sum(counts)
    squares = sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else 1.0


# figures by name: numbers, and a list of counts (printed as JSON, as every bench's)
def measure(work: Path, quick: bool, say: Callable[[str], None]) -> dict[str, object]:
    from sessiond.gateway.scripted import Upstream

    root = (work / "gateway").resolve()
    root.mkdir()
    out: dict[str, object] = {}
    with Upstream() as up:
        d = BenchDaemon(root, config=CONFIG.format(url=up.url))
        d.state_dir.mkdir(parents=True)
        try:
            d.start()
            say("measuring gateway_added_p50_ms, gateway_ttft_added_p50_ms, replays ...")
            latency = _latency(d, root, up.url, 200 if quick else 1000)
            floor = _durable_floor(root, 200 if quick else 500)
            out.update(latency)
            out.update(floor)
            over = latency["gateway_added_p50_ms"] - floor["gateway_durable_floor_p50_ms"]
            out["gateway_added_over_floor_p50_ms"] = round(over, 3)
            say("measuring gateway_calls_per_s (50 runs at once) ...")
            out.update(_load(d, root, "fast", 50, 10 if quick else 40))
            say("measuring gateway_jain_index (10 runs, 2 calls at a time) ...")
            out.update(_fairness(d, root, up, 20 if quick else 60))
        finally:
            d.stop()
    shutil.rmtree(root, ignore_errors=True)
    say("measuring sched_call_us, sched_saturated_call_us (the scheduler alone) ...")
    calls = 200 if quick else 1000
    out["sched_call_us"] = round(run_async(lambda: _sched(None, calls)), 2)
    out["sched_saturated_call_us"] = round(run_async(lambda: _sched(2, calls)), 2)
    return out


async def _sched(concurrency: int | None, calls: int) -> float:
    """Microseconds per call through the scheduler, 50 tasks at once."""
    import asyncio

    from sessiond.gateway.sched import Ask, Limits, Scheduler

    sched = Scheduler({"p": Limits(concurrency=concurrency)})

    async def send() -> None:
        await asyncio.sleep(0)

    async def run(i: int) -> None:
        ask = Ask(f"s{i}", None, 0, "p", "m", 100)
        for _ in range(calls):
            await sched.call(ask, send)
            sched.settle(ask, 100)

    start = time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(50)))
    return (time.perf_counter() - start) / (50 * calls) * 1e6


def _latency(d: BenchDaemon, root: Path, direct: str, n: int) -> dict[str, float]:
    cwd = root / "probe"
    cwd.mkdir()
    program = root / "probe.py"
    program.write_text(PROBE.format(n=n, direct=direct))
    call(d.socket, "create", {"spec": spec("probe", program, cwd, [], retries=1),
                              "base": str(root), "source": "probe"})  # fmt: skip
    call(d.socket, "activate", {"name": "probe"})
    first = orjson.loads(_wait_file(cwd / "first.json", timeout=600))
    again = orjson.loads(_wait_file(cwd / "replay.json", timeout=600))
    p50 = statistics.median
    replay, floor = p50(again["replay"]), p50(again["floor"])
    return {
        "gateway_direct_p50_ms": round(p50(first["direct"]), 3),
        "gateway_via_p50_ms": round(p50(first["via"]), 3),
        "gateway_added_p50_ms": round(p50(first["via"]) - p50(first["direct"]), 3),
        "gateway_added_p99_ms": round(
            percentile(first["via"], 0.99) - percentile(first["direct"], 0.99), 3
        ),
        "gateway_ttft_added_p50_ms": round(p50(first["via_ttft"]) - p50(first["direct_ttft"]), 3),
        "gateway_replay_p50_ms": round(replay, 3),
        "gateway_roundtrip_p50_ms": round(floor, 3),
        "gateway_replay_ratio": round(replay / floor, 2),
    }


def _durable_floor(root: Path, n: int) -> dict[str, float]:
    """The response's artifact and ``model.responded`` made durable, as the daemon
    does it (durable.py), with no daemon: the fsyncs a recorded call waits for."""
    import os

    from sessiond.log.store.durable import write_durable

    folder = root / "floor"
    folder.mkdir()
    took = []
    fd = os.open(folder / "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for i in range(n):
            start = time.perf_counter()
            write_durable(folder / f"{i:064x}", b'{"id":"msg_%d","content":[]}' % i)
            os.write(fd, b'{"type":"model.responded","seq":%d}\n' % i)
            os.fsync(fd)
            took.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
    floor = statistics.median(took)
    return {"gateway_durable_floor_p50_ms": round(floor, 3)}


def _start_load(
    d: BenchDaemon, root: Path, model: str, runs: int, calls: int
) -> tuple[Path, list[Path]]:
    go = root / f"go-{model}"
    program = root / f"load-{model}.py"
    program.write_text(LOAD.format(go=go))
    folders = []
    for i in range(runs):
        name = f"{model}-{i:02d}"
        cwd = root / name
        cwd.mkdir()
        folders.append(cwd)
        call(d.socket, "create", {"spec": spec(name, program, cwd, [f"claude-{model}", str(calls)]),
                                  "base": str(root), "source": name})  # fmt: skip
        call(d.socket, "activate", {"name": name})
    for cwd in folders:
        _wait_file_exists(cwd / "ready")
    return go, folders


def _load(d: BenchDaemon, root: Path, model: str, runs: int, calls: int) -> dict[str, float]:
    go, folders = _start_load(d, root, model, runs, calls)
    go.touch()
    done = [orjson.loads(_wait_file(cwd / "done.json", timeout=600)) for cwd in folders]
    seconds = max(x["end"] for x in done) - min(x["start"] for x in done)
    return {"gateway_calls_per_s": round(runs * calls / seconds, 1)}


def _fairness(d: BenchDaemon, root: Path, up: Any, calls: int) -> dict[str, object]:
    before = len(up.requests)
    go, folders = _start_load(d, root, "tight", 10, calls)
    go.touch()
    for cwd in folders:
        _wait_file(cwd / "done.json", timeout=600)
    names = [asked(body) for _, body in up.requests[before:]]
    # the window where all ten were asking: until the first of them had all it asked
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
        if counts[name] == calls:
            break
    every = [counts.get(cwd.name, 0) for cwd in folders]
    return {"gateway_jain_index": round(jain(every), 3), "gateway_jain_counts": every}


def asked(body: JsonObject) -> str:
    """The first message's text: the name of the session that asked (the load's programs)."""
    messages = body["messages"]
    assert isinstance(messages, list)
    first = messages[0]
    assert isinstance(first, dict)
    return str(first["content"])


def _wait_file_exists(path: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} was not written")
        time.sleep(0.005)
