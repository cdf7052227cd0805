"""Global exact and near dedup, scaled out by hash range and LSH band.

    heuristic_filtered[batch] -> dedup_signatures[batch]          hash, MinHash, band hashes per doc
    dedup_signatures[*]       -> exact_deduped[hash range]        drop list of the range
    dedup_signatures[*], exact_deduped[*] -> near_deduped[band]   verified candidate edges of the band
    near_deduped[*]           -> near_dup_clusters                union-find over the edges
    heuristic_filtered[batch], exact_deduped[*], near_dup_clusters -> deduped[batch]

No step holds every document: the range and band steps read only small per-document columns
(doc_key and a hash) of every shard, the cluster step reads only edges, and the shard steps read
their own shard. Files live under `dedup/` in the data root (see docs/dedup.md).
"""


import hashlib
import sys
import time
from collections import Counter
from typing import Any, NamedTuple

import dagster as dg
import polars as pl

from assets.factory import SAMPLE_ROWS, code_version, eager_after, map_files, provenance_metadata
from refinery.stages import dedup_compute as dc
from refinery.stages import exact_dedup as ex
from refinery.stages import near_dedup as nd
from refinery.stages import minhash as mh
from refinery.stages.base import StageStats
from refinery.stages.dedup_compute import (  # noqa: F401  (the steps, also used from here by benches and tests)
    CLUSTERS_KEY,
    STAGE,
    UPSTREAM,
    apply_to_shard,
    compute_band_edges,
    compute_clusters,
    compute_exact_range,
    compute_signatures,
    edges_key,
    exact_drops_key,
    signatures_key,
)
from orchestration.resources import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, batch_shards

def _dedup_code_version() -> str:
    """Changes when any module that shapes dedup outputs does."""
    parts = "".join(code_version(m) for m in (ex, nd, mh, dc, sys.modules[__name__]))
    return hashlib.sha256(parts.encode()).hexdigest()[:12]


class FileSignatures(NamedTuple):
    file: str
    docs: int
    near_docs: int  # documents of sources that near dedup applies to
    digest: str


def signatures_of_file(refinery: RefineryResource, shard: InputShard, cache: dict) -> FileSignatures:
    """A file's signatures, written to the data root."""
    table, digest = compute_signatures(refinery.config, refinery.root, shard.key)
    return FileSignatures(shard.key, table.height, int(table["near"].sum() or 0), digest)


def dedup_file(refinery: RefineryResource, shard: InputShard, cache: dict) -> tuple[StageStats, StageStats, dict[str, str], pl.DataFrame]:
    """A file's dedup decisions applied; its exact and near stats, hashes and a few sample rows."""
    exact_out, near_out, hashes = apply_to_shard(refinery.config, refinery.root, shard.key)
    return exact_out.stats, near_out.stats, hashes, near_out.documents.head(SAMPLE_ROWS)


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


# ---- Dagster ---------------------------------------------------------------------------------------


