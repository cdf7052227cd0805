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


def materialize_graph(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    selection: list[dg.AssetKey] | None = None,
    log: Callable[[str], None] = print,
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
                assets, selection=keys, partition_key=pk, instance=instance, resources=resources, raise_on_error=True
            )
            if not result.success:
                raise RuntimeError(f"materializing {names} [{pk}] failed")
        log(f"  {names}: {len(partition_keys)} partition(s) in {time.perf_counter() - start:.1f}s")


def run_demo(args: argparse.Namespace) -> int:
    import dagster as dg

    from orchestration.definitions import build_definitions

    home = os.environ.setdefault("DAGSTER_HOME", os.path.abspath(".dagster_home"))
    os.makedirs(home, exist_ok=True)
    defs = build_definitions(args.config)
    instance = dg.DagsterInstance.get()
    print(f"Materializing the asset graph from {args.config} into the Dagster instance at {instance.root_directory}")
    start = time.perf_counter()
    materialize_graph(defs, instance)
    print(f"Graph materialized in {time.perf_counter() - start:.0f}s\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="materialize the whole graph on a config (the bundled sample by default)")
    p.add_argument("--config", default="configs/demo.yaml")
    p.set_defaults(func=run_demo)
