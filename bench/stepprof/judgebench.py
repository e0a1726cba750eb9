import sys, timeit
sys.path.insert(0, sys.argv[1])
from sessiond.log.places import judge, Asked
for n in (100, 450, 1000):
    steps = {f"s{i}": {"slot": f"s{i}", "ordinal": i, "key": None, "kind": "tool", "name": "probe",
                       "digest": f"d{i}", "status": "ok", "call": f"r1.{i}"} for i in range(n)}
    asked = Asked(kind="tool", name="probe", digest="dx", ordinal=n, key=None, parent=None)
    t = min(timeit.repeat(lambda: judge(steps, asked, "r1"), number=200, repeat=5)) / 200
    print(sys.argv[1].split('/')[-1] or sys.argv[1], n, f"{t*1e6:.1f} us")
