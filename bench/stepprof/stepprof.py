import sys, shutil, time, os, json
from pathlib import Path
import orjson
tree = sys.argv[2]; sys.path.insert(0, tree)
from sessiond.bench.daemon import BenchDaemon, _wait_file, call
mode = sys.argv[1]; tag = sys.argv[3] if len(sys.argv) > 3 else mode
root = Path(f'/tmp/sp/{tag}').resolve(); shutil.rmtree(root, ignore_errors=True); root.mkdir(parents=True)
script = root / "probe.py"; shutil.copy(Path(__file__).with_name("stepprof_probe.py"), script)
d = BenchDaemon(root, source=Path(tree), config=('durability = "os"\n' if mode == 'os' else ''))
d.state_dir.mkdir(parents=True)
try:
    d.start()
    pid = d.proc.pid
    Path(root / "dpid").write_text(str(pid))
    pin = ""
    if os.environ.get("SP_PIN"):
        import subprocess; subprocess.run(["taskset", "-a", "-p", "-c", "0", str(pid)], check=True, capture_output=True)
        pin = '"taskset", "-c", "1", '
    spec = (f'name = "steps"\n[run]\nkind = "sdk"\nexec = [{pin}"{sys.executable}", "{script}"]\n'
            f'cwd = "{root}"\nenv = {{ PYTHONPATH = "{tree}", DPID = "{pid}", PROBE_N = "{os.environ.get("PROBE_N", "400")}" }}\n')
    call(d.socket, "create", {"spec": spec, "base": str(root), "source": "steps"})
    call(d.socket, "activate", {"name": "steps"})
    import glob, threading
    def threads():
        out = {}
        for t in glob.glob(f"/proc/{pid}/task/*"):
            try:
                comm = open(t + "/comm").read().strip()
                ns = int(open(t + "/schedstat").read().split()[0])
            except OSError:
                continue
            key = "main" if t.endswith("/" + str(pid)) else ("iou-wrk" if comm.startswith("iou") else comm)
            out[key] = out.get(key, 0) + ns
        return out
    def watch():
        k = 1
        while not (root / "out.json").exists():
            if (root / f"mark{k}").exists():
                (root / f"ack{k}.tmp").write_bytes(orjson.dumps(threads())); os.rename(root / f"ack{k}.tmp", root / f"ack{k}"); k += 1
            time.sleep(0.0005)
    threading.Thread(target=watch, daemon=True).start()
    out = orjson.loads(_wait_file(root / "out.json", timeout=600))
    def r(x): return {k: (round(v, 3) if isinstance(v, float) else r(v) if isinstance(v, dict) else v) for k, v in x.items()}
    print(tag, os.getloadavg()[0], json.dumps(r(out)))
finally:
    d.stop()
