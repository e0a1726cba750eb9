import orjson, sys
d = orjson.loads(open(sys.argv[1],'rb').read())
steps = d.get("handle.step", [1])[0]
print(f"{'what':34s} {'calls/step':>10s} {'wall us/step':>12s} {'cpu us/step':>11s} {'wall us/call':>12s}")
for k, (n, w, c) in sorted(d.items(), key=lambda kv: -kv[1][1]):
    print(f"{k:34s} {n/steps:10.2f} {w/steps/1000:12.1f} {c/steps/1000:11.1f} {w/n/1000:12.1f}")
