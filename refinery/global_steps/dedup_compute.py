"""The dedup graph's steps as plain functions of (config, data root, partition key), free of Dagster,
so benchmarks and tools can run one partition in a bare process. assets/dedup.py wraps each in an
asset; docs/dedup.md describes the files they read and write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import polars as pl

from refinery.global_steps import exact_dedup as ex
from refinery.global_steps import near_dedup as nd
from refinery.stages import registry
from refinery.stages.base import skips
from refinery.config import RefineryConfig
from refinery.documents import input_shards
from refinery.dropped import sketches_refusal
from refinery.layout import (NEAR_CLUSTERS_KEY, exact_drops_key, near_edges_key, signatures_key, sketches_dropped_key,
                             sketches_key, stats_key)
from refinery.stages.attributes import stage_batches
from refinery.stages.parquet_batches import ParquetBatchWriter
from refinery.stages.stage_tables import stage_tables
from refinery.stages.stats import StageStats
from refinery.storage import DataRoot

STAGE = "deduped"
SKETCH = "bottom"  # the column of `nd.signature_table` stored in the sketches file, not the signatures
UPSTREAM = registry.funnel_stage(STAGE).upstream


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


def scan_shard_sketches(cfg: RefineryConfig, root: DataRoot, needed_by: str) -> list[pl.LazyFrame]:
    """One scan of each input shard's bottom-k sketches, in shard-ordinal order; sketches dropped
    once near_dup_clusters ran (refinery/dropped.py) are refused in one line."""
    for shard in input_shards(cfg):
        gone = sketches_refusal(root, shard.key, needed_by)
        if gone:
            raise FileNotFoundError(gone)
    keys = [sketches_key(s.key) for s in input_shards(cfg)]
    _scan_all(root, keys, "dedup_signatures sketch")
    return [pl.scan_parquet(str(root.local_path(k))) for k in keys]


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


@dataclass(frozen=True)
class SignatureCounts:
    """What one file's signature table holds: its rows (documents with text) and, of them, those
    that take part in near dedup."""

    docs: int
    near: int


def upstream_batches(cfg: RefineryConfig, root: DataRoot, shard: str) -> Iterator[tuple[int, pl.DataFrame]]:
    """`UPSTREAM`'s kept documents of one file, a record batch at a time (`extract.batch_rows` rows,
    `extract.batch_bytes` bytes), each with the row of the file it starts at (its doc_keys' rows)."""
    extract, first = cfg.stages.extract, 0
    for batch in stage_batches(root, UPSTREAM, shard, extract.batch_rows, max_bytes=extract.batch_bytes):
        yield first, batch
        first += batch.height


def compute_signatures(cfg: RefineryConfig, root: DataRoot, shard: str) -> tuple[SignatureCounts, dict[str, str]]:
    """Write one file's signature table and, apart, its bottom-k sketches (which near_dup_clusters
    drops once every band has read them), a record batch of its documents at a time (a row group
    each); returns its counts and the two files' sha256 by key."""
    source = next(s for s in input_shards(cfg) if s.key == shard).source
    near_enabled = not skips(cfg.source(source).skip, nd.NEAR_SKIP_KEY)
    ordinal, settings = _shard_ordinal(cfg, shard), nd.DedupSettings.from_config(cfg)
    docs = near = 0
    batches = upstream_batches(cfg, root, shard)
    with root.writer(signatures_key(shard)) as path, ParquetBatchWriter(path) as writer, \
            root.writer(sketches_key(shard)) as sketches_path, ParquetBatchWriter(sketches_path) as sketches:
        for first, batch in batches:
            table = nd.signature_table(batch, ordinal, settings, near_enabled, first)
            writer.write(table.drop(SKETCH))
            sketches.write(table.select("doc_key", SKETCH))
            docs, near = docs + table.height, near + int(table["near"].sum() or 0)
    root.delete(sketches_dropped_key(shard))
    return SignatureCounts(docs, near), {signatures_key(shard): writer.sha256, sketches_key(shard): sketches.sha256}


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
        splits = near.band_splits or 1
        if near.band_splits is None and near.max_memory_mb is not None:
            splits = nd.band_splits(sigs.filter(pl.col("near")).select(pl.len()).collect().item(), near.max_memory_mb)
        dropped = scan_exact_drops(cfg, root).select("doc_key")
        shards = scan_shard_sketches(cfg, root, f"near_deduped[{band_key}]")
        edges, counts = nd.band_edges(sigs, shards, dropped, keys_of_bands.index(band_key), settings, splits)
    return edges, counts, root.write_parquet(near_edges_key(band_key), edges)


def compute_clusters(cfg: RefineryConfig, root: DataRoot) -> tuple[pl.DataFrame, str]:
    """Union-find over every band's edges; one row per cluster member with its keeper's doc_id."""
    settings = nd.DedupSettings.from_config(cfg)
    edge_scan = _scan_all(root, [near_edges_key(b) for b in nd.band_keys(settings.bands)], "near_deduped")
    edges = edge_scan.select("src", "dst").unique().collect() if edge_scan is not None else pl.DataFrame(schema={"src": pl.UInt64, "dst": pl.UInt64})
    table = nd.clusters(edges["src"].to_numpy(), edges["dst"].to_numpy())
    sigs = scan_signatures(cfg, root)
    if table.height and sigs is not None:
        ids = lookup_doc_ids(sigs, table["keeper_key"]).rename({"doc_key": "keeper_key", "doc_id": "keeper_doc_id"})
        table = table.join(ids, on="keeper_key", how="left", maintain_order="left")
    else:
        table = table.with_columns(pl.lit(None, dtype=pl.String).alias("keeper_doc_id"))
    table = table.select("doc_key", "keeper_key", "keeper_doc_id", "cluster_size")
    return table, root.write_parquet(NEAR_CLUSTERS_KEY, table)


def apply_to_shard(cfg: RefineryConfig, root: DataRoot, shard: str) -> tuple[StageStats, StageStats, dict[str, str], pl.DataFrame]:
    """Write `attributes/deduped/<shard>` (the kept doc ids with dup_cluster and dup_cluster_size),
    its rejects, and the exact and near stats files, a record batch of the file at a time (the
    file's drops and cluster rows, a few columns of its duplicates, are held whole). Returns the
    exact and near stats, content hashes by key and the first kept documents."""
    ordinal = _shard_ordinal(cfg, shard)
    on_shard = ex.shard_of(pl.col("doc_key")) == ordinal
    batches = upstream_batches(cfg, root, shard)  # raises before anything is written
    exact_drops = scan_exact_drops(cfg, root).filter(on_shard).collect()
    clusters = pl.scan_parquet(str(root.local_path(NEAR_CLUSTERS_KEY))).filter(on_shard).collect()
    exact_stats = near_stats = None
    with stage_tables(root, STAGE, shard) as tables:
        for first, batch in batches:
            exact_out, near_out = nd.apply_decisions(batch, ordinal, exact_drops, clusters, first)
            # One batch's stats as they are (a sum would drop counters of zero).
            exact_stats = exact_out.stats if exact_stats is None else exact_stats + exact_out.stats
            near_stats = near_out.stats if near_stats is None else near_stats + near_out.stats
            tables.write_rejects(pl.concat([exact_out.rejects, near_out.rejects]))
            tables.write_documents(near_out.documents, batch)
    root.write_json(stats_key(exact_stats.stage, shard), exact_stats.to_dict())
    root.write_json(stats_key(near_stats.stage, shard), near_stats.to_dict())
    return exact_stats, near_stats, tables.hashes(), tables.sample
