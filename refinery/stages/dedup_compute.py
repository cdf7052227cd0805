"""The dedup graph's steps as plain functions of (config, data root, partition key), free of Dagster,
so benchmarks and tools can run one partition in a bare process. assets/dedup.py wraps each in an
asset; docs/dedup.md describes the files they read and write.
"""

from __future__ import annotations

import polars as pl

from refinery.stages import exact_dedup as ex
from refinery.stages import near_dedup as nd
from refinery.stages.base import StageOutput, skips
from refinery.config import RefineryConfig
from refinery.documents import input_shards
from refinery.layout import NEAR_CLUSTERS_KEY, exact_drops_key, near_edges_key, rejects_key, signatures_key, stats_key
from refinery.stages.attributes import publish_attributes, read_stage_documents
from refinery.storage import DataRoot

UPSTREAM = "heuristic_filtered"
STAGE = "deduped"


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


def scan_shard_signatures(cfg: RefineryConfig, root: DataRoot) -> list[pl.LazyFrame]:
    """One scan per input shard, in shard-ordinal order (call after `scan_signatures` has checked
    that every file exists)."""
    return [pl.scan_parquet(str(root.local_path(signatures_key(s.key)))) for s in input_shards(cfg)]


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
    docs = read_stage_documents(root, UPSTREAM, shard)
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
        splits = near.band_splits or 1
        if near.band_splits is None and near.max_memory_mb is not None:
            splits = nd.band_splits(sigs.filter(pl.col("near")).select(pl.len()).collect().item(), near.max_memory_mb)
        dropped = scan_exact_drops(cfg, root).select("doc_key")
        shards = scan_shard_signatures(cfg, root)
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


def apply_to_shard(cfg: RefineryConfig, root: DataRoot, shard: str) -> tuple[StageOutput, StageOutput, dict[str, str]]:
    """Write `attributes/deduped/<shard>` (the kept doc ids with dup_cluster and dup_cluster_size),
    its rejects, and the exact and near stats files."""
    ordinal = _shard_ordinal(cfg, shard)
    docs = read_stage_documents(root, UPSTREAM, shard)
    on_shard = ex.shard_of(pl.col("doc_key")) == ordinal
    exact_drops = scan_exact_drops(cfg, root).filter(on_shard).collect()
    clusters = pl.scan_parquet(str(root.local_path(NEAR_CLUSTERS_KEY))).filter(on_shard).collect()
    exact_out, near_out = nd.apply_decisions(docs, ordinal, exact_drops, clusters)
    rejects = pl.concat([exact_out.rejects, near_out.rejects])
    kept_key, kept_hash = publish_attributes(root, STAGE, shard, docs, near_out.documents)
    hashes = {kept_key: kept_hash, rejects_key(STAGE, shard): root.write_parquet(rejects_key(STAGE, shard), rejects)}
    root.write_json(stats_key(exact_out.stats.stage, shard), exact_out.stats.to_dict())
    root.write_json(stats_key(near_out.stats.stage, shard), near_out.stats.to_dict())
    return exact_out, near_out, hashes
