"""`refinery demo`: materialize the whole graph on the bundled sample, in-process, into a real
Dagster instance (so `make ui` shows every run afterwards), then print the funnel table, the
curriculum contract and the training summary.

The graph mixes partition schemes (input shards, hash ranges, LSH bands, buckets, phases), so it is
run level by level in dependency order: each group of assets that shares a partitions definition is
materialized once per partition key. The in-process executor is used on purpose: the multiprocess
one spends 7-10 s starting every step.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import dagster as dg


def execution_plan(defs: dg.Definitions, selection: list[dg.AssetKey] | None = None) -> list[tuple[list[dg.AssetKey], dg.PartitionsDefinition | None]]:
    """Groups of asset keys in dependency order, each group sharing one partitions definition."""
    graph = defs.resolve_asset_graph()
    wanted = set(selection) if selection is not None else None
    plan: list[tuple[list[dg.AssetKey], dg.PartitionsDefinition | None]] = []
    for level in graph.toposorted_asset_keys_by_level:
        groups: dict[int, tuple[list[dg.AssetKey], dg.PartitionsDefinition | None]] = {}
        for key in sorted(level, key=lambda k: k.to_user_string()):
            node = graph.get(key)
            if not node.is_materializable or (wanted is not None and key not in wanted):
                continue
            groups.setdefault(id(node.partitions_def), ([], node.partitions_def))[0].append(key)
        plan.extend(groups.values())
    return plan


QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def materialize_graph(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    selection: list[dg.AssetKey] | None = None,
    log: Callable[[str], None] = print,
    run_config: dict | None = None,
) -> None:
    """Materialize every (selected) asset and partition, raising on the first failure."""
    import dagster as dg

    assets = list(defs.assets or []) + list(defs.asset_checks or [])
    resources = defs.resources or {}
    for keys, partitions_def in execution_plan(defs, selection):
        partition_keys = partitions_def.get_partition_keys(dynamic_partitions_store=instance) if partitions_def else [None]
        names = ", ".join(k.to_user_string() for k in keys)
        start = time.perf_counter()
        for pk in partition_keys:
            result = dg.materialize(
                assets, selection=keys, partition_key=pk, instance=instance, resources=resources,
                run_config=run_config, raise_on_error=True,
            )
            if not result.success:
                raise RuntimeError(f"materializing {names} [{pk}] failed")
        log(f"  {names}: {len(partition_keys)} partition(s) in {time.perf_counter() - start:.1f}s")


def demo_summary(config_path: str) -> str:
    """What the demo made: the funnel, the curriculum contract, the contamination scans and the
    per-phase, per-bucket training tokens and loss."""
    from refinery.config import load_config
    from refinery.contamination import scan_report_key
    from refinery.curriculum import validate_data_root
    from refinery.funnel_report import DEFAULT_BYTES_PER_TOKEN, build_report, format_report, load_stage_totals
    from refinery.storage import open_data_root
    from refinery.validate import render_text
    from training.cli import format_table
    from training.phase_runs import phase_names, phase_run_dir
    from training.status import read_status

    cfg = load_config(config_path)
    root = open_data_root(cfg.resolve(cfg.data_root))
    phases = phase_names(cfg)
    out = ["== Funnel (refinery funnel)", format_report(build_report(
        load_stage_totals(root), cfg.curriculum.total_tokens, DEFAULT_BYTES_PER_TOKEN))]
    out += ["", "== Curriculum contract (refinery validate)", render_text(validate_data_root(cfg, root)[0])]
    out += ["", "== Contamination scans"]
    for phase in phases:
        report = root.read_json(scan_report_key(phase))
        out.append(f"{phase:<10} {report['docs_scanned']:>6} docs scanned, {report['found_before_policy']} contaminated, "
                   f"{len(report['dropped'])} dropped (policy {report['policy']}): "
                   f"{'passed' if report['passed'] else 'FAILED'}")
    status = read_status(phase_run_dir(cfg, phases[-1])) or {}
    summary = status.get("summary") or {}
    ordered = {**status, "summary": {p: summary[p] for p in phases if p in summary}}
    out += ["", "== Training (training_run, one Pipes launch per phase)", format_table(ordered) if status else "not trained"]
    return "\n".join(out)


def run_demo(args: argparse.Namespace) -> int:
    import warnings

    import dagster as dg

    from assets.training import POOL
    from orchestration.definitions import build_definitions

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    home = os.environ.setdefault("DAGSTER_HOME", os.path.abspath(".dagster_home"))
    os.makedirs(home, exist_ok=True)
    instance_yaml = os.path.join(home, "dagster.yaml")
    if not os.path.exists(instance_yaml):  # a fresh demo instance: local storage, no telemetry banner
        with open(instance_yaml, "w") as f:
            f.write("telemetry:\n  enabled: false\n")
    defs = build_definitions(args.config)
    instance = dg.DagsterInstance.get()
    # The UI then shows the pool that keeps two training runs off one accelerator.
    instance.event_log_storage.set_concurrency_slots(POOL, 1)
    print(f"Materializing the asset graph from {args.config} into the Dagster instance at {instance.root_directory}")
    start = time.perf_counter()
    materialize_graph(defs, instance, run_config=None if args.verbose else QUIET_RUN_CONFIG)
    print(f"Graph materialized in {time.perf_counter() - start:.0f}s\n")
    print(demo_summary(args.config))
    print("\nOpen the UI on these runs with `make ui` (http://127.0.0.1:3000).")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="materialize the whole graph on a config (the bundled sample by default)")
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--verbose", action="store_true", help="print every Dagster event, not only warnings")
    p.set_defaults(func=run_demo)
