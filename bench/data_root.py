"""The data root per store over the compressed input, on the bundled sample grown to a number of
documents in the same files, through the whole `refinery demo` (trainer included).

    python bench/data_root.py [--docs 5000,20000] [--seed 11] [--workdir DIR] [--out FILE]
    python bench/data_root.py --ablations [--workdir DIR]   # the variants against the main data root

For each size, every well-formed file of data/sample (the damaged `-9x-` ones are copied as they
are) gets generated documents appended in its own format (`synthetic.crawl.write_corpus`: real
English sentences, about 3.6 KB a document, 5% exact and 5% near copies within a file; a WARC file
gets per-record gzip members, a JSONL.gz file a second gzip member, a JSONL file more lines), so that
the sample's documents and the generated ones total about `--docs`, in the same number of files as
the sample. configs/demo.yaml is rebased onto the copy (its data root in the size's folder) and run
by `refinery demo` in a process of its own. Then the store table `refinery funnel` prints
(refinery/reports/stores.py): bytes per store over the input's compressed bytes, with and without
the trainer's checkpoints, whose size is the model's and not the corpus's.

`--ablations`: the bundled ablation crawl (data/ablations/build_crawl.py) through configs/ablations.yaml's
graph as bench/ablations.py writes it, every asset but what reads the variants (their proxy runs,
schedule runs and report) and the main trainer (`training_run` and what follows it), then
bench/ablations.py's `sizes_table`: each variant's bytes against the main data root's.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from refinery.config.paths import rebase_paths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
FORMATS = {".warc.gz": "warc", ".jsonl.gz": "jsonl", ".jsonl": "jsonl"}


def sample_documents() -> int:
    return len(json.loads((SAMPLE / "ground_truth.json").read_text())["documents"])


def grown_files() -> list[Path]:
    """The sample's well-formed files, the ones documents are appended to."""
    return sorted(p for p in SAMPLE.rglob("*") if p.is_file() and "-9" not in p.name
                  and any(p.name.endswith(suffix) for suffix in FORMATS))


def grow_sample(folder: Path, docs: int, seed: int) -> None:
    """A copy of data/sample in `folder` whose well-formed files hold about `docs` documents in all."""
    from synthetic.crawl import write_corpus

    shutil.copytree(SAMPLE, folder)
    files = grown_files()
    per_file = max(0, -(-(docs - sample_documents()) // len(files)))
    for i, path in enumerate(files):
        suffix = next(s for s in FORMATS if path.name.endswith(s))
        with tempfile.TemporaryDirectory() as tmp:
            extra = Path(tmp) / f"extra{suffix}"
            write_corpus(extra, per_file, seed * 1000 + i, FORMATS[suffix])
            with open(folder / path.relative_to(SAMPLE), "ab") as f:
                f.write(extra.read_bytes())


def write_config(work: Path) -> Path:
    """configs/demo.yaml with its sample sources moved to `work`/sample and its data root in `work`."""
    demo = REPO / "configs" / "demo.yaml"
    data = rebase_paths(yaml.safe_load(demo.read_text()), demo.parent,
                        sources=lambda path: str(work / "sample" / path.relative_to(SAMPLE)))
    data["data_root"] = str(work / "out")
    path = work / "refinery.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def measure(work: Path, docs: int, seed: int) -> dict:
    from refinery.config import load_config
    from refinery.reports.funnel import load_stage_totals
    from refinery.reports.stores import format_budget, store_budget
    from refinery.storage import open_data_root

    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    grow_sample(work / "sample", docs, seed)
    config = write_config(work)
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "REFINERY_PROGRESS": "0"}
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "orchestration.cli", "demo", "--config", str(config)],
                         env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (work / "demo.log").write_text(run.stdout + run.stderr)
    if run.returncode != 0:
        raise SystemExit(f"refinery demo failed (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    cfg = load_config(config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    budget = store_budget(root, cfg)
    raw_docs = load_stage_totals(root)["raw_documents"].stats.docs_in
    print(f"{docs} documents asked, {raw_docs} raw documents, demo {wall:.0f} s wall, load "
          f"{tuple(round(x, 1) for x in os.getloadavg())}\n{format_budget(budget)}", flush=True)
    return {"docs": docs, "raw_docs": raw_docs, "wall_s": round(wall, 1), "load_avg": os.getloadavg(), **budget}


def ablation_sizes(workdir: Path) -> str:
    """The ablation graph up to the variants (module docstring) in `workdir`; the sizes table."""
    import warnings

    import dagster as dg

    from assets.training import POOL
    from bench.ablations import build_crawl, sizes_table
    from bench.ablations import write_config as write_ablation_config
    from orchestration.definitions import build_definitions
    from orchestration.demo import QUIET_RUN_CONFIG, execution_plan, materialize_step
    from orchestration.instance import prepare_instance_dir
    from refinery.config import load_config

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    for sub in ("root", "dagster", "crawl"):
        shutil.rmtree(workdir / sub, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(workdir / "dagster")
    build_crawl(workdir / "crawl")
    config = write_ablation_config(REPO / "configs" / "ablations.yaml", workdir, None, None)
    defs = build_definitions(str(config))
    variants = dg.AssetSelection.assets("ablation_variants")
    readers = variants.downstream() - variants
    selection = (dg.AssetSelection.all() - readers - dg.AssetSelection.assets("training_run").downstream()
                 ).resolve(defs.resolve_asset_graph())
    with dg.DagsterInstance.from_config(str(prepare_instance_dir(load_config(config)))) as instance:
        instance.event_log_storage.set_concurrency_slots(POOL, 1)
        for step in execution_plan(defs, sorted(selection, key=lambda k: k.to_user_string())):
            materialize_step(defs, instance, step, QUIET_RUN_CONFIG)
    return sizes_table(workdir / "root")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", default="5000,20000", help="documents per size, comma-separated")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workdir", default="/tmp/refinery-bench-data-root")
    ap.add_argument("--out", help="write every figure as JSON here")
    ap.add_argument("--ablations", action="store_true", help="the ablation variants' bytes instead (module docstring)")
    args = ap.parse_args()
    if args.ablations:
        print(ablation_sizes(Path(args.workdir) / "ablations"))
        return
    results = []
    for docs in (int(d) for d in args.docs.split(",")):
        results.append(measure(Path(args.workdir) / f"docs-{docs}", docs, args.seed))
        if args.out:  # after every size: a long run interrupted keeps what it measured
            Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
