"""Difficulty order ablation (issue 28, item 5): the demo curriculum trained twice on the demo's own
pipeline output, once as configured (a uniform shuffle in every phase) and once with the main phase
`order: {by: difficulty, direction: easy_first, bands: 10}`, then each bucket's validation loss at
the end of both runs.

    python bench/difficulty_ablation.py [--config configs/demo.yaml] [--bands 10] [--eval-entries 32]
                                        [--workdir /tmp/refinery-bench-difficulty]

1. The pipeline up to `shuffled_shards` is materialized from `--config` (Dagster in-process, as
   `refinery demo` runs it) into `<workdir>/pipeline` (the config with its data root there and its
   relative source and eval-set paths made absolute, so the demo's own output is left alone),
   unless that already holds final shards whose entry tables carry the `difficulty` column; then
   the final shards are copied to `<workdir>/root`.
2. For each variant: the config with that data root, validation loss on (`--eval-entries` held-out
   entries per bucket, the same entries in both runs: they are chosen by the seed, not the order)
   every eighth of the run, web's max_epochs raised from 4 to 5 (the held-out entries leave
   training, and the demo reads web 3.3 times), the phase manifests rebuilt for the variant, and
   `Trainer.train()` from scratch into `<workdir>/run-<variant>`. max_epochs bounds each entry set:
   with the order, main reads web through a set of its own, so its budget is counted apart from
   warmup's and reasoning's (as a quality selection's is).
3. Printed: the last `val_loss/<bucket>` of each run, the difference, and each run's final
   training loss. One seed, one run per variant: on the demo's 328K tokens a difference of a few
   hundredths is within what another seed would move.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from refinery.config import RefineryConfig, load_config, parse_config, read_yaml  # noqa: E402
from refinery.config.paths import rebase_paths  # noqa: E402
from refinery.storage import LocalDataRoot  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WEB_MAX_EPOCHS = 5


def has_scored_shards(root: Path, buckets: list[str]) -> bool:
    import pyarrow.parquet as pq

    tables = [root / f"shards/final/{b}/entries.parquet" for b in buckets]
    return all(t.exists() and "difficulty" in pq.ParquetFile(t).schema_arrow.names for t in tables)


def pipeline_config(raw: dict, config: Path, workdir: Path) -> Path:
    """`raw` with its data root at <workdir>/pipeline and its relative paths absolute, as a file."""
    import yaml

    data = rebase_paths(raw, config.parent)
    data["data_root"] = str(workdir / "pipeline")
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def materialize_final_shards(config: Path, workdir: Path) -> None:
    """The graph up to shuffled_shards (and whatever it depends on), as `refinery demo` runs it."""
    import warnings

    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    home = workdir / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    defs = build_definitions(str(config))
    graph = defs.resolve_asset_graph()
    wanted = list(dg.AssetSelection.assets("shuffled_shards").upstream().resolve(graph))
    cfg = load_config(config)
    if cfg.partitions.dynamic:
        from assets.partitions import register_input_batches

        register_input_batches(cfg, dg.DagsterInstance.get())
    materialize_graph(defs, dg.DagsterInstance.get(), selection=wanted, run_config=QUIET_RUN_CONFIG)


def variant_config(raw: dict, config: Path, root: Path, order: dict | None, eval_entries: int) -> RefineryConfig:
    data = copy.deepcopy(raw)
    data["data_root"] = str(root)
    total = int(data["curriculum"]["total_tokens"])
    data["training"] = {**data.get("training", {}), "eval_entries_per_bucket": eval_entries,
                        "eval_every_tokens": total // 8}
    # Held-out entries leave training, and the demo reads web 3.3 times of its allowed 4: one more
    # pass keeps both variants from running it dry (the same in both, so the comparison stands).
    data["curriculum"]["buckets"]["web"] = {**data["curriculum"]["buckets"].get("web", {}), "max_epochs": WEB_MAX_EPOCHS}
    phases = data["curriculum"]["phases"]
    main = next(p for p in phases if p["name"] == "main")
    if order is not None:
        main["order"] = order
    return parse_config(data, base_dir=str(config.resolve().parent), origin=str(config))


def build_manifests(cfg: RefineryConfig) -> None:
    from refinery.curriculum import build_phase_manifest, validate_data_root, write_manifest

    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    report, inventory, selections = validate_data_root(cfg, root)
    if not report.ok:
        raise SystemExit(f"the variant's curriculum is invalid: {[str(e) for e in report.errors]}")
    for phase in cfg.curriculum.phases:
        write_manifest(root, build_phase_manifest(cfg, root, phase.name, report, inventory, selections))
    for line in [f"  {p['name']}: {p.get('order')}" for p in report.contract["phases"]]:
        print(line)
    progress = (report.contract.get("difficulty") or {}).get("progress", {})
    for name, values in progress.items():
        print(f"  mean difficulty served in {name} by tenth: {' '.join(f'{v:.3f}' for v in values if v is not None)}")


def train(cfg: RefineryConfig, run_dir: Path) -> dict:
    from training.metrics import JsonLines
    from training.trainer import RunOptions, Trainer

    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.perf_counter()
    result = Trainer(cfg, RunOptions(run_dir=str(run_dir), resume="never")).train()
    seconds = time.perf_counter() - start
    records = JsonLines(run_dir / "metrics.jsonl").read()
    val = {}
    for r in records:
        val.update({k.removeprefix("val_loss/"): v for k, v in r.items() if k.startswith("val_loss/")})
    train_loss = [r["loss/total"] for r in records if "loss/total" in r][-1]
    return {"state": result["state"], "val_loss": val, "train_loss": train_loss, "seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs/demo.yaml"))
    ap.add_argument("--bands", type=int, default=10)
    ap.add_argument("--eval-entries", type=int, default=32)
    ap.add_argument("--workdir", default="/tmp/refinery-bench-difficulty")
    args = ap.parse_args()
    config, workdir = Path(args.config).resolve(), Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    raw = read_yaml(config)
    pipeline = pipeline_config(raw, config, workdir)
    cfg = load_config(pipeline)
    source = Path(cfg.resolve(cfg.data_root))
    if not has_scored_shards(source, list(cfg.buckets)):
        print(f"materializing the pipeline up to shuffled_shards into {source}")
        start = time.perf_counter()
        materialize_final_shards(pipeline, workdir)
        print(f"  done in {time.perf_counter() - start:.0f}s")
    root = workdir / "root"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(source / "shards/final", root / "shards/final")
    results = {}
    for name, order in (("uniform", None), ("easy_first", {"by": "difficulty", "direction": "easy_first",
                                                            "bands": args.bands})):
        print(f"variant {name}:")
        variant = variant_config(raw, config, root, order, args.eval_entries)
        build_manifests(variant)
        results[name] = train(variant, workdir / f"run-{name}")
        print(f"  {results[name]['state']} in {results[name]['seconds']:.0f}s")
    buckets = sorted(results["uniform"]["val_loss"])
    print("\n| bucket | val loss, uniform | val loss, easy_first main | easy_first - uniform |")
    print("| --- | ---: | ---: | ---: |")
    for b in buckets:
        u, e = results["uniform"]["val_loss"][b], results["easy_first"]["val_loss"].get(b)
        print(f"| {b} | {u:.4f} | {e:.4f} | {e - u:+.4f} |")
    print(f"| final training loss | {results['uniform']['train_loss']:.4f} | {results['easy_first']['train_loss']:.4f} | "
          f"{results['easy_first']['train_loss'] - results['uniform']['train_loss']:+.4f} |")
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
