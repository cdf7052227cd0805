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
import numpy as np
import polars as pl

from assets.factory import SAMPLE_ROWS, code_version, map_files, provenance_metadata
from assets.stages import exact_dedup as ex
from assets.stages import near_dedup as nd
from assets.stages import minhash as mh
from assets.stages.base import StageOutput, StageStats, skips
from orchestration.resources import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, batch_shards, documents_key, input_shards, rejects_key, stats_key
from refinery.storage import DataRoot

UPSTREAM = "heuristic_filtered"
STAGE = "deduped"
CLUSTERS_KEY = "dedup/near/clusters.parquet"


def _dedup_code_version() -> str:
    """Changes when any module that shapes dedup outputs does."""
    parts = "".join(code_version(m) for m in (ex, nd, mh, sys.modules[__name__]))
    return hashlib.sha256(parts.encode()).hexdigest()[:12]


def signatures_key(shard: str) -> str:
    return f"dedup/signatures/{shard}.parquet"


def exact_drops_key(hash_range: str) -> str:
    return f"dedup/exact/{hash_range}.parquet"


def edges_key(band: str) -> str:
    return f"dedup/near/edges/{band}.parquet"


def shard_ordinals(cfg: RefineryConfig) -> dict[str, int]:
    return {s.key: i for i, s in enumerate(input_shards(cfg))}


def _shard_ordinal(cfg: RefineryConfig, shard: str) -> int:
    ordinals = shard_ordinals(cfg)
    if shard not in ordinals:
        raise KeyError(f"no input shard {shard!r} in the config; known: {list(ordinals)[:10]}")
    return ordinals[shard]


def _scan_all(root: DataRoot, keys: list[str], what: str) -> pl.LazyFrame | None:
    """One lazy scan over the named files; a missing one is an error naming the asset to run."""
    missing = [k for k in keys if not root.exists(k)]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} {what} file(s) missing, e.g. {root.display(missing[0])}; materialize that asset "
            f"for every partition first"
        )
    return pl.scan_parquet([str(root.local_path(k)) for k in keys]) if keys else None


def scan_signatures(cfg: RefineryConfig, root: DataRoot) -> pl.LazyFrame | None:
    return _scan_all(root, [signatures_key(s.key) for s in input_shards(cfg)], "dedup_signatures")


def scan_exact_drops(cfg: RefineryConfig, root: DataRoot) -> pl.LazyFrame:
    keys = [exact_drops_key(r) for r in ex.range_keys(cfg.stages.exact_dedup.hash_ranges)]
    return _scan_all(root, keys, "exact_deduped")  # type: ignore[return-value]


def lookup_doc_ids(signatures: pl.LazyFrame, keys: pl.Series) -> pl.DataFrame:
    """doc_key -> doc_id for the given keys only, read shard by shard (never every doc_id at once)."""
    return (
        signatures.select("doc_key", "doc_id")
        .filter(pl.col("doc_key").is_in(keys.unique().implode()))
        .collect(engine="streaming")
    )


# ---- the steps, callable without Dagster -----------------------------------------------------------


def compute_signatures(cfg: RefineryConfig, root: DataRoot, shard: str) -> tuple[pl.DataFrame, str]:
    docs = root.read_parquet(documents_key(UPSTREAM, shard))
    source = next(s for s in input_shards(cfg) if s.key == shard).source
    near_enabled = not skips(cfg.source(source).skip, nd.NEAR_SKIP_KEY)
    table = nd.signature_table(docs, _shard_ordinal(cfg, shard), nd.DedupSettings.from_config(cfg), near_enabled)
    return table, root.write_parquet(signatures_key(shard), table)


def compute_exact_range(cfg: RefineryConfig, root: DataRoot, hash_range: str) -> tuple[pl.DataFrame, int, str]:
    """The drop list of one hash range; returns it, the documents in the range, and its hash."""
    ranges = cfg.stages.exact_dedup.hash_ranges
    index = ex.range_index(hash_range, ranges)
    sigs = scan_signatures(cfg, root)
    if sigs is None:
        in_range = pl.DataFrame(schema=ex.KEY_SCHEMA)
    else:
        in_range = (
            sigs.select("doc_key", "hash_hi", "hash_lo")
            .filter(ex.hash_range_expr(pl.col("hash_hi"), ranges) == index)
            .collect(engine="streaming")
        )
    drops = ex.duplicate_drops(in_range)
    if drops.height:
        ids = lookup_doc_ids(sigs, drops["kept_key"]).rename({"doc_key": "kept_key", "doc_id": "_id"})  # type: ignore[arg-type]
        drops = (
            drops.join(ids, on="kept_key", how="left", maintain_order="left")
            .with_columns(pl.col("_id").alias("kept_doc_id"))
            .drop("_id")
        )
    drops = drops.select(pl.col(c).cast(t) for c, t in ex.DROPS_SCHEMA.items())
    return drops, in_range.height, root.write_parquet(exact_drops_key(hash_range), drops)


