"""What Dagster costs on top of the work: the funnel (raw_documents to pii_redacted, dedup and the
quality model included) on the bundled sample, run three ways in one process, side by side:

- bare: the same per-file functions the assets call (ingest, the stages, dedup steps, quality
  model, scoring, PII), in a loop, with no Dagster at all;
- batched: `materialize_graph` into a fresh SQLite Dagster instance with the demo's partitions
  (`by: hash`, single-run backfill policy), so each funnel step is one run over every batch;
- per-file: the same graph with one partition per input file and one run per partition
  (`by: file`, `batches_per_run: 1`), the layout before input batches.

    python bench/orchestration.py --repeats 3

Figures are raw records read per CPU-second of this process (`time.process_time`, every thread;
workers: 1, so no child process does work), the median of `--repeats` runs each, measured in
alternation after one untimed bare run that loads the models. Every run starts from a fresh data
root (and instance), and the bare and batched runs must write byte-identical documents.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from refinery.config.paths import rebase_paths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FUNNEL_END = "pii_redacted"
MODES = {
    "batched": None,  # the demo config's own partitions
    "per-file": {"by": "file", "batches_per_run": 1, "workers": 1},
}


def write_config(work: Path, name: str, partitions: dict | None) -> Path:
    demo = REPO / "configs" / "demo.yaml"
    data = rebase_paths(yaml.safe_load(demo.read_text()), demo.parent)
    data["data_root"] = str(work / name / "out")
    data["partitions"] = {**data.get("partitions", {}), "workers": 1, **(partitions or {})}
    (work / name).mkdir(parents=True)
    path = work / name / "refinery.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def bare_chain(config: Path) -> None:
    """Every funnel step on every file, called directly, in the order the graph runs them."""
    from refinery import stage_file_tasks as tasks
    from refinery.global_steps import dedup_compute as dedup
    from refinery.models.quality_training import train_and_publish
    from refinery.global_steps import exact_dedup as ex
    from refinery.stages import extract, heuristic, ingest, language
    from refinery.global_steps import near_dedup as nd
    from assets.resource import RefineryResource
    from refinery.documents import input_shards

    refinery = RefineryResource(config_path=str(config))
    cfg, root = refinery.config, refinery.root
    shards, cache = input_shards(cfg), {}
    for shard in shards:
        tasks.ingest_file(refinery, shard, cache)
    for name, upstream in ((extract.STAGE, ingest.STAGE), (language.STAGE, extract.STAGE),
                           (heuristic.STAGE, language.STAGE)):
        for shard in shards:
            tasks.run_stage_by_batches(name, upstream, refinery, shard, cache)
    for shard in shards:
        dedup.compute_signatures(cfg, root, shard.key)
    for hash_range in ex.range_keys(cfg.stages.exact_dedup.hash_ranges):
        dedup.compute_exact_range(cfg, root, hash_range)
    for band in nd.band_keys(nd.DedupSettings.from_config(cfg).bands):
        dedup.compute_band_edges(cfg, root, band)
    dedup.compute_clusters(cfg, root)
    for shard in shards:
        dedup.apply_to_shard(cfg, root, shard.key)
    train_and_publish(cfg, root)
    for shard in shards:
        tasks.score_file(refinery, shard, cache)
    for shard in shards:
        tasks.redact_file(refinery, shard, cache)


def dagster_funnel(config: Path, home: Path) -> int:
    """The funnel's assets through `materialize_graph` into a fresh SQLite instance; returns its runs."""
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph

    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    defs = build_definitions(str(config))
    selection = list(dg.AssetSelection.assets(FUNNEL_END).upstream().resolve(defs.resolve_asset_graph()))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return materialize_graph(defs, instance, selection, log=lambda _: None, run_config=QUIET_RUN_CONFIG)


def records_read(config: Path) -> int:
    from refinery.config import load_config
    from refinery.reports.funnel import load_stage_totals
    from refinery.storage import open_data_root

    cfg = load_config(config)
    return load_stage_totals(open_data_root(cfg.resolve(cfg.data_root)))["raw_documents"].stats.docs_in


def documents_digest(config: Path) -> dict[str, str]:
    from refinery.config import load_config
    from refinery.storage import open_data_root

    cfg = load_config(config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    return {k: root.sha256(k) for k in root.list(f"documents/{FUNNEL_END}")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = parser.parse_args()
    os.environ["REFINERY_PROGRESS"] = "0"
    import dagster as dg

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    cpu: dict[str, list[float]] = {"bare": [], **{m: [] for m in args.modes}}
    wall: dict[str, list[float]] = {k: [] for k in cpu}
    runs: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-orchestration-") as tmp:
        work = Path(tmp)
        bare_chain(write_config(work, "warmup", None))  # imports and model loads, untimed
        docs = records_read(work / "warmup" / "refinery.yaml")
        for i in range(args.repeats):
            for mode in cpu:
                config = write_config(work, f"{mode}-{i}", MODES.get(mode))
                c0, w0 = time.process_time(), time.perf_counter()
                if mode == "bare":
                    bare_chain(config)
                else:
                    runs[mode] = dagster_funnel(config, work / f"{mode}-{i}" / "home")
                cpu[mode].append(time.process_time() - c0)
                wall[mode].append(time.perf_counter() - w0)
                assert records_read(config) == docs, mode
            if "batched" in cpu:
                assert documents_digest(work / f"batched-{i}" / "refinery.yaml") == documents_digest(
                    work / f"bare-{i}" / "refinery.yaml"), "the batched graph and the bare chain wrote different bytes"
    bare_rate = docs / statistics.median(cpu["bare"])
    print(f"funnel to {FUNNEL_END} on the bundled sample: {docs} raw records; medians of {args.repeats} runs")
    print(f"{'mode':<10} {'runs':>5} {'CPU s':>8} {'wall s':>8} {'docs/CPU-s':>11} {'vs bare':>8}")
    for mode in cpu:
        rate = docs / statistics.median(cpu[mode])
        print(f"{mode:<10} {runs.get(mode, 0):>5} {statistics.median(cpu[mode]):>8.2f} {statistics.median(wall[mode]):>8.2f} "
              f"{rate:>11.1f} {rate / bare_rate:>7.2f}x")


if __name__ == "__main__":
    main()
