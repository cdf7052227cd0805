"""The funnel on the local pool and on a Ray cluster of 1, 2 and 3 nodes, on this machine, at one or
more corpus sizes, each engine's fixed CPU apart from its CPU per document.

    python bench/scaleout.py [--docs 3000] [--scales 1 10] [--docs-per-file 250] [--repeats 3]
                             [--workers 1 2] [--nodes 1 2 3] [--workdir DIR] [--out FILE]

A corpus of `--docs` times each of `--scales` generated pages (`synthetic.crawl.write_corpus`,
WARC.gz files of `--docs-per-file` pages each, partitions by file) runs through the funnel up to
`pii_redacted` (ingest, extraction, language ID, heuristics, dedup signatures, exact and near dedup,
quality scoring, PII) as `refinery demo` runs it (`orchestration.demo.materialize_graph`), once per
setting and size:

- local pool, `partitions.workers` of `--workers` (one pool for the run, reused by every step);
- `execution.engine: ray` on a cluster of each of `--nodes` nodes on 127.0.0.1 (`ray start` per
  node, one CPU each, no log monitor: tests/helpers/ray_cluster.py), the cluster started before the
  runs and not timed.

Each run happens in a child process. Its CPU is the driver's: the child's user + system time with
every process below it (its isolated extraction process, the local pool's fork server and workers),
live ones read from /proc and reaped ones' from the kernel's children counts; and for Ray the
growth over the run of every process of each node's session (`ray start --block` and its raylet,
GCS, agents, the pool's workers and their extraction processes), read from /proc by the child while
the pool's workers still live. Both are read when the funnel ends, before the empty tasks below,
with the driver's own CPU by thread (Ray's core worker threads apart from the interpreter's).
Figures: raw documents per CPU-second, wall time, the nodes' CPU by kind of process, and the bytes
under documents/, rejects/ and dedup/ compared with the local engine's with one worker at the same
size (the engines must write the same bytes).

Fixed against per-document CPU: with two sizes or more, each setting's driver CPU and nodes' CPU
(medians) are fitted by least squares as `fixed + per_doc * docs`; the nodes' fixed part divided by
the nodes is the fixed CPU per node (its worker's start, imports and stage builds, its daemons over
the run). Measured directly as well: each Ray worker's CPU once the pool has started it, before any
task (Ray's worker start and the import of refinery/ray_pool.py).

Scheduling overhead per task: 200 tasks that do nothing, through `refinery.fanout.map_tasks` on each
setting, wall time per task, after the CPU is read.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "SCALEOUT "
THROUGH_PII = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "dedup_signatures",
               "exact_deduped", "near_deduped", "near_dup_clusters", "deduped", "quality_model", "quality_scored",
               "pii_redacted"]
NOOP_TASKS = 200
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NODE_SESSIONS = "SCALEOUT_RAY_NODE_SESSIONS"
# The nodes' processes by role (`process_name`): the pool's workers, the extraction process each
# starts (`python -c`, refinery/stages/isolated_child.py), and the rest, Ray's own daemons.
WORKER_PROCESSES = {"ray::PoolWorker": "workers", "-c": "extraction processes"}


def write_corpus(folder: Path, docs: int, docs_per_file: int, seed: int) -> Path:
    from synthetic.crawl import write_corpus as write_warc

    folder.mkdir(parents=True)
    for i in range(-(-docs // docs_per_file)):
        write_warc(folder / f"part-{i:04d}.warc.gz", min(docs_per_file, docs - i * docs_per_file), seed + i, fmt="warc")
    return folder


def write_config(work: Path, crawl: Path, name: str, execution: dict, workers: int) -> Path:
    data = {
        "seed": 7,
        "data_root": str(work / f"out-{name}"),
        "buckets": ["web"],
        "sources": [{"name": "crawl", "path": str(crawl / "*.warc.gz"), "format": "warc", "bucket": "web"}],
        "partitions": {"by": "file", "workers": workers},
        "execution": execution,
        "stages": {"quality": {"enabled": False}},  # one bucket: no curated positives to train on
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def do_nothing(refinery, item, cache):
    return item


def child(config: str) -> None:
    """Materialize the funnel through pii_redacted, read the CPU, then time NOOP_TASKS empty tasks."""
    import warnings

    import dagster as dg

    from refinery import ray_engine, ray_pool
    from refinery.fanout import map_tasks
    from orchestration.definitions import build_definitions
    from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph
    from orchestration.resources import build_resources

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    # The Ray nodes' processes are read from here, while this run's Ray workers still live: once the
    # driver leaves, Ray ends them and the raylet reaps them without accounting their time.
    node_sessions = {int(s) for s in os.environ.get(NODE_SESSIONS, "").split(",") if s}
    nodes_before = session_cpu_by_process(node_sessions)
    refinery = build_resources(config)["refinery"]
    start = time.perf_counter()
    worker_start: list[float] = []
    if refinery.config.execution.engine == "ray":
        # The pool the first step would make (the same name: the steps find it), made first so that
        # its workers' start is read before they run anything.
        ray_engine.connect(refinery.config.execution.address)
        pool = ray_pool.pool_for(refinery, refinery.config.execution.address)
        worker_start = sorted(round(process_cpu_s(slot.pid)[0], 2) for slot in pool.slots)
    with dg.DagsterInstance.ephemeral() as instance:
        materialize_graph(build_definitions(config), instance, [dg.AssetKey(k) for k in THROUGH_PII],
                          log=lambda _: None, run_config=QUIET_RUN_CONFIG)
    wall = time.perf_counter() - start
    driver = tree_cpu_s(os.getpid())
    threads = thread_cpu_s(os.getpid())
    by_process = {name: round(cpu - nodes_before.get(name, 0.0), 2)
                  for name, cpu in session_cpu_by_process(node_sessions).items()}
    start = time.perf_counter()
    assert map_tasks(refinery, list(range(NOOP_TASKS)), do_nothing) == list(range(NOOP_TASKS))
    per_task = (time.perf_counter() - start) / NOOP_TASKS
    ray_pool.close()  # as `refinery demo` does at its end
    print(MARK + json.dumps({"wall_s": round(wall, 2), "noop_task_ms": round(per_task * 1000, 3),
                             "driver_cpu_s": round(driver, 2), "ray_nodes_cpu_s": round(sum(by_process.values()), 2),
                             "ray_nodes_cpu_by_process": by_process, "worker_start_cpu_s": worker_start,
                             "driver_cpu_by_thread": threads}), flush=True)


def process_cpu_s(pid: int) -> tuple[float, int]:
    """User + system CPU of `pid` and its waited-for children's, and its parent's pid (0 if gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS, int(fields[1])


def thread_cpu_s(pid: int) -> dict[str, float]:
    """User + system CPU of each live thread of `pid`, summed by thread name (Ray's core worker
    names its threads; Python's are all the interpreter's name)."""
    totals: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        totals[name] = round(totals.get(name, 0.0) + sum(int(f) for f in fields[11:13]) / CLOCK_TICKS, 2)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def tree_cpu_s(root: int) -> float:
    """CPU of `root` and of every live process below it (each one's own and its reaped children's)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parents[int(entry)] = process_cpu_s(int(entry))
    below, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, (_, parent) in parents.items():
            if parent == pid and child not in below:
                below.add(child)
                frontier.append(child)
    return sum(parents.get(pid, (0.0, 0))[0] for pid in below)


def process_name(argv: list[str]) -> str:
    """A process's kind from its command line: a Ray worker's title (`ray::PoolWorker`), a binary's
    name (`raylet`, `gcs_server`), or for a Python interpreter its script's or module's name (`-c`
    for code given on the command line)."""
    if not argv:
        return "?"
    words = argv[0].split() if argv[0].startswith("ray::") else argv
    if not os.path.basename(words[0]).startswith("python"):
        return os.path.basename(words[0]).split(".")[0]
    rest = [w for w in words[1:] if w not in ("-u", "-B", "-O", "-s", "-E")]
    if rest and rest[0] == "-m" and len(rest) > 1:
        return rest[1]
    return os.path.basename(rest[0]).removesuffix(".py") if rest else "python"


def session_cpu_by_process(sessions: set[int]) -> dict[str, float]:
    """User + system CPU (and waited-for children's) of every live process in `sessions`, by kind of
    process (`process_name`)."""
    totals: dict[str, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) in sessions:  # field 6, the session id
            name = process_name([a.decode(errors="replace") for a in argv if a])
            cpu = sum(int(f) for f in fields[11:15]) / CLOCK_TICKS  # utime, stime, cutime, cstime
            totals[name] = totals.get(name, 0.0) + cpu
    return totals


def by_role(by_process: dict[str, float]) -> dict[str, float]:
    """The nodes' CPU by process kind, summed by role (WORKER_PROCESSES; the rest are daemons)."""
    roles = {role: 0.0 for role in [*WORKER_PROCESSES.values(), "daemons"]}
    for name, cpu in by_process.items():
        roles[WORKER_PROCESSES.get(name, "daemons")] += cpu
    return {role: round(cpu, 2) for role, cpu in roles.items()}


def run_setting(config: Path, node_sessions: set[int]) -> dict:
    """Run the child on `config`: what it measured of its driver and of the Ray nodes."""
    env = {**os.environ, "REFINERY_PROGRESS": "0", NODE_SESSIONS: ",".join(map(str, sorted(node_sessions)))}
    log = config.with_suffix(".log")
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, __file__, "--child", str(config)], env=env, stdout=out,
                               stderr=subprocess.STDOUT)
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith(MARK)]
    if code != 0 or not lines:
        raise SystemExit(f"{config} failed (exit {code}):\n{text[-6000:]}")
    row = json.loads(lines[-1][len(MARK):])
    return {**row, "cpu_s": round(row["driver_cpu_s"] + row["ray_nodes_cpu_s"], 2)}