def compute_band_edges(cfg: RefineryConfig, root: DataRoot, band_key: str) -> tuple[pl.DataFrame, dict[str, int], str]:
    """Verified candidate edges of one LSH band among near-dedup documents that survived exact dedup."""
    settings = nd.DedupSettings.from_config(cfg)
    keys_of_bands = nd.band_keys(settings.bands)
    if band_key not in keys_of_bands:
        raise KeyError(f"no LSH band {band_key!r} for {settings.bands} bands")
    sigs = scan_signatures(cfg, root)
    if sigs is None:
        edges, counts = pl.DataFrame(schema=nd.EDGES_SCHEMA), {"docs": 0, "candidates": 0, "edges": 0, "splits": 1, "largest_split_docs": 0}
    else:
        near = cfg.stages.near_dedup
        near_docs = sigs.filter(pl.col("near")).select(pl.len()).collect().item()
        splits = nd.band_splits(near_docs, near.max_memory_mb, near.band_splits)
        dropped = scan_exact_drops(cfg, root).select("doc_key")
        edges, counts = nd.band_edges(sigs, dropped, keys_of_bands.index(band_key), settings, splits)
    return edges, counts, root.write_parquet(edges_key(band_key), edges)


def compute_clusters(cfg: RefineryConfig, root: DataRoot) -> tuple[pl.DataFrame, str]:
    """Union-find over every band's edges; one row per cluster member with its keeper's doc_id."""
    settings = nd.DedupSettings.from_config(cfg)
    edge_scan = _scan_all(root, [edges_key(b) for b in nd.band_keys(settings.bands)], "near_deduped")
    edges = edge_scan.select("src", "dst").unique().collect() if edge_scan is not None else pl.DataFrame(schema={"src": pl.UInt64, "dst": pl.UInt64})
    table = nd.clusters(edges["src"].to_numpy(), edges["dst"].to_numpy())
    sigs = scan_signatures(cfg, root)
    if table.height and sigs is not None:
        ids = lookup_doc_ids(sigs, table["keeper_key"]).rename({"doc_key": "keeper_key", "doc_id": "keeper_doc_id"})
        table = table.join(ids, on="keeper_key", how="left", maintain_order="left")
    else:
        table = table.with_columns(pl.lit(None, dtype=pl.String).alias("keeper_doc_id"))
    table = table.select("doc_key", "keeper_key", "keeper_doc_id", "cluster_size")
    return table, root.write_parquet(CLUSTERS_KEY, table)


def apply_to_shard(cfg: RefineryConfig, root: DataRoot, shard: str) -> tuple[StageOutput, StageOutput, dict[str, str]]:
    """Write `documents/deduped/<shard>`, its rejects, and the exact and near stats files."""
    ordinal = _shard_ordinal(cfg, shard)
    docs = root.read_parquet(documents_key(UPSTREAM, shard))
    on_shard = ex.shard_of(pl.col("doc_key")) == ordinal
    exact_drops = scan_exact_drops(cfg, root).filter(on_shard).collect()
    clusters = pl.scan_parquet(str(root.local_path(CLUSTERS_KEY))).filter(on_shard).collect()
    exact_out, near_out = nd.apply_decisions(docs, ordinal, exact_drops, clusters)
    rejects = pl.concat([exact_out.rejects, near_out.rejects])
    hashes = {
        documents_key(STAGE, shard): root.write_parquet(documents_key(STAGE, shard), near_out.documents),
        rejects_key(STAGE, shard): root.write_parquet(rejects_key(STAGE, shard), rejects),
    }
    root.write_json(stats_key(exact_out.stats.stage, shard), exact_out.stats.to_dict())
    root.write_json(stats_key(near_out.stats.stage, shard), near_out.stats.to_dict())
    return exact_out, near_out, hashes


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
