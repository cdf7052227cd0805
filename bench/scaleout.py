"""The funnel on the local pool and on a Ray cluster of 1, 2 and 3 nodes, on this machine.

    python bench/scaleout.py [--docs 3000] [--docs-per-file 250] [--repeats 3] [--nodes 1 2 3] [--workdir DIR] [--out FILE]

A corpus of `--docs` generated pages (`synthetic.crawl.write_corpus`, WARC.gz files of
`--docs-per-file` pages each, partitions by file) runs through the funnel up to `pii_redacted`
(ingest, extraction, language ID, heuristics, dedup signatures, exact and near dedup, quality
scoring, PII) as `refinery demo` runs it (`orchestration.demo.materialize_graph`), once per setting:

- local pool, `partitions.workers` 1 and 2 (one pool for the run, reused by every step);
- `execution.engine: ray` on a cluster of 1, 2 and 3 nodes on 127.0.0.1 (`ray start` per node, one
  CPU each: tests/helpers/ray_cluster.py), the cluster started before the run and not timed.

Each run happens in a child process. CPU is the child's user + system time and its waited-for
children's, from wait4, plus the local pool's (its fork server and workers, read from /proc by the
child before it leaves: they are the server's children, not the child's), plus for Ray the growth over the run of every
process of each node's session (`ray start --block` and its raylet, GCS, agents and Ray workers,
read from /proc by the child just before it leaves, while the job's Ray workers still live). Figures: raw documents per CPU-second, wall time, and
the bytes under documents/ and dedup/ compared with the first setting's (the engines must write the
same bytes).

Scheduling overhead per task: 200 tasks that do nothing, through `refinery.fanout.map_tasks` on each
setting, wall time per task (the Ray figure includes a first call's worker start).
"""

import os
import sys

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = REPO_DIR
sys.path.insert(1, os.path.join(REPO_DIR, "tests"))

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import multiprocessing.forkserver  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

MARK = "SCALEOUT "
THROUGH_PII = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "dedup_signatures",
               "exact_deduped", "near_deduped", "near_dup_clusters", "deduped", "quality_model", "quality_scored",
               "pii_redacted"]
NOOP_TASKS = 200
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NODE_SESSIONS = "SCALEOUT_RAY_NODE_SESSIONS"


def write_corpus(work: Path, docs: int, docs_per_file: int, seed: int) -> Path:
    from synthetic.crawl import write_corpus as write_warc

    folder = work / "crawl"
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
    """Materialize the funnel through pii_redacted, then time NOOP_TASKS empty tasks."""
    import warnings

    import dagster as dg

    from refinery import ray_pool
    from refinery.fanout import map_tasks
    from orchestration.definitions import build_definitions
    from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph
    from orchestration.resources import build_resources

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    # The Ray nodes' processes are read from here, while this run's Ray workers still live: once the
    # driver leaves, Ray ends them and the raylet reaps them without accounting their time.
    node_sessions = {int(s) for s in os.environ.get(NODE_SESSIONS, "").split(",") if s}
    nodes_before = session_cpu_s(node_sessions)
    nodes_before_by_process = session_cpu_by_process(node_sessions)
    start = time.perf_counter()
    with dg.DagsterInstance.ephemeral() as instance:
        materialize_graph(build_definitions(config), instance, [dg.AssetKey(k) for k in THROUGH_PII],
                          log=lambda _: None, run_config=QUIET_RUN_CONFIG)
    wall = time.perf_counter() - start
    refinery = build_resources(config)["refinery"]
    start = time.perf_counter()
    assert map_tasks(refinery, list(range(NOOP_TASKS)), do_nothing) == list(range(NOOP_TASKS))
    per_task = (time.perf_counter() - start) / NOOP_TASKS
    nodes = session_cpu_s(node_sessions) - nodes_before
    by_process = {name: round(cpu - nodes_before_by_process.get(name, 0.0), 2)
                  for name, cpu in session_cpu_by_process(node_sessions).items()}
    ray_pool.close()  # as `refinery demo` does at its end (after the nodes' CPU is read: a killed worker's is lost)
    # The local pool's workers are the fork server's children, not this process's: wait4 does not
    # see them, so their CPU (and the server's) is read here, while they still live.
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    pool = tree_cpu_s(server) if server is not None else 0.0
    print(MARK + json.dumps({"wall_s": round(wall, 2), "noop_task_ms": round(per_task * 1000, 3),
                             "ray_nodes_cpu_s": round(nodes, 2), "pool_cpu_s": round(pool, 2),
                             "ray_nodes_cpu_by_process": by_process}), flush=True)


