"""The Ray engine's workers across driver processes: K drivers in a row on one local cluster of N nodes (as the
step processes of a Dagster run under the multiprocess executor, each a Ray job of its own), each fanning 6 tasks out
through `refinery.fanout.map_tasks` that import the heavy modules a worker preloads (`fanout.WORKER_PRELOAD`) and answer their worker's
pid. Each driver reads the nodes' CPU (every live process of their `ray start` sessions) at its start and just before
it leaves; the figures are the sums over the drivers, and how many distinct worker processes ran the tasks.

    python bench/ray_step_drivers.py CHECKOUT WORKDIR K NODES

CHECKOUT is the repository whose code the drivers and the nodes run (this one, or a `git archive` of another commit,
to compare): the cluster is started from its tests/helpers/ray_cluster.py.
"""
import json, os, subprocess, sys, time
from pathlib import Path
checkout, work, k, nodes = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path[:0] = [checkout, os.path.join(checkout, "tests")]
os.chdir(checkout)
DRIVER = r'''
import importlib, json, os, sys, time, resource
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]
sessions = {int(s) for s in sys.argv[2].split(",")}
def nodes_cpu():
    t = 0
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                f = open(f"/proc/{e}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(f[3]) in sessions:
                t += sum(int(x) for x in f[11:15])
    return t / os.sysconf("SC_CLK_TCK")
before = nodes_cpu()
from refinery.fanout import map_tasks, WORKER_PRELOAD
from assets.resource import RefineryResource
refinery = RefineryResource(config_path=sys.argv[1])
def task(r, i, c):
    for m in WORKER_PRELOAD:
        importlib.import_module(m)
    return os.getpid()
pids = sorted(set(map_tasks(refinery, list(range(6)), task)))
after = nodes_cpu()
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"nodes_cpu_s": round(after - before, 2), "driver_cpu_s": round(u.ru_utime + u.ru_stime, 2), "workers": pids}), flush=True)
'''
from helpers.ray_cluster import start_cluster, node_env
from helpers import configs
cluster = start_cluster(work / "ray", workers=nodes - 1)
try:
    config = configs.write_config(work, {"seed": 0, "data_root": str(work / "out"), "buckets": ["web"],
        "sources": [{"name": "web", "path": str(work / "*.jsonl"), "format": "jsonl", "bucket": "web"}],
        "execution": {"engine": "ray", "address": cluster.address}}, "c.yaml")
    sessions = ",".join(str(n.process.pid) for n in [cluster.head, *cluster.workers])
    env = {**node_env(), "PYTHONPATH": os.pathsep.join([checkout, os.path.join(checkout, "tests")])}
    rows = []
    for step in range(k):
        out = subprocess.run([sys.executable, "-c", DRIVER, str(config), sessions], capture_output=True, text=True, env=env, cwd=checkout, timeout=600)
        line = [l for l in out.stdout.splitlines() if l.startswith("{")]
        if not line:
            print(out.stderr[-3000:]); raise SystemExit(1)
        rows.append(json.loads(line[-1])); print(rows[-1], flush=True)
        time.sleep(2)
    print(json.dumps({"checkout": checkout, "nodes": nodes, "drivers": k, "nodes_cpu_s": round(sum(r["nodes_cpu_s"] for r in rows), 2),
                      "driver_cpu_s": round(sum(r["driver_cpu_s"] for r in rows), 2),
                      "distinct_workers": len({p for r in rows for p in r["workers"]})}))
finally:
    cluster.stop()
