import json, collections, statistics, sys
rows = collections.defaultdict(list); loads=[]
for f in sys.argv[1:]:
  for line in open(f):
    if line.startswith('load'): loads.append(line.split(':')[1].split(',')[0].strip()); continue
    tag, load, js = line.split(' ', 2); d = json.loads(js)
    rows[tag].append(d)
med = statistics.median
print('loads', loads)
for tag, v in rows.items():
    g = lambda f: round(med([f(d) for d in v]), 3)
    print(f"{tag:12s} n={len(v)} tight={g(lambda d:d['tight']['step_p50'])} inter={g(lambda d:d['inter']['step_p50'])} "
          f"main_tight={g(lambda d:d['tight']['daemon_cpu_ms_per_step'].get('main',0))} main_inter={g(lambda d:d['inter']['daemon_cpu_ms_per_step'].get('main',0))} "
          f"client_cpu={g(lambda d:d['tight']['client_cpu_p50'])} sqlite_alone={g(lambda d:d['alone']['sqlite_p50'])} sqlite_inter={g(lambda d:d['inter']['sqlite_p50'])} "
          f"fsync_alone={g(lambda d:d['alone']['write_fsync_p50'])} ping_alone={g(lambda d:d['alone']['ping_p50'])} ratio_inter={g(lambda d:d['inter']['step_p50']/d['inter']['sqlite_p50'])}")