def _global_metadata(counts: dict[str, Any], settings: nd.DedupSettings, version: str, hashes: dict[str, str], wall_s: float) -> dict[str, Any]:
    md: dict[str, Any] = {k: dg.MetadataValue.int(int(v)) for k, v in counts.items()}
    md.update(
        wall_s=dg.MetadataValue.float(round(wall_s, 4)),
        config=dg.MetadataValue.json(settings.summary()),
        code_version=dg.MetadataValue.text(version),
        content_hashes=dg.MetadataValue.json(hashes),
    )
    return md


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    version = _dedup_code_version()
    settings = nd.DedupSettings.from_config(cfg)
    ranges = dg.StaticPartitionsDefinition(ex.range_keys(settings.hash_ranges))
    bands = dg.StaticPartitionsDefinition(nd.band_keys(settings.bands))
    every = dg.AllPartitionMapping()

    @dg.asset(
        name="dedup_signatures",
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep(UPSTREAM)],
        partitions_def=parts.input_batches,
        backfill_policy=parts.batch_backfill,
        group_name="funnel",
        code_version=version,
        kinds={"numpy", "parquet"},
        description="Per document: 128-bit normalized-text hash, MinHash signature and LSH band hashes.",
    )
    def dedup_signatures(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        start = time.perf_counter()
        files = map_files(refinery, batch_shards(refinery.config, context.partition_keys), signatures_of_file)
        wall = time.perf_counter() - start
        docs = sum(f.docs for f in files)
        counts = {"docs": docs, "near_dedup_docs": sum(f.near_docs for f in files), "input_files": len(files)}
        md = _global_metadata(counts, settings, version, {signatures_key(f.file): f.digest for f in files}, wall)
        md["docs_per_s"] = dg.MetadataValue.float(round(docs / wall, 1) if wall > 0 else 0.0)
        return dg.MaterializeResult(metadata=md)

    @dg.asset(
        name="exact_deduped",
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep("dedup_signatures", partition_mapping=every)],
        partitions_def=ranges,
        backfill_policy=parts.split_backfill,
        group_name="funnel",
        code_version=version,
        kinds={"polars", "parquet"},
        description="Exact duplicates of one hash range: every copy but the first in (source, file, record) order.",
    )
    def exact_deduped(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        start, counts, hashes = time.perf_counter(), Counter(), {}
        for hash_range in context.partition_keys:
            drops, docs, digest = compute_exact_range(refinery.config, refinery.root, hash_range)
            counts.update(docs_in_range=docs, duplicates_dropped=drops.height,
                          duplicate_groups=drops["kept_key"].n_unique())
            hashes[exact_drops_key(hash_range)] = digest
        return dg.MaterializeResult(metadata=_global_metadata(
            counts, settings, version, hashes, time.perf_counter() - start))

    @dg.asset(
        name="near_deduped",
        automation_condition=eager_after("exact_deduped"),
        deps=[dg.AssetDep("dedup_signatures", partition_mapping=every),
              dg.AssetDep("exact_deduped", partition_mapping=every)],
        partitions_def=bands,
        backfill_policy=parts.split_backfill,
        group_name="funnel",
        code_version=version,
        kinds={"numpy", "parquet"},
        description="MinHash LSH candidate pairs of one band, verified by signature similarity.",
    )
    def near_deduped(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        start, counts, hashes = time.perf_counter(), Counter(), {}
        for band in context.partition_keys:
            _, band_counts, digest = compute_band_edges(refinery.config, refinery.root, band)
            counts.update(band_counts)
            hashes[edges_key(band)] = digest
        return dg.MaterializeResult(metadata=_global_metadata(
            counts, settings, version, hashes, time.perf_counter() - start))

    @dg.asset(
        name="near_dup_clusters",
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep("near_deduped", partition_mapping=every)],
        group_name="funnel",
        code_version=version,
        kinds={"polars", "parquet"},
        description="Union-find over every band's edges; one keeper (smallest doc_key) per cluster.",
    )
    def near_dup_clusters(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        start = time.perf_counter()
        table, digest = compute_clusters(refinery.config, refinery.root)
        keepers = table.filter(pl.col("doc_key") == pl.col("keeper_key"))
        counts = {"clusters": keepers.height, "members": table.height, "to_remove": table.height - keepers.height,
                  "largest_cluster": int(table["cluster_size"].max() or 0)}
        md = _global_metadata(counts, settings, version, {CLUSTERS_KEY: digest}, time.perf_counter() - start)
        sizes = keepers.group_by("cluster_size").len().sort("cluster_size")
        md["cluster_sizes"] = dg.MetadataValue.json({str(s): n for s, n in sizes.iter_rows()})
        return dg.MaterializeResult(metadata=md)

    @dg.asset(
        name=STAGE,
        automation_condition=eager_after("near_dup_clusters"),
        deps=[dg.AssetDep(UPSTREAM), dg.AssetDep("exact_deduped", partition_mapping=every),
              dg.AssetDep("near_dup_clusters")],
        partitions_def=parts.input_batches,
        backfill_policy=parts.batch_backfill,
        group_name="funnel",
        code_version=version,
        kinds={"polars", "parquet"},
        description="heuristic_filtered minus exact and near duplicates, with dup_cluster and dup_cluster_size.",
    )
    def deduped(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        files = map_files(refinery, batch_shards(refinery.config, context.partition_keys), dedup_file)
        stats = sum((combined_stats(exact, near) for exact, near, _, _ in files), StageStats(stage=STAGE))
        hashes = {k: v for _, _, h, _ in files for k, v in h.items()}
        samples = [sample for *_, sample in files if sample.height]
        sample = pl.concat(samples, how="diagonal_relaxed").head(SAMPLE_ROWS) if samples else None
        context.log.info(f"deduped: {len(files)} file(s), {stats.docs_in} -> {stats.docs_out} docs")
        md = provenance_metadata(stats, settings.summary(), version, hashes, sample)
        md["input_files"] = dg.MetadataValue.int(len(files))
        return dg.MaterializeResult(metadata=md)

    return dg.Definitions(assets=[dedup_signatures, exact_deduped, near_deduped, near_dup_clusters, deduped])
