import os, sqlite3, statistics, time, glob
import orjson
from pathlib import Path
from sessiond.sdk import connect
from sessiond.wire import Connection

N = int(os.environ.get("PROBE_N", "400"))
DPID = os.environ["DPID"]

def threads(tag=[0]):
    tag[0] += 1
    Path(f"mark{tag[0]}").write_text("")
    while not Path(f"ack{tag[0]}").exists():
        time.sleep(0.0005)
    return orjson.loads(Path(f"ack{tag[0]}").read_bytes())

def _unused():
    out = {}
    for t in glob.glob(f"/proc/{DPID}/task/*"):
        try:
            comm = open(t + "/comm").read().strip()
            ns = int(open(t + "/schedstat").read().split()[0])
        except OSError:
            continue
        key = "main" if t.endswith("/" + DPID) else ("iou-wrk" if comm.startswith("iou") else comm)
        out[key] = out.get(key, 0) + ns
    return out

def delta(a, b, n):
    return {k: round((b.get(k, 0) - a.get(k, 0)) / n / 1e6, 4) for k in b if b.get(k, 0) - a.get(k, 0) > 0}

med = statistics.median
res = {}
with connect() as run:
    conn = Connection(Path(os.environ["SESSIOND_SOCKET"]))
    fd = os.open("floor.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    db = sqlite3.connect("floor.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS steps (id INTEGER PRIMARY KEY, body TEXT)")
    def step(i):
        run.step("probe", lambda: {"i": i}, args={"i": i}, side_effect="none",
                 idempotency="safe", resume="replay-from-event")
    for i in range(50):
        step(i)
    for phase in ("tight", "inter"):
        wall, cpu, fl, lite, ping, fs = [], [], [], [], [], []
        t0 = threads(); c0 = time.process_time(); w0 = time.perf_counter()
        for i in range(N):
            s = time.perf_counter(); c = time.process_time()
            step(i)
            wall.append((time.perf_counter() - s) * 1000); cpu.append((time.process_time() - c) * 1000)
            if phase == "inter":
                s = time.perf_counter()
                conn.call("ping", {}); ping.append((time.perf_counter() - s) * 1000)
                os.write(fd, b"x" * 200); s2 = time.perf_counter(); os.fsync(fd)
                fs.append((time.perf_counter() - s2) * 1000)
                body = orjson.dumps({"i": i, "name": "probe", "result": {"i": i}}).decode()
                s = time.perf_counter()
                db.execute("BEGIN"); db.execute("INSERT INTO steps (body) VALUES (?)", (body,)); db.execute("COMMIT")
                lite.append((time.perf_counter() - s) * 1000)
        run._pipe.settle() if hasattr(run, "_pipe") else None
        span = time.perf_counter() - w0
        t1 = threads()
        res[phase] = {"step_p50": med(wall), "client_cpu_p50": med(cpu), "per_step_wall_total": span * 1000 / N,
                      "daemon_cpu_ms_per_step": delta(t0, t1, N)}
        if phase == "inter":
            res[phase].update({"ping_p50": med(ping), "write_fsync_p50": med(fs), "sqlite_p50": med(lite)})
    # quiet references, not interleaved
    ping, fs, lite = [], [], []
    for i in range(N):
        s = time.perf_counter(); conn.call("ping", {}); ping.append((time.perf_counter() - s) * 1000)
    for i in range(N):
        os.write(fd, b"x" * 200); s = time.perf_counter(); os.fsync(fd); fs.append((time.perf_counter() - s) * 1000)
    for i in range(N):
        s = time.perf_counter()
        db.execute("BEGIN"); db.execute("INSERT INTO steps (body) VALUES (?)", ("x" * 60,)); db.execute("COMMIT")
        lite.append((time.perf_counter() - s) * 1000)
    res["alone"] = {"ping_p50": med(ping), "write_fsync_p50": med(fs), "sqlite_p50": med(lite)}
    Path("out.json.tmp").write_bytes(orjson.dumps(res)); os.rename("out.json.tmp", "out.json")
    run.complete()