def process_cpu_s(pid: int) -> tuple[float, int]:
    """User + system CPU of `pid` and its waited-for children's, and its parent's pid (0 if gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS, int(fields[1])


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
    name (`raylet`, `gcs_server`), or for a Python interpreter its script's or module's name."""
    if not argv:
        return "?"
    words = argv[0].split() if argv[0].startswith("ray::") else argv
    if not os.path.basename(words[0]).startswith("python"):
        return os.path.basename(words[0]).split(".")[0]
    rest = [w for w in words[1:] if w not in ("-u", "-B", "-O", "-s", "-E")]
    if rest and rest[0] == "-m" and len(rest) > 1:
        return rest[1]
    return os.path.basename(rest[0]).removesuffix(".py") if rest else "python"


def session_cpu_s(sessions: set[int]) -> float:
    """User + system CPU (and waited-for children's) of every live process in `sessions`."""
    return sum(session_cpu_by_process(sessions).values())


def session_cpu_by_process(sessions: set[int]) -> dict[str, float]:
    """`session_cpu_s` by kind of process (`process_name`)."""
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


def run_setting(config: Path, node_sessions: set[int]) -> dict:
    """Run the child on `config`; its CPU is its own and its waited-for children's (the pool's
    workers) from wait4, the Ray nodes' what the child read of their sessions."""
    env = {**os.environ, "REFINERY_PROGRESS": "0", NODE_SESSIONS: ",".join(map(str, sorted(node_sessions)))}
    log = config.with_suffix(".log")
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, __file__, "--child", str(config)], env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith(MARK)]
    if process.returncode != 0 or not lines:
        raise SystemExit(f"{config} failed (exit {process.returncode}):\n{text[-6000:]}")
    row = json.loads(lines[-1][len(MARK):])
    driver = usage.ru_utime + usage.ru_stime + row["pool_cpu_s"]
    return {**row, "cpu_s": round(driver + row["ray_nodes_cpu_s"], 2), "driver_cpu_s": round(driver, 2)}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--docs-per-file", type=int, default=250)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting; the median is reported")
    parser.add_argument("--workdir", default="/tmp/refinery-scaleout")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--nodes", type=int, nargs="*", default=[1, 2, 3],
                        help="Ray cluster sizes to run (none: the local pool only)")
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
    crawl = write_corpus(work, args.docs, args.docs_per_file, args.seed)
    rows = []

    def record(name: str, make_config, sessions: set[int]) -> None:
        """`--repeats` runs of one setting, each on a fresh data root; the row of the median run
        (by docs per CPU-second), with every run's figure beside it."""
        runs = []
        for repeat in range(args.repeats):
            config = make_config(f"-r{repeat}")
            run = {"setting": name, **run_setting(config, sessions), "load_avg": round(os.getloadavg()[0], 2)}
            run["docs"] = raw_docs(config)
            run["docs_per_cpu_s"] = round(run["docs"] / run["cpu_s"], 1)
            run["outputs"] = output_digest(config)
            runs.append(run)
            print(json.dumps(run), flush=True)
        row = sorted(runs, key=lambda r: r["docs_per_cpu_s"])[len(runs) // 2]
        rows.append({**row, "runs_docs_per_cpu_s": [r["docs_per_cpu_s"] for r in runs],
                     "outputs": row["outputs"] if len({r["outputs"] for r in runs}) == 1 else "runs differ"})

    for workers in (1, 2):
        record(f"local pool, {workers} worker(s)",
               lambda tag, w=workers: write_config(work, crawl, f"local{w}{tag}", {"engine": "local"}, w), set())
    for nodes in args.nodes:
        cluster = start_cluster(work / f"ray{nodes}", workers=nodes - 1)
        try:
            execution = {"engine": "ray", "address": cluster.address}
            record(f"ray, {nodes} node(s)", lambda tag, n=nodes: write_config(work, crawl, f"ray{n}{tag}", execution, 1),
                   {n.process.pid for n in [cluster.head, *cluster.workers]})
        finally:
            cluster.stop()
    base = rows[0]
    print(f"\n{args.docs} generated pages ({rows[0]['docs']} raw documents with the files' records), through pii_redacted")
    print(f"the median of {args.repeats} run(s) a setting, by docs per CPU-second (every run's in brackets)")
    print("| setting | wall s | CPU s (driver + Ray nodes) | docs per CPU-s | vs local, 1 worker | vs local, 2 workers "
          "| empty task ms | outputs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        same = "same bytes" if r["outputs"] == base["outputs"] else f"DIFFERENT ({r['outputs']})"
        print(f"| {r['setting']} | {r['wall_s']} | {r['cpu_s']} ({r['driver_cpu_s']} + {r['ray_nodes_cpu_s']}) | "
              f"{r['docs_per_cpu_s']} ({', '.join(map(str, r['runs_docs_per_cpu_s']))}) | "
              f"{r['docs_per_cpu_s'] / base['docs_per_cpu_s']:.2f}x | {r['docs_per_cpu_s'] / rows[1]['docs_per_cpu_s']:.2f}x | "
              f"{r['noop_task_ms']} | {same} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
