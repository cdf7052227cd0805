"""How each step of the graph scales with the corpus: CPU per document, peak memory, tasks, data-root size.

    python bench/stage_scale.py --sizes 2000,6000,18000 [--docs-per-file 1000] [--workdir DIR] [--out FILE]

For each size N, N generated documents (`refinery.testing.crawl.write_corpus`: real English
sentences, about 3.6 KB a page, 5% exact and 5% near duplicates) are written as WARC.gz files of
`--docs-per-file` pages each and added to the demo config as a source `grown` (bucket web), beside
the bundled sample. Partitions are by file (`partitions.by: file`, one worker), so the per-batch
steps have one task per input file. The graph then runs as `refinery demo` runs it
(`orchestration.demo.execution_plan`, one Dagster run per partition range), one asset at a time,
up to the phase manifests, contamination scans, lineage index and funnel report; the trainer is
left out.

Each asset's step runs in a process of its own (this script, `--child`), so its figures are its own:
- cpu_s: user + system CPU of the step's process and its pool workers (`getrusage`);
- peak_rss_mib: the larger of the step process's peak RSS and its largest worker's;
- wall_s, partitions, tasks (what the step fans out to: one per partition, or the partition's
  `tasks` metadata where a step splits into tasks of its own, as shuffled_shards and lineage_index
  do) and Dagster runs.
A step process also pays Dagster's imports and the definitions' build (about 2-3 s of CPU): the
`noop` figure, a child that builds the definitions and runs nothing, measures that floor.

Per size: the data root's bytes over the compressed input's bytes (the sample's and the grown
source's files), and the same ratio for each top-level folder of the data root and each stage's
table folder under documents/ and attributes/ (where the bytes are). Figures are one run per size; the machine's load average is printed with them.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = "training_run"  # and everything downstream of it
MARK = "STAGE_SCALE "


def write_config(work: Path, n_docs: int, docs_per_file: int, seed: int) -> Path:
    """The demo config with a `grown` WARC source of `n_docs` generated pages; returns its path."""
    from refinery.testing.crawl import write_corpus

    grown = work / "grown"
    grown.mkdir(parents=True)
    files = -(-n_docs // docs_per_file)
    for i in range(files):
        count = min(docs_per_file, n_docs - i * docs_per_file)
        write_corpus(grown / f"part-{i:04d}.warc.gz", count, seed + i, fmt="warc")
    demo = REPO / "configs" / "demo.yaml"
    data = yaml.safe_load(demo.read_text())
    for src in data["sources"]:
        src["path"] = str((demo.parent / src["path"]).resolve())
    for ev in data.get("contamination", {}).get("eval_sets", []):
        ev["path"] = str((demo.parent / ev["path"]).resolve())
    data["sources"].append({"name": "grown", "path": str(grown / "*.warc.gz"), "format": "warc", "bucket": "web"})
    data["data_root"] = str(work / "out")
    data["partitions"] = {"by": "file", "workers": 1}
    path = work / "refinery.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def plan(config: str):
    """The definitions and one plan step per asset, in `refinery demo`'s order (its steps split,
    so that each asset's figures are its own), the trainer and what follows it left out."""
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import PlanStep, execution_plan

    defs = build_definitions(config)
    graph = defs.resolve_asset_graph()
    selection = (dg.AssetSelection.all() - dg.AssetSelection.assets(LEFT_OUT).downstream()).resolve(graph)
    steps = []
    for step in execution_plan(defs, sorted(selection, key=lambda k: k.to_user_string())):
        for key in step.keys:
            partitions_def = graph.get(key).partitions_def
            steps.append(PlanStep([key], partitions_def, step.per_run if partitions_def else None))
    return defs, steps


def child(config: str, index: int) -> None:
    """Run plan step `index` (-1: build the definitions only) and print its figures."""
    import warnings

    import dagster as dg

    from orchestration.demo import QUIET_RUN_CONFIG, materialize_step

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    start = time.perf_counter()
    defs, steps = plan(config)
    partitions = runs = tasks = 0
    names = "noop"
    if index >= 0:
        step = steps[index]
        names = ", ".join(k.to_user_string() for k in step.keys)
        with dg.DagsterInstance.get() as instance:
            partitions, runs = materialize_step(defs, instance, step, QUIET_RUN_CONFIG)
            tasks = fanned_out_tasks(instance, step.keys)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(MARK + json.dumps({
        "step": names, "partitions": partitions, "tasks": tasks, "runs": runs, "wall_s": round(time.perf_counter() - start, 2),
        "cpu_s": round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 2),
        "peak_rss_mib": round(max(me.ru_maxrss, kids.ru_maxrss) / 1024, 1),  # ru_maxrss is KiB on Linux
    }), flush=True)


def fanned_out_tasks(instance, keys) -> int:
    """The tasks a step's partitions ran as: a partition's `tasks` metadata where its step fans out
    (shuffled_shards, lineage_index; contamination_scan: a phase's tables, one task each, scanned or
    reusing a partial another phase stored), else one per partition (a per-file partition is one task).
    Each partition counted once, by its latest materialization."""
    total = 0
    for key in keys:
        seen, cursor, more = set(), None, True
        while more:
            page = instance.fetch_materializations(key, limit=1000, cursor=cursor, ascending=False)
            for record in page.records:
                materialization = record.asset_materialization
                if materialization.partition in seen:
                    continue
                seen.add(materialization.partition)
                tasks = materialization.metadata.get("tasks")
                total += int(tasks.value) if tasks is not None else 1
            cursor, more = page.cursor, page.has_more
    return total


