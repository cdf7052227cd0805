"""The dedup steps' tasks: a file's signatures, a hash range's exact duplicates, a band's edges,
the clusters, and a file's decisions applied, each taking the run (`refinery.run_context.Run`) as
plain values so a pool or Ray worker runs it with only the library imported (issue 50).
"""

from __future__ import annotations

import time
from typing import Any

import polars as pl

from refinery.documents import InputShard
from refinery.config import RefineryConfig
from refinery.fanout import FileResult
from refinery.global_steps import near_dedup as nd
from refinery.global_steps.dedup_compute import STAGE, apply_to_shard, compute_band_edges, compute_clusters, compute_exact_range, compute_signatures
from refinery.run_context import Run
from refinery.stages.stats import StageStats


def dedup_settings(cfg: RefineryConfig) -> dict[str, Any]:
    return nd.DedupSettings.from_config(cfg).summary()


def signatures_of_file(refinery: Run, shard: InputShard, cache: dict) -> FileResult:
    """A file's signatures, written to the data root; `near_dedup_docs` counts the documents of
    sources that near dedup applies to."""
    start = time.perf_counter()
    counts, hashes = compute_signatures(refinery.config, refinery.root, shard.key)
    stats = StageStats(stage="dedup_signatures", docs_in=counts.docs, docs_out=counts.docs,
                       wall_s=time.perf_counter() - start)
    stats.counters["near_dedup_docs"] = counts.near
    return FileResult(shard.key, shard.source, stats, hashes, dedup_settings(refinery.config))


def combined_stats(exact: StageStats, near: StageStats) -> StageStats:
    """Both dedups as one stage, for the `deduped` asset's metadata."""
    return StageStats(
        stage=STAGE,
        docs_in=exact.docs_in,
        docs_out=near.docs_out,
        bytes_in=exact.bytes_in,
        bytes_out=near.bytes_out,
        wall_s=exact.wall_s + near.wall_s,
        dropped=exact.dropped + near.dropped,
    )


def dedup_file(refinery: Run, shard: InputShard, cache: dict) -> FileResult:
    """A file's dedup decisions applied: exact and near stats as one, hashes and a few sample rows."""
    exact, near, hashes, sample = apply_to_shard(refinery.config, refinery.root, shard.key)
    return FileResult(shard.key, shard.source, combined_stats(exact, near), hashes, dedup_settings(refinery.config), sample)


def exact_range_task(refinery: Run, hash_range: str, cache: dict) -> tuple[dict[str, int], str]:
    """One hash range's exact duplicates found and written: its counts and the drops table's hash."""
    drops, docs, digest = compute_exact_range(refinery.config, refinery.root, hash_range)
    return {"docs_in_range": docs, "duplicates_dropped": drops.height,
            "duplicate_groups": drops["kept_key"].n_unique()}, digest


def band_task(refinery: Run, band: str, cache: dict) -> tuple[dict[str, int], str]:
    """One LSH band's verified candidate edges written: its counts and the edges table's hash."""
    _, band_counts, digest = compute_band_edges(refinery.config, refinery.root, band)
    return dict(band_counts), digest


def clusters_task(refinery: Run, _: None, cache: dict) -> tuple[dict[str, Any], str]:
    """Union-find over every band's edges, the cluster table written: its summary and hash."""
    table, digest = compute_clusters(refinery.config, refinery.root)
    keepers = table.filter(pl.col("doc_key") == pl.col("keeper_key"))
    sizes = keepers.group_by("cluster_size").len().sort("cluster_size")
    return {"clusters": keepers.height, "members": table.height, "to_remove": table.height - keepers.height,
            "largest_cluster": int(table["cluster_size"].max() or 0),
            "cluster_sizes": {str(s): n for s, n in sizes.iter_rows()}}, digest
