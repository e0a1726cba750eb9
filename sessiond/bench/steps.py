"""What a durable step costs, beside its floor, measured in one run.

``sdk_step_roundtrip_p50_ms``: one ``run.step`` with an empty body and a small
result: ``sdk.step`` (intent, decision and start in one durable write) and
``sdk.step_done`` (finish and observation in one durable write).
``sdk_replay_step_p50_ms``: the same step reached again by a later run of the
turn (after an approval): answered from the log, no fsync.
``sdk_step_floor_p50_ms``: two RPC round trips to the daemon (``ping``) and two
fsyncs of a file on the state dir's file system, what a step cost before one
commit per step (kept to compare with). ``sdk_step_sqlite_p50_ms``: the peer's
floor, one SQLite ``INSERT`` + ``COMMIT`` in WAL mode with ``synchronous=FULL`` on
the same disk (what a step costs a library that journals steps in SQLite, DBOS
say). Both are measured by the same program in the same run, interleaved with
the steps. Target: a step at most 1.5x the SQLite commit.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import orjson

from sessiond.bench.daemon import BenchDaemon, _wait_file, call

PROBE = """
import os, sqlite3, statistics, time
import orjson
from pathlib import Path
from sessiond.sdk import connect
from sessiond.wire import Connection

N = {n}
with connect() as run:
    first = not Path("first.json").exists()
    conn = Connection(Path(os.environ["SESSIOND_SOCKET"]))
    fd = os.open("floor.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    db = sqlite3.connect("floor.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS steps (id INTEGER PRIMARY KEY, body TEXT)")
    times, floor, lite = [], [], []
    for i in range(N):
        start = time.perf_counter()
        run.step("probe", lambda: {{"i": i}}, args={{"i": i}}, side_effect="none",
                 idempotency="safe", resume="replay-from-event")
        times.append((time.perf_counter() - start) * 1000)
        if first:
            # the floor, interleaved so both see the same machine: two round trips
            # and two fsyncs of an appended file, as a step needs
            start = time.perf_counter()
            conn.call("ping", {{}})
            os.write(fd, b"x" * 200)
            os.fsync(fd)
            conn.call("ping", {{}})
            os.write(fd, b"y" * 200)
            os.fsync(fd)
            floor.append((time.perf_counter() - start) * 1000)
            # the peer's floor: one step's record committed to SQLite
            body = orjson.dumps({{"i": i, "name": "probe", "result": {{"i": i}}}}).decode()
            start = time.perf_counter()
            db.execute("BEGIN")
            db.execute("INSERT INTO steps (body) VALUES (?)", (body,))
            db.execute("COMMIT")
            lite.append((time.perf_counter() - start) * 1000)
    os.close(fd)
    db.close()
    conn.close()
    if first:
        Path("first.json.tmp").write_bytes(orjson.dumps(
            {{"step": statistics.median(times), "floor": statistics.median(floor),
              "sqlite": statistics.median(lite)}}))
        os.rename("first.json.tmp", "first.json")
    else:
        Path("replay.json.tmp").write_bytes(orjson.dumps({{"replay": statistics.median(times)}}))
        os.rename("replay.json.tmp", "replay.json")
    run.step("ask", lambda: None, side_effect="none", idempotency="safe")
    run.complete()
"""


def measure(work: Path, quick: bool) -> dict[str, float]:
    root = (work / "steps").resolve()
    root.mkdir()
    script = root / "probe.py"
    script.write_text(PROBE.format(n=200 if quick else 1000))
    pythonpath = str(Path(__file__).parents[2])
    spec = (
        f'name = "steps"\n[run]\nkind = "sdk"\nexec = ["{sys.executable}", "{script}"]\n'
        f'cwd = "{root}"\nenv = {{ PYTHONPATH = "{pythonpath}" }}\n[policy]\nask = ["ask"]\n'
    )
    d = BenchDaemon(root)
    d.state_dir.mkdir(parents=True)
    try:
        d.start()
        call(d.socket, "create", {"spec": spec, "base": str(root), "source": "steps"})
        call(d.socket, "activate", {"name": "steps"})
        first = orjson.loads(_wait_file(root / "first.json", timeout=300))
        while call(d.socket, "show", {"name": "steps"})["state"] != "blocked":
            time.sleep(0.005)  # the run stops at the question
        call(d.socket, "approve", {"name": "steps"})
        replay = orjson.loads(_wait_file(root / "replay.json", timeout=300))
    finally:
        d.stop()
    shutil.rmtree(root)
    return {
        "sdk_step_roundtrip_p50_ms": round(first["step"], 3),
        "sdk_step_floor_p50_ms": round(first["floor"], 3),
        "sdk_step_floor_ratio": round(first["step"] / first["floor"], 2),
        "sdk_step_sqlite_p50_ms": round(first["sqlite"], 3),
        "sdk_step_sqlite_ratio": round(first["step"] / first["sqlite"], 2),
        "sdk_replay_step_p50_ms": round(replay["replay"], 3),
    }
