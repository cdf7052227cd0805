"""How each step of the graph scales with the corpus, grown three ways: CPU per document, peak memory
of each step and of its largest task, tasks, data-root size.

    python bench/stage_scale.py [--shapes files,filesize,docsize] [--factors 1,4,16] [--files 2]
        [--docs-per-file 200] [--tome-files 2] [--tomes-per-file 10] [--tome-kib 48]
        [--batch-bytes 1048576] [--workers 2] [--one-process] [--workdir DIR] [--out FILE]
    python bench/stage_scale.py --summarize OUT.json [OUT.json ...]   # runs split over invocations

The base corpus is the bundled sample plus two generated sources: `grown` (bucket web), `--files`
WARC.gz files of `--docs-per-file` pages (`synthetic.crawl.write_corpus`: real English
sentences, about 3.6 KB a page, 5% exact and 5% near duplicates), and `tomes` (bucket books),
`--tome-files` JSONL.gz files of `--tomes-per-file` book-sized records of about `--tome-kib` KiB
(real English sentences with a seeded share of their words swapped, so no two are near
duplicates). Each shape grows one of them by each of `--factors` (the base is factor 1, run once
and shared by the shapes):
- files: more `grown` files of the same size (the corpus grows as a crawl snapshot does);
- filesize: the same `grown` files, each with factor times the pages (a 1 GB WARC file);
- docsize: the same `tomes` records, each factor times larger (books, code dumps).
`stages.extract.batch_bytes` is set to `--batch-bytes` (default its 1 MiB floor), so that at these
sizes a grown file spans many batches, as a 1 GB file does at the default 64 MiB.

Partitions are by file with `partitions.workers: --workers`. At 2 (the default) a step's per-file
tasks (and the tasks a global step fans out) run in pool worker processes apart from the step's own;
at 1 they run in the step's process, whose peak is then also its largest task's. The graph runs as
`refinery demo` runs it (`orchestration.demo.execution_plan`, one Dagster run per partition range),
one asset at a time, up to the phase manifests, contamination scans, lineage index and funnel
report; the trainer is left out. Each asset's step runs in a process of its own (this script,
`--child`), so its figures are its own:
- cpu_s: user + system CPU of the step's process and its pool workers (`getrusage`);
- step_peak_mib: the peak resident memory (VmHWM) of the step's process and of every process under
  it, the largest; task_peak_mib: the largest VmHWM among the processes under it (its pool workers:
  the largest task's peak), or the step process's own when none ran (tasks in the step's process). VmHWM, not ru_maxrss, which a spawned child
  inherits from its parent; the step's own is read as it ends, its workers' by this script from
  /proc every SAMPLE_S seconds while they run (a peak reached in the last interval before a
  worker exits can be missed);
- wall_s, partitions, tasks (what the step fans out to: one per partition, or the partition's
  `tasks` metadata where a step splits into tasks of its own, as shuffled_shards and lineage_index
  do) and Dagster runs.
A step process also pays Dagster's imports and the definitions' build (about 2-3 s of CPU): the
`noop` figure, a child that builds the definitions and runs nothing, measures that floor.
`--one-process` runs every step in one child instead (one import and build for the whole graph,
for a loaded machine): a step's peak is that process's VmHWM reset at the step's start
(/proc/self/clear_refs), so it also holds what earlier steps left resident, and tasks run in it
(`--workers 1`); its growth across sizes still compares the same step.

Per size: the data root's bytes over the compressed input's bytes (the sample's and the generated
sources' files), and the same ratio for each top-level folder of the data root and each stage's
table folder under documents/ and attributes/ (where the bytes are). Figures are one run per size;
the machine's load average is printed with them.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from refinery.config.paths import rebase_paths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = "training_run"  # and everything downstream of it
MARK = "STAGE_SCALE "


SAMPLE_S = 0.05  # how often the workers' VmHWM is read


@dataclass(frozen=True)
class Corpus:
    """The generated part of a run's corpus: `files` grown WARC files of `docs_per_file` pages and
    `tome_files` JSONL files of `tomes_per_file` records of about `tome_bytes` bytes."""

    files: int
    docs_per_file: int
    tome_files: int
    tomes_per_file: int
    tome_bytes: int

    def grown(self, shape: str, factor: int) -> "Corpus":
        if shape == "files":
            return replace(self, files=self.files * factor)
        if shape == "filesize":
            return replace(self, docs_per_file=self.docs_per_file * factor)
        if shape == "docsize":
            return replace(self, tome_bytes=self.tome_bytes * factor)
        raise ValueError(f"unknown shape {shape!r}: files, filesize or docsize")


def tome(sentences: list[str], words: list[str], size: int, rng: random.Random) -> str:
    """About `size` bytes of English sentences in paragraphs, a third of their words swapped for
    others drawn by `rng`, so that two tomes share few 5-word shingles."""
    paragraphs, paragraph, total = [], [], 0
    while total < size:
        sentence = " ".join(rng.choice(words) if rng.random() < 0.33 else w for w in rng.choice(sentences).split())
        paragraph.append(sentence)
        total += len(sentence) + 1
        if len(paragraph) == 6:
            paragraphs.append(" ".join(paragraph))
            paragraph = []
    return "\n\n".join(paragraphs + [" ".join(paragraph)] if paragraph else paragraphs)


def write_tomes(folder: Path, corpus: Corpus, seed: int) -> None:
    from synthetic.documents import english_sentences

    sentences = english_sentences()
    words = sorted({w for s in sentences for w in s.split() if w.isalpha()})
    folder.mkdir(parents=True)
    for f in range(corpus.tome_files):
        rng = random.Random(seed * 1000 + f)
        lines = [json.dumps({"url": f"https://tomes.example/{f}/{i}", "text": tome(sentences, words, corpus.tome_bytes, rng)})
                 for i in range(corpus.tomes_per_file)]
        (folder / f"tomes-{f:03d}.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode() + b"\n", mtime=0))


def write_config(work: Path, corpus: Corpus, seed: int, batch_bytes: int, workers: int) -> Path:
    """The demo config with the `grown` and `tomes` sources of `corpus`; returns its path."""
    from synthetic.crawl import write_corpus

    grown = work / "grown"
    grown.mkdir(parents=True)
    for i in range(corpus.files):
        write_corpus(grown / f"part-{i:04d}.warc.gz", corpus.docs_per_file, seed + i, fmt="warc")
    write_tomes(work / "tomes", corpus, seed)
    demo = REPO / "configs" / "demo.yaml"
    data = rebase_paths(yaml.safe_load(demo.read_text()), demo.parent)
    data["sources"].append({"name": "grown", "path": str(grown / "*.warc.gz"), "format": "warc", "bucket": "web"})
    data["sources"].append({"name": "tomes", "path": str(work / "tomes" / "*.jsonl.gz"), "format": "jsonl",
                            "bucket": "books"})
    data["data_root"] = str(work / "out")
    data["partitions"] = {"by": "file", "workers": workers}
    data.setdefault("stages", {}).setdefault("extract", {})["batch_bytes"] = batch_bytes
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
        "own_peak_mib": round(vm_hwm_kib("self") / 1024, 1),
    }), flush=True)


def child_all(config: str) -> None:
    """Run every plan step in this one process, in order, and print each step's figures: its peak
    is this process's VmHWM from the step's start (reset through /proc/self/clear_refs), so it
    includes what earlier steps left resident (imports, models, allocator pools)."""
    import warnings

    import dagster as dg

    from orchestration.demo import QUIET_RUN_CONFIG, materialize_step

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    defs, steps = plan(config)
    with dg.DagsterInstance.get() as instance:
        for step in steps:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM back to the current resident size
            start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            partitions, runs = materialize_step(defs, instance, step, QUIET_RUN_CONFIG)
            after = resource.getrusage(resource.RUSAGE_SELF)
            print(MARK + json.dumps({
                "step": ", ".join(k.to_user_string() for k in step.keys), "partitions": partitions,
                "tasks": fanned_out_tasks(instance, step.keys), "runs": runs,
                "wall_s": round(time.perf_counter() - start, 2),
                "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
                "own_peak_mib": round(vm_hwm_kib("self") / 1024, 1),
            }), flush=True)


def vm_hwm_kib(pid: int | str) -> int:
    """A process's peak resident memory (VmHWM, KiB); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return 0


