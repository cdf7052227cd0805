"""Proxy-model ablations on a crawl of real text (issue 37, item 6): the whole graph of
configs/ablations.yaml, the ablations included, from an empty data root, then the table of
`refinery ablations` and what every asset cost.

    python bench/ablations.py [--config configs/ablations.yaml] [--workdir /tmp/refinery-bench-ablations]
                              [--seeds N] [--variants raw,funnel,...] [--tokens N] [--parallel N] [--json PATH]

1. The crawl: data/ablations/build_crawl.py into `<workdir>/crawl` (documentation, real low-value
   pages and spam in a `web` bucket with planted exact and near copies; the curated `docs` bucket;
   the installed standard library's source as `code`, mpmath's and sympy's docstrings as `math`).
2. The config with its data root at `<workdir>/root`, its sources at that crawl and its other
   relative paths made absolute (`--seeds`, `--variants` and `--tokens` narrow its `ablations`
   section, for a shorter run), written to `<workdir>/ablations.yaml`; the data root and the Dagster instance
   (`<workdir>/dagster`) start empty.
3. Every asset, in `refinery demo`'s order, one plan step per asset (so each asset's figures are its
   own), in this process: wall seconds and CPU seconds (this process and the child processes it
   waited for: the trainer launches) per asset, with its partitions and Dagster runs. `--parallel N`
   trains N proxy runs at once (the training assets' partitions dealt to N child processes; each
   run is one process at one torch thread). The whole run's wall and CPU seconds and the 1-minute
   load average over it (sampled every 30 s) are printed and go in `--json`'s `total`.
4. Printed: `refinery ablations` on that config (its tables: each variant's counts, mixture and
   evaluation overlap; bits per byte per variant and domain, mean and spread over seeds, the paired
   verdict against `funnel` with its bootstrap interval, the smallest detectable difference and the
   unpaired figure beside it), then the resolution the pairing buys on these same runs
   (`resolution_table`), the variants' bytes against the main data root's (`sizes_table`) and the
   timings. `--json` writes the timings and the command's `--json` output; `--tables-only` prints the
   tables of a finished run in --workdir again.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from refinery.config.paths import rebase_paths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def build_crawl(out: Path) -> dict:
    spec = importlib.util.spec_from_file_location("build_crawl", REPO / "data" / "ablations" / "build_crawl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_crawl(out)


def crawl_folder(config: Path) -> Path:
    """The folder the config's sources read: the one build_crawl.py writes (out/ablations-crawl)."""
    data = yaml.safe_load(config.read_text())
    base = config.resolve().parent
    # normalized ('..' resolved), as rebase_paths hands the sources' paths over
    return Path(os.path.commonpath([os.path.normpath((base / src["path"]).parent) for src in data["sources"]]))