def run_child(config: Path, home: Path, index: int) -> dict:
    env = {**os.environ, "DAGSTER_HOME": str(home), "REFINERY_PROGRESS": "0"}
    out = subprocess.run([sys.executable, __file__, "--child", str(config), str(index)], env=env,
                         capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith(MARK)]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"step {index} failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK):])


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def folder_bytes(root: Path) -> dict[str, int]:
    """Bytes under each top-level folder of the data root, and under each documents/<stage> and
    attributes/<stage> folder."""
    folders = [p for p in sorted(root.iterdir()) if p.is_dir()]
    tables = [p for name in ("documents", "attributes") if (root / name).is_dir() for p in sorted((root / name).iterdir())]
    return {str(p.relative_to(root)): tree_bytes(p) for p in folders + tables if p.is_dir()}


def input_bytes(config: Path) -> int:
    from refinery.config import load_config
    from refinery.documents import input_shards

    cfg = load_config(config)
    return sum(os.path.getsize(shard.path) for shard in input_shards(cfg))


def corpus_counts(config: Path) -> tuple[int, int]:
    """Raw documents read and final tokens over every bucket."""
    from refinery import layout
    from refinery.config import load_config
    from refinery.funnel_report import load_stage_totals
    from refinery.stages.tokenize import FINAL
    from refinery.storage import open_data_root

    cfg = load_config(config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    docs = load_stage_totals(root)["raw_documents"].stats.docs_in
    tokens = sum(root.read_json(layout.shard_index_key(FINAL, b))["tokens"] for b in cfg.buckets
                 if root.exists(layout.shard_index_key(FINAL, b)))
    return docs, tokens


def measure(n_docs: int, args) -> dict:
    work = Path(args.workdir) / f"n{n_docs}"
    if work.exists():
        shutil.rmtree(work)
    config = write_config(work, n_docs, args.docs_per_file, args.seed)
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    _, steps = plan(str(config))
    noop = run_child(config, home, -1)
    rows = []
    for i in range(len(steps)):
        row = run_child(config, home, i)
        rows.append(row)
        print(f"  n={n_docs} {row}", flush=True)
    docs, tokens = corpus_counts(config)
    size_in, size_root = input_bytes(config), tree_bytes(work / "out")
    return {"grown_docs": n_docs, "raw_docs": docs, "final_tokens": tokens, "input_bytes": size_in,
            "data_root_bytes": size_root, "data_root_over_input": round(size_root / size_in, 2),
            "folders_over_input": {k: round(v / size_in, 3) for k, v in folder_bytes(work / "out").items()},
            "noop": noop, "steps": rows, "load_avg": os.getloadavg()}


def summary(results: list[dict]) -> str:
    """One line per step: CPU per raw document and peak RSS at each size, and the peak's growth."""
    lines = ["| step | tasks | " + " | ".join(f"CPU ms/doc @{r['raw_docs']}" for r in results) + " | "
             + " | ".join(f"peak MiB @{r['raw_docs']}" for r in results) + " | peak growth |"]
    lines.append("| --- " * (3 + 2 * len(results)) + "|")
    for i, first in enumerate(results[0]["steps"]):
        rows = [r["steps"][i] for r in results]
        cpu = [f"{1000 * row['cpu_s'] / r['raw_docs']:.2f}" for row, r in zip(rows, results)]
        peak = [f"{row['peak_rss_mib']:.0f}" for row in rows]
        growth = rows[-1]["peak_rss_mib"] / rows[0]["peak_rss_mib"]
        tasks = "/".join(str(row.get("tasks", row["partitions"])) for row in rows)
        lines.append(f"| {first['step']} | {tasks} | " + " | ".join(cpu) + " | " + " | ".join(peak) + f" | {growth:.2f}x |")
    lines.append("")
    lines.extend(size_lines(r) for r in results)
    return "\n".join(lines)


def size_lines(r: dict) -> str:
    """One size's corpus, data root over the input (whole and by folder), noop step and load."""
    return (f"- {r['raw_docs']} raw documents ({r['grown_docs']} grown), {r['final_tokens']:,} final tokens: "
            f"data root {r['data_root_bytes'] / 2**20:.1f} MiB over input {r['input_bytes'] / 2**20:.1f} MiB "
            f"= {r['data_root_over_input']}x; noop step {r['noop']['cpu_s']} CPU-s, "
            f"{r['noop']['peak_rss_mib']} MiB; load {tuple(round(x, 1) for x in r['load_avg'])}\n"
            "  over the input: " + ", ".join(f"{k} {v}x" for k, v in r["folders_over_input"].items()))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2000,6000,18000", help="generated documents per run, comma-separated")
    ap.add_argument("--docs-per-file", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", default="/tmp/refinery-bench-stage-scale")
    ap.add_argument("--out", help="write every figure as JSON here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    for n in sizes:
        print(f"n={n}: writing the corpus and running the graph", flush=True)
        results.append(measure(n, args))
        print(size_lines(results[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(summary(results))


if __name__ == "__main__":
    main()