def descendants(root: int) -> list[int]:
    """The processes under `root` (its children, theirs, ...), read from /proc."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [root]
    while frontier:
        frontier = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += frontier
    return found


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
    """One plan step in a fresh process; its figures, with the largest VmHWM of the processes under
    it (its workers: the task peak), read from /proc while it runs."""
    env = {**os.environ, "DAGSTER_HOME": str(home), "REFINERY_PROGRESS": "0"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(config), str(index)], env=env,
                                stdout=out, stderr=err, text=True)
        task_peak = 0
        while proc.poll() is None:
            for pid in descendants(proc.pid):
                task_peak = max(task_peak, vm_hwm_kib(pid))
            time.sleep(SAMPLE_S)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"step {index} failed (exit {proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    row = json.loads(lines[-1][len(MARK):])
    row["task_peak_mib"] = round(task_peak / 1024, 1) if task_peak else row["own_peak_mib"]
    row["step_peak_mib"] = max(row["own_peak_mib"], row["task_peak_mib"])
    return row


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
    from refinery.reports.funnel import load_stage_totals
    from refinery.global_steps.tokenize import FINAL
    from refinery.storage import open_data_root

    cfg = load_config(config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    docs = load_stage_totals(root)["raw_documents"].stats.docs_in
    tokens = sum(root.read_json(layout.shard_index_key(FINAL, b))["tokens"] for b in cfg.buckets
                 if root.exists(layout.shard_index_key(FINAL, b)))
    return docs, tokens


def run_all(config: Path, home: Path) -> list[dict]:
    """Every plan step in one fresh process (`child_all`); each step's figures."""
    env = {**os.environ, "DAGSTER_HOME": str(home), "REFINERY_PROGRESS": "0"}
    out = subprocess.run([sys.executable, __file__, "--child-all", str(config)], env=env, capture_output=True, text=True)
    rows = [json.loads(line[len(MARK):]) for line in out.stdout.splitlines() if line.startswith(MARK)]
    if out.returncode != 0:
        raise SystemExit(f"the graph failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    for row in rows:
        row["task_peak_mib"] = row["step_peak_mib"] = row["own_peak_mib"]
    return rows


def measure(label: str, corpus: Corpus, args) -> dict:
    work = Path(args.workdir) / label
    if work.exists():
        shutil.rmtree(work)
    config = write_config(work, corpus, args.seed, args.batch_bytes, args.workers)
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    noop = run_child(config, home, -1)
    if args.one_process:
        rows = run_all(config, home)
        for row in rows:
            print(f"  {label} {row}", flush=True)
    else:
        _, steps = plan(str(config))
        rows = []
        for i in range(len(steps)):
            row = run_child(config, home, i)
            rows.append(row)
            print(f"  {label} {row}", flush=True)
    docs, tokens = corpus_counts(config)
    size_in, size_root = input_bytes(config), tree_bytes(work / "out")
    return {"label": label, "corpus": asdict(corpus), "raw_docs": docs, "final_tokens": tokens, "input_bytes": size_in,
            "data_root_bytes": size_root, "data_root_over_input": round(size_root / size_in, 2),
            "folders_over_input": {k: round(v / size_in, 3) for k, v in folder_bytes(work / "out").items()},
            "noop": noop, "steps": rows, "load_avg": os.getloadavg()}


def growth(values: list[float]) -> str:
    return f"{values[-1] / values[0]:.2f}x" if values[0] else "-"


def summary(shape: str, results: list[dict]) -> str:
    """One line per step of one shape: CPU per raw document, the step's and its largest task's peak
    at each size, and the peaks' growth from the smallest size to the largest."""
    sizes = [r["label"] for r in results]
    lines = [f"shape {shape}: " + ", ".join(f"{r['label']} = {r['raw_docs']} raw documents" for r in results), "",
             "| step | tasks | " + " | ".join(f"CPU ms/doc {s}" for s in sizes) + " | "
             + " | ".join(f"step peak MiB {s}" for s in sizes) + " | growth | "
             + " | ".join(f"task peak MiB {s}" for s in sizes) + " | growth |"]
    lines.append("| --- " * (4 + 3 * len(results)) + "|")
    for i, first in enumerate(results[0]["steps"]):
        rows = [r["steps"][i] for r in results]
        cpu = [f"{1000 * row['cpu_s'] / r['raw_docs']:.2f}" for row, r in zip(rows, results)]
        steps = [row["step_peak_mib"] for row in rows]
        tasks_peak = [row["task_peak_mib"] for row in rows]
        tasks = "/".join(str(row.get("tasks", row["partitions"])) for row in rows)
        lines.append(f"| {first['step']} | {tasks} | " + " | ".join(cpu) + " | " + " | ".join(f"{v:.0f}" for v in steps)
                     + f" | {growth(steps)} | " + " | ".join(f"{v:.0f}" for v in tasks_peak) + f" | {growth(tasks_peak)} |")
    lines.append("")
    lines.extend(size_lines(r) for r in results)
    return "\n".join(lines)


def size_lines(r: dict) -> str:
    """One size's corpus, data root over the input (whole and by folder), noop step and load."""
    return (f"- {r['label']}: {r['raw_docs']} raw documents, {r['final_tokens']:,} final tokens, corpus {r['corpus']}: "
            f"data root {r['data_root_bytes'] / 2**20:.1f} MiB over input {r['input_bytes'] / 2**20:.1f} MiB "
            f"= {r['data_root_over_input']}x; noop step {r['noop']['cpu_s']} CPU-s, "
            f"{r['noop']['step_peak_mib']} MiB; load {tuple(round(x, 1) for x in r['load_avg'])}\n"
            "  over the input: " + ", ".join(f"{k} {v}x" for k, v in r["folders_over_input"].items()))


def merged_summary(paths: list[str]) -> str:
    """The summaries of `--out` files of runs split over several invocations (run side by side),
    each shape's sizes in corpus order, the `base` run put first in every shape."""
    by_shape: dict[str, dict[str, dict]] = {}
    for path in paths:
        for shape, results in json.loads(Path(path).read_text()).items():
            by_shape.setdefault(shape, {}).update({r["label"]: r for r in results})
    base = next(r for results in by_shape.values() for r in results.values() if r["label"] == "base")
    return "\n".join(summary(shape, [base] + sorted((r for r in results.values() if r["label"] != "base"),
                                                    key=lambda r: int(r["label"].rsplit("x", 1)[1]))) + "\n"
                     for shape, results in by_shape.items())


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--child-all":
        child_all(sys.argv[2])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--summarize":
        print(merged_summary(sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="files,filesize,docsize", help="comma-separated: files, filesize, docsize")
    ap.add_argument("--factors", default="1,4,16", help="growth factors, comma-separated; the first is the base")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--docs-per-file", type=int, default=200)
    ap.add_argument("--tome-files", type=int, default=2)
    ap.add_argument("--tomes-per-file", type=int, default=10)
    ap.add_argument("--tome-kib", type=int, default=48)
    ap.add_argument("--batch-bytes", type=int, default=1 << 20, help="stages.extract.batch_bytes")
    ap.add_argument("--workers", type=int, default=2, help="partitions.workers")
    ap.add_argument("--one-process", action="store_true",
                    help="run every step in one process, its peak from a VmHWM reset at its start (cheaper; "
                         "a step's peak then includes what earlier steps left resident, and its tasks' run in it)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", default="/tmp/refinery-bench-stage-scale")
    ap.add_argument("--out", help="write every figure as JSON here")
    args = ap.parse_args()
    base = Corpus(args.files, args.docs_per_file, args.tome_files, args.tomes_per_file, args.tome_kib << 10)
    factors = [int(f) for f in args.factors.split(",")]
    measured: dict[Corpus, dict] = {}
    by_shape: dict[str, list[dict]] = {}
    for shape in args.shapes.split(","):
        by_shape[shape] = []
        for factor in factors:
            corpus = base.grown(shape, factor)
            if corpus not in measured:
                label = f"{shape}-x{factor}" if corpus != base else "base"
                print(f"{label}: writing the corpus and running the graph", flush=True)
                measured[corpus] = measure(label, corpus, args)
                print(size_lines(measured[corpus]), flush=True)
            by_shape[shape].append(measured[corpus])
            if args.out:  # after every size: a long run interrupted keeps what it measured
                Path(args.out).write_text(json.dumps(by_shape, indent=1))
    for shape, results in by_shape.items():
        print(summary(shape, results) + "\n")


if __name__ == "__main__":
    main()