def output_digest(config: Path) -> str:
    from refinery.config import load_config

    cfg = load_config(config)
    root = Path(cfg.resolve(cfg.data_root))
    h = hashlib.sha256()
    for path in sorted(p for sub in ("documents", "rejects", "dedup") for p in (root / sub).rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def raw_docs(config: Path) -> int:
    from refinery.config import load_config
    from refinery.reports.funnel import load_stage_totals
    from refinery.storage import open_data_root

    cfg = load_config(config)
    return load_stage_totals(open_data_root(cfg.resolve(cfg.data_root)))["raw_documents"].stats.docs_in


def fixed_and_per_doc(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per document) of the least-squares line `cpu = fixed + per_doc * docs` through
    (docs, cpu) points of two sizes or more."""
    n = len(points)
    mean_docs = sum(d for d, _ in points) / n
    mean_cpu = sum(c for _, c in points) / n
    spread = sum((d - mean_docs) ** 2 for d, _ in points)
    if spread == 0:
        raise ValueError("fixed and per-document CPU need runs of two corpus sizes or more")
    per_doc = sum((d - mean_docs) * (c - mean_cpu) for d, c in points) / spread
    return mean_cpu - per_doc * mean_docs, per_doc


def median_run(runs: list[dict]) -> dict:
    """The run of median docs per CPU-second, with every run's figure beside it, and its outputs'
    digest only if every run wrote the same bytes."""
    row = sorted(runs, key=lambda r: r["docs_per_cpu_s"])[len(runs) // 2]
    return {**row, "runs_docs_per_cpu_s": [r["docs_per_cpu_s"] for r in runs],
            "outputs": row["outputs"] if len({r["outputs"] for r in runs}) == 1 else "runs differ"}


def print_sizes(rows: list[dict], repeats: int) -> None:
    print(f"\nthrough pii_redacted; the median of {repeats} run(s) a setting, by docs per CPU-second "
          "(every run's in brackets); ratios and bytes against the local engine with one worker at the same size")
    print("| docs | setting | wall s | CPU s (driver + Ray nodes) | docs per CPU-s | vs local, 1 worker "
          "| Ray nodes: workers / extraction / daemons | empty task ms | outputs |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for r in rows:
        base = next(b for b in rows if b["docs"] == r["docs"] and b["setting"] == "local pool, 1 worker(s)")
        same = "same bytes" if r["outputs"] == base["outputs"] else f"DIFFERENT ({r['outputs']})"
        roles = " / ".join(map(str, by_role(r["ray_nodes_cpu_by_process"]).values())) if r["nodes"] else "-"
        print(f"| {r['docs']} | {r['setting']} | {r['wall_s']} | {r['cpu_s']} ({r['driver_cpu_s']} + {r['ray_nodes_cpu_s']}) "
              f"| {r['docs_per_cpu_s']} ({', '.join(map(str, r['runs_docs_per_cpu_s']))}) "
              f"| {r['docs_per_cpu_s'] / base['docs_per_cpu_s']:.2f}x | {roles} | {r['noop_task_ms']} | {same} |")


def print_fixed(rows: list[dict]) -> list[dict]:
    """Each setting's fixed and per-document CPU, driver and nodes apart, fitted over the sizes."""
    fits = []
    print("\nfixed and per-document CPU, fitted over the sizes (median runs)")
    print("| setting | driver fixed CPU s | driver CPU ms per doc | nodes' fixed CPU s (per node) "
          "| nodes' CPU ms per doc | a Ray worker's start, CPU s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == setting]
        if len({r["docs"] for r in mine}) < 2:
            continue
        driver = fixed_and_per_doc([(r["docs"], r["driver_cpu_s"]) for r in mine])
        nodes = fixed_and_per_doc([(r["docs"], r["ray_nodes_cpu_s"]) for r in mine])
        count = mine[0]["nodes"]
        starts = [s for r in mine for s in r["worker_start_cpu_s"]]
        start = f"{sorted(starts)[len(starts) // 2]} (median of {len(starts)})" if starts else "-"
        per_node = f" ({nodes[0] / count:.2f})" if count else ""
        print(f"| {setting} | {driver[0]:.2f} | {driver[1] * 1000:.3f} | {nodes[0]:.2f}{per_node} | {nodes[1] * 1000:.3f} | {start} |")
        fits.append({"setting": setting, "driver_fixed_cpu_s": round(driver[0], 2), "driver_cpu_ms_per_doc": round(driver[1] * 1000, 3),
                     "nodes_fixed_cpu_s": round(nodes[0], 2), "nodes_cpu_ms_per_doc": round(nodes[1] * 1000, 3)})
    return fits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10], help="corpus sizes, in multiples of --docs")
    parser.add_argument("--docs-per-file", type=int, default=250)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting; the median is reported")
    parser.add_argument("--workdir", default="/tmp/refinery-scaleout")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="local pool sizes to run (1, the base of every ratio, always runs)")
    parser.add_argument("--nodes", type=int, nargs="*", default=[1, 2, 3],
                        help="Ray cluster sizes to run (none: the local pool only)")
    parser.add_argument("--log-monitor", action="store_true",
                        help="start each Ray node with its log monitor (refinery's drivers read no worker logs)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    from helpers.ray_cluster import start_cluster

    work = Path(args.workdir)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    crawls = {scale: write_corpus(work / f"crawl-x{scale}", args.docs * scale, args.docs_per_file, args.seed)
              for scale in args.scales}
    rows = []

    def record(name: str, nodes: int, make_config, sessions: set[int]) -> None:
        """`--repeats` runs of one setting at every size, each on a fresh data root."""
        for scale, crawl in crawls.items():
            runs = []
            for repeat in range(args.repeats):
                config = make_config(crawl, f"-x{scale}-r{repeat}")
                run = {"setting": name, "nodes": nodes, **run_setting(config, sessions),
                       "load_avg": round(os.getloadavg()[0], 2)}
                run["docs"] = raw_docs(config)
                run["docs_per_cpu_s"] = round(run["docs"] / run["cpu_s"], 1)
                run["outputs"] = output_digest(config)
                shutil.rmtree(Path(yaml.safe_load(config.read_text())["data_root"]))  # digested: room for the next
                runs.append(run)
                print(json.dumps(run), flush=True)
            rows.append(median_run(runs))

    for workers in sorted({1, *args.workers}):
        record(f"local pool, {workers} worker(s)", 0,
               lambda crawl, tag, w=workers: write_config(work, crawl, f"local{w}{tag}", {"engine": "local"}, w), set())
    for nodes in args.nodes:
        cluster = start_cluster(work / f"ray{nodes}", workers=nodes - 1, log_monitor=args.log_monitor)
        try:
            execution = {"engine": "ray", "address": cluster.address}
            record(f"ray, {nodes} node(s)", nodes,
                   lambda crawl, tag, n=nodes: write_config(work, crawl, f"ray{n}{tag}", execution, 1),
                   {n.process.pid for n in [cluster.head, *cluster.workers]})
        finally:
            cluster.stop()
    rows.sort(key=lambda r: r["docs"])
    print_sizes(rows, args.repeats)
    fits = print_fixed(rows) if len(args.scales) > 1 else []
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "fits": fits}, indent=1))


if __name__ == "__main__":
    sys.path[0] = REPO_DIR
    sys.path.insert(1, os.path.join(REPO_DIR, "tests"))
    main()
