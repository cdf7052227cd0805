"""`refinery demo --changed`: materialize only the assets and partitions that are missing or stale,
saying first what will run and why.

Staleness is Dagster's own (`CachingStaleStatusResolver`, what the UI's "stale" badge shows): a
partition never materialized is missing; one whose asset's code version differs from the one it was
materialized with (an edited stage, an edited custom filter: assets/funnel.py puts the filters'
source in heuristic_filtered's version; an edited config value the asset reads: `CONFIG_READ` in
assets/provenance.py) has a new code version; one whose inputs' data versions
moved since has changed upstream. Dagster reports only direct causes, so what depends on a planned
partition is planned too ("upstream reruns"): after the rerun its input may change. Data versions are
the hash of what each partition wrote (assets/factory.py), so a rerun that writes the same bytes
stops the wave there when the plan is made again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dagster as dg

MISSING, CODE_CHANGED, UPSTREAM_CHANGED, UPSTREAM_RERUNS = (
    "missing", "code or config changed", "upstream data changed", "upstream reruns")


@dataclass
class PlannedAsset:
    """One asset of the plan: the partitions to materialize (None for an unpartitioned asset) and
    why, each reason with the partitions it applies to."""

    key: dg.AssetKey
    partitions: list[str] | None
    reasons: dict[str, list[str | None]]

    def line(self) -> str:
        why = "; ".join(f"{reason} ({_partition_count(keys)})" for reason, keys in self.reasons.items())
        return f"  {self.key.to_user_string()}: {why}"


def _partition_count(keys: list[str | None]) -> str:
    return "unpartitioned" if keys == [None] else f"{len(keys)} partition(s)"


def _stale_reason(resolver, key: dg.AssetKey, partition: str | None) -> str | None:
    from dagster._core.definitions.data_version import StaleCauseCategory, StaleStatus

    status = resolver.get_status(key, partition)
    if status == StaleStatus.MISSING:
        return MISSING
    if status == StaleStatus.FRESH:
        return None
    causes = resolver.get_stale_causes(key, partition)
    if any(c.category == StaleCauseCategory.CODE and c.asset_key == key for c in causes):
        return CODE_CHANGED
    return UPSTREAM_CHANGED


def stale_plan(defs: dg.Definitions, instance: dg.DagsterInstance,
               selection: list[dg.AssetKey] | None = None) -> list[PlannedAsset]:
    """Every materializable (selected) asset with a missing or stale partition, or a partition that
    reads one that will rerun, in dependency order."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver
    from dagster._core.loader import LoadingContextForTest

    graph = defs.resolve_asset_graph()
    # The loading context Dagster gives a caller outside a UI request.
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    planned: dict[dg.AssetKey, set[str | None]] = {}
    plan: list[PlannedAsset] = []
    for level in graph.toposorted_asset_keys_by_level:
        for key in sorted(level, key=lambda k: k.to_user_string()):
            node = graph.get(key)
            if not node.is_materializable or (selection is not None and key not in selection):
                continue
            keys = node.partitions_def.get_partition_keys(dynamic_partitions_store=instance) \
                if node.partitions_def else [None]
            reasons: dict[str, list[str | None]] = {}
            for partition in keys:
                reason = _stale_reason(resolver, key, partition)
                if reason is None and _reads_planned(graph, planned, key, partition):
                    reason = UPSTREAM_RERUNS
                if reason is not None:
                    reasons.setdefault(reason, []).append(partition)
            if reasons:
                chosen = [p for p in keys if any(p in ps for ps in reasons.values())]
                planned[key] = set(chosen)
                plan.append(PlannedAsset(key, None if chosen == [None] else chosen, reasons))
    return plan


def _reads_planned(graph, planned: dict, key: dg.AssetKey, partition: str | None) -> bool:
    """Whether this partition of `key` reads a partition of a parent that the plan reruns."""
    for parent in graph.get(key).parent_keys:
        if parent not in planned:
            continue
        if None in planned[parent] or partition is None:
            return True
        upstream = graph.get_parent_partition_keys_for_child(partition, parent, key).partitions_subset
        if planned[parent] & set(upstream.get_partition_keys()):
            return True
    return False