def write_config(config: Path, workdir: Path, seeds: int | None, variants: list[str] | None,
                 tokens: int | None = None) -> Path:
    """`config` with its data root and sources in `workdir`, relative paths absolute; returns its path."""
    crawl = crawl_folder(config)
    data = rebase_paths(yaml.safe_load(config.read_text()), config.parent,
                        sources=lambda path: str(workdir / "crawl" / path.relative_to(crawl)))
    data["data_root"] = str(workdir / "root")
    ablations = data["ablations"]
    if seeds is not None:
        ablations["seeds"] = seeds
    if tokens is not None:
        ablations["tokens"] = tokens
    if variants is not None:
        unknown = set(variants) - set(ablations["variants"])
        if unknown:
            raise SystemExit(f"--variants: {sorted(unknown)} not in {config}'s ablations.variants")
        ablations["variants"] = {k: v for k, v in ablations["variants"].items() if k in variants}
    path = workdir / "ablations.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class LoadSampler:
    """The 1-minute load average, read every `every_s` seconds in a thread while the bench runs:
    the machine is shared, so wall seconds mean little without it."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.readings: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every_s,), daemon=True)

    def _sample(self, every_s: float) -> None:
        while True:
            self.readings.append(os.getloadavg()[0])
            if self._stop.wait(every_s):
                return

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        r = self.readings
        return {"min": min(r), "median": statistics.median(r), "max": max(r), "samples": len(r)}


# How long one proxy run may take in a --parallel child before the child is taken as hung: ten times
# the slowest measured (bench/RESULTS.md, 2026-12-07: about 200 s a run, two at once on 2 cores at load 13-17).
RUN_LIMIT_S = 2000
# How long a SIGKILLed child may take to be reaped.
KILLED_WAIT_S = 30


def materialize_split(config: Path, key: str, keys: list[str], parallel: int) -> tuple[int, int]:
    """One asset's partitions dealt into `parallel` groups, each materialized by a child process
    (`--materialize`) on the same instance: each run trains in its own process at one torch thread
    (training.cpu_threads), so two at once use both cores. Processes, not threads: Dagster sets up
    its logging per run, and two runs' setup in one process deadlock on the logging locks."""
    groups = [keys[i::parallel] for i in range(parallel) if keys[i::parallel]]
    start = time.monotonic()
    # Each child in a session of its own, so that a hung one is ended with the trainers it launched.
    children = [subprocess.Popen([sys.executable, __file__, "--config", str(config), "--materialize", key,
                                  "--partitions", json.dumps(group)], cwd=REPO, start_new_session=True)
                for group in groups]
    try:
        for child, group in zip(children, groups):
            limit = RUN_LIMIT_S * len(group)
            try:
                code = child.wait(timeout=max(0.0, start + limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise SystemExit(f"{key}: the child materializing {group} ran past {limit:,} s ({RUN_LIMIT_S:,} s a "
                                 f"proxy run), so it is taken as hung and ended with its trainers") from None
            if code:
                raise SystemExit(f"{key}: the child materializing {group} failed (exit {code}; its output is above)")
    finally:  # a failed or hung child ends the step: the others are ended too, not left training
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(timeout=KILLED_WAIT_S)
    return len(keys), len(keys)


def materialize_partitions(config: Path, key: str, partitions: list[str]) -> None:
    """--materialize: the partitions of one asset of the config's graph, one run each."""
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import QUIET_RUN_CONFIG, PlanStep, materialize_step
    from orchestration.instance import prepare_instance_dir
    from refinery.config import load_config

    defs = build_definitions(str(config))
    asset_key = dg.AssetKey.from_user_string(key)
    one = PlanStep([asset_key], defs.resolve_asset_graph().get(asset_key).partitions_def, 1)
    with dg.DagsterInstance.from_config(str(prepare_instance_dir(load_config(config)))) as instance:
        materialize_step(defs, instance, one, QUIET_RUN_CONFIG, only=set(partitions))


def run_graph(config: Path, parallel: int = 1) -> list[dict]:
    """Every asset of the config's graph, one plan step each, timed; returns a row per asset. The
    partitions of an ablation asset that trains (the training pool's) run `parallel` at a time."""
    import warnings

    import dagster as dg

    from assets.training import POOL
    from orchestration.definitions import build_definitions
    from orchestration.demo import QUIET_RUN_CONFIG, PlanStep, execution_plan, materialize_step
    from orchestration.instance import prepare_instance_dir
    from refinery.config import load_config

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    defs = build_definitions(str(config))
    graph = defs.resolve_asset_graph()
    rows = []
    with dg.DagsterInstance.from_config(str(prepare_instance_dir(load_config(config)))) as instance:
        instance.event_log_storage.set_concurrency_slots(POOL, parallel)
        for step in execution_plan(defs):
            for key in step.keys:
                partitions_def = graph.get(key).partitions_def
                one = PlanStep([key], partitions_def, step.per_run if partitions_def else None)
                wall, cpu = time.perf_counter(), cpu_seconds()
                # the proxy runs only: training_run's phases resume one another, so they run in order
                if parallel > 1 and key.to_user_string().startswith("ablation") and POOL in (graph.get(key).pools or ()):
                    keys = partitions_def.get_partition_keys(dynamic_partitions_store=instance)
                    partitions, runs = materialize_split(config, key.to_user_string(), keys, parallel)
                else:
                    partitions, runs = materialize_step(defs, instance, one, QUIET_RUN_CONFIG)
                row = {"asset": key.to_user_string(), "partitions": partitions, "runs": runs,
                       "wall_s": round(time.perf_counter() - wall, 1), "cpu_s": round(cpu_seconds() - cpu, 1)}
                print(f"  {row['asset']}: {partitions} partition(s) in {runs} run(s), {row['wall_s']}s wall, "
                      f"{row['cpu_s']} CPU-s", flush=True)
                rows.append(row)
    return rows


def timings_table(rows: list[dict], crawl_s: float) -> str:
    lines = [f"{'asset':<28} {'parts':>5} {'runs':>4} {'wall s':>8} {'CPU s':>8}",
             f"{'(build the crawl)':<28} {'':>5} {'':>4} {crawl_s:>8.1f} {'':>8}"]
    lines += [f"{r['asset']:<28} {r['partitions']:>5} {r['runs']:>4} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f}" for r in rows]
    ablation = [r for r in rows if r["asset"].startswith("ablation")]
    lines.append(f"{'graph before the ablations':<28} {'':>5} {'':>4} {sum(r['wall_s'] for r in rows if r not in ablation):>8.1f} "
                 f"{sum(r['cpu_s'] for r in rows if r not in ablation):>8.1f}")
    lines.append(f"{'the ablations':<28} {'':>5} {'':>4} {sum(r['wall_s'] for r in ablation):>8.1f} "
                 f"{sum(r['cpu_s'] for r in ablation):>8.1f}")
    return "\n".join(lines)


def seeds_for(sd: float, target: float, most: int = 1000) -> int | None:
    """The fewest paired seeds whose t threshold (alpha 0.05) on per-seed differences of spread `sd`
    is within `target` bits per byte (None past `most`)."""
    from refinery.ablations.stats import t_critical

    return next((n for n in range(2, most + 1) if t_critical(0.05, n - 1) * sd / n ** 0.5 <= target), None)


def resolution_table(report: dict, target: float = 0.01) -> str:
    """Per variant and domain, the smallest difference the paired verdict could call against the
    unpaired (Welch) one on the same runs, and their ratio: what pairing the seeds buys. Then what
    limits resolving `target`: the per-seed differences' spread (seeds needed at that spread) and
    the bootstrap's half-width over the evaluation documents (which more seeds do not shrink)."""
    base = {r["domain"]: r["bpb_by_seed"] for r in report["domains"] if r["variant"] == "funnel"}
    lines = [f"{'variant':<20} {'domain':<12} {'vs funnel':>9} {'paired p':>9} {'detectable':>10} "
             f"{'unpaired p':>10} {'detectable':>10} {'gain':>6} {'sd(diff)':>9} {'docs half':>9} "
             f"{f'seeds for {target}':>14}"]
    for row in report["domains"]:
        if row["detectable"] is None or row["detectable_unpaired"] is None:
            continue
        seeds = sorted(set(row["bpb_by_seed"]) & set(base.get(row["domain"], {})))
        diffs = [row["bpb_by_seed"][s] - base[row["domain"]][s] for s in seeds]
        sd = statistics.stdev(diffs)
        half = (row["interval"][1] - row["interval"][0]) / 2 if row["interval"] else float("nan")
        gain = row["detectable_unpaired"] / row["detectable"] if row["detectable"] else float("inf")
        need = seeds_for(sd, target) if half < target else None
        lines.append(f"{row['variant']:<20} {row['domain']:<12} {row['diff']:>+9.4f} {row['p']:>9.3g} "
                     f"{row['detectable']:>10.4f} {row['p_unpaired']:>10.3g} {row['detectable_unpaired']:>10.4f} "
                     f"{gain:>5.1f}x {sd:>9.4f} {half:>9.4f} "
                     f"{need if need is not None else 'none (documents)' if half >= target else '> 1000':>14}")
    return "\n".join(lines)


def folder_bytes(folder: Path, skip: tuple[str, ...] = ()) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*")
               if p.is_file() and not any(part in skip for part in p.relative_to(folder).parts))


def sizes_table(root: Path) -> str:
    """The variants' bytes against the main data root's (ablations/ left out of it), with and
    without the proxy runs' checkpoints (each variant's runs/)."""
    main = folder_bytes(root, ("ablations", "runs"))
    lines = [f"main data root (ablations/ and runs/ left out): {main:,} bytes"]
    variants = root / "ablations" / "variants"
    total = total_runs = 0
    for v in sorted(p for p in variants.iterdir() if p.is_dir()):
        data, runs = folder_bytes(v, ("runs",)), folder_bytes(v / "runs") if (v / "runs").exists() else 0
        total, total_runs = total + data, total_runs + runs
        lines.append(f"  {v.name:<20} {data:>12,} bytes ({data / main:.3f}x), proxy-run checkpoints {runs:,}")
    lines.append(f"  {'all variants':<20} {total:>12,} bytes ({total / main:.3f}x); with checkpoints "
                 f"{total + total_runs:,} ({(total + total_runs) / main:.3f}x)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "ablations.yaml")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/refinery-bench-ablations"))
    ap.add_argument("--seeds", type=int, help="proxy runs per variant (default: the config's ablations.seeds)")
    ap.add_argument("--variants", help="comma-separated variants to run (default: every one of the config's)")
    ap.add_argument("--tokens", type=int, help="ablations.tokens: every proxy run's budget (default: the config's)")
    ap.add_argument("--parallel", type=int, default=1,
                    help="proxy runs trained at once (each its own process at one torch thread; default 1)")
    ap.add_argument("--json", type=Path, help="write the timings and the table's JSON here")
    ap.add_argument("--materialize", metavar="ASSET", help=argparse.SUPPRESS)  # a --parallel child: ASSET's --partitions
    ap.add_argument("--partitions", type=json.loads, help=argparse.SUPPRESS)
    ap.add_argument("--tables-only", action="store_true",
                    help="print the tables of a finished run in --workdir (the report, resolution, sizes); build nothing")
    args = ap.parse_args()
    if args.materialize:
        os.environ.setdefault("DAGSTER_HOME", str(args.config.parent / "dagster"))
        materialize_partitions(args.config, args.materialize, args.partitions)
        return 0
    config = args.workdir / "ablations.yaml"
    refinery = [sys.executable, "-m", "orchestration.cli", "ablations", "--config", str(config)]
    if args.tables_only:
        table = subprocess.run(refinery, capture_output=True, text=True, cwd=REPO)
        report = subprocess.run([*refinery, "--json"], capture_output=True, text=True, cwd=REPO, check=True)
        print(table.stdout + table.stderr)
        print(resolution_table(json.loads(report.stdout)) + "\n\n" + sizes_table(args.workdir / "root"))
        return table.returncode

    for sub in ("root", "dagster", "crawl"):
        shutil.rmtree(args.workdir / sub, ignore_errors=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(args.workdir / "dagster")
    start = time.perf_counter()
    truth = build_crawl(args.workdir / "crawl")
    crawl_s = time.perf_counter() - start
    summary = truth["summary"]
    buckets = {k: v for k, v in summary.items() if "/" not in k}
    langs = sorted({lang for row in summary.values() for lang in row["languages"]})
    sizes = ", ".join(f"{k} {v['bytes'] / 1e6:.2f}" for k, v in buckets.items())
    print(f"crawl: {sum(v['documents'] for v in buckets.values())} documents, "
          f"{sum(v['bytes'] for v in buckets.values()) / 1e6:.2f} MB of text ({sizes}), {len(langs)} languages "
          f"({' '.join(langs)}), built in {crawl_s:.1f}s")
    assert write_config(args.config, args.workdir, args.seeds,
                        args.variants.split(",") if args.variants else None, args.tokens) == config
    print(f"config: {config}")
    with LoadSampler() as load:
        rows = run_graph(config, args.parallel)
    total = {"wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(cpu_seconds(), 1),
             "parallel": args.parallel, "load_1min": load.summary()}
    print(f"graph and ablations: {total['wall_s']:.0f}s wall, {total['cpu_s']:.0f} CPU-s (this process and the "
          f"trainers), {args.parallel} proxy run(s) at once; 1-minute load average {total['load_1min']['min']:.1f}-"
          f"{total['load_1min']['max']:.1f} (median {total['load_1min']['median']:.1f}, "
          f"{total['load_1min']['samples']} readings)\n")

    table = subprocess.run(refinery, capture_output=True, text=True, cwd=REPO)
    print(table.stdout + table.stderr)
    report = subprocess.run([*refinery, "--json"], capture_output=True, text=True, cwd=REPO, check=True)
    print("== The paired verdict's resolution against the unpaired one, on the same runs")
    print(resolution_table(json.loads(report.stdout)))
    print("\n== The variants' bytes against the main data root's")
    print(sizes_table(args.workdir / "root"))
    print("\n== What each asset cost (wall; CPU of this process and the trainers it waited for)")
    print(timings_table(rows, crawl_s))
    if args.json:
        args.json.write_text(json.dumps({"assets": rows, "total": total, "crawl_s": round(crawl_s, 1), "crawl": summary,
                                         "ablations": json.loads(report.stdout)}, indent=1) + "\n")
    return table.returncode


if __name__ == "__main__":
    raise SystemExit(main())
