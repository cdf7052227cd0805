"""What Dagster's UI reads about an asset partition: its latest materialization's data version and
metadata, and its stale status from the instance's `CachingStaleStatusResolver`."""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.data_version import DATA_VERSION_TAG, CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest


def latest_materialization(instance: dg.DagsterInstance, asset: str, partition: str | None = None):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None),
        limit=1).records
    return records[0].asset_materialization


def data_version(instance: dg.DagsterInstance, asset: str, partition: str | None = None) -> str:
    return latest_materialization(instance, asset, partition).tags[DATA_VERSION_TAG]


def metadata(instance: dg.DagsterInstance, asset: str, partition: str | None = None) -> dict:
    return {k: v.value for k, v in latest_materialization(instance, asset, partition).metadata.items()}


def stale_statuses(defs: dg.Definitions, instance: dg.DagsterInstance, assets: list[str],
                   partitions: list[str]) -> dict[tuple[str, str], StaleStatus]:
    """(asset, partition) -> its stale status, as the UI computes it."""
    resolver = CachingStaleStatusResolver(instance, defs.resolve_asset_graph(), LoadingContextForTest(instance))
    return {(a, p): resolver.get_status(dg.AssetKey(a), p) for a in assets for p in partitions}
