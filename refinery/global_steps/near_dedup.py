"""Near dedup: LSH banding over MinHash signatures, verified candidate edges, union-find clusters.

Banding. The signature's first `bands * rows` values are cut into `bands` bands of `rows` values; each
band is hashed to 64 bits. Two documents are candidates in a band when their band hashes are equal.
`bands x rows` defaults to datasketch's `MinHashLSH` optimiser at the configured threshold with the
false-negative area weighted 0.95 and the false-positive area 0.05: for 0.8 and 128 permutations
that is 16 x 8, which makes a pair at Jaccard 0.8 a candidate with probability 0.947 and one at 0.85
with 0.994. The even weighting (9 x 13) finds only 40% of the pairs at 0.8.

Verification. Each candidate pair is kept only when the Jaccard similarity of the two documents'
shingle-hash sets is at least the threshold. Every document stores a bottom-k sketch (its
VERIFY_BOTTOM_K = 1024 smallest distinct 32-bit shingle hashes), so for documents of up to 1024
shingles the check is the exact Jaccard of their shingle sets (up to 32-bit hash collisions), and for
longer ones a bottom-1024 estimate with standard error sqrt(J (1 - J) / 1024), 0.0125 at 0.8. The
signature estimate (standard error 0.035 at 128 permutations) is not precise enough for this: in a
corpus dense around the threshold, verifying with it at 0.8 gave 0.94 recall and 0.90 precision.

Candidates inside one band bucket are checked leader by leader: the member with the smallest
doc_key leads, members similar to it get an edge to it, the rest form the next round's bucket under
their own smallest member. A bucket of k copies costs k comparisons, not k^2, and a false bucket
still links its true duplicates to each other.

Bounded state. A band's step holds every near-dedup document's (doc_key, band hash) at once unless
it is split: with `splits` = K, it takes the documents whose band hash falls in each 1/K of the hash
space in turn (`exact_dedup.hash_range_expr`). Equal band hashes share a split, so every bucket is whole in exactly one
split, and the edges, sorted at the end, are the same bytes whatever K is. K comes from
`near_dedup.band_splits`, or from `near_dedup.max_memory_mb` and the document count (`band_splits`).
The candidates' sketches are read shard by shard (`read_sketches`), so no read spans the corpus.

Clusters. Union-find over the edges of every band; each connected component keeps its member with
the smallest doc_key (the same order as exact dedup: first source, first file, first record).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from refinery.global_steps import exact_dedup as ex
from refinery.stages.base import StageOutput, stage_output, without_drops
from refinery.stages.stats import Drop, StageStats
from refinery.global_steps.minhash import EMPTY_HASH, MinHasher, bottom_k_jaccard, lsh_params
from refinery.config import RefineryConfig

# Stats files and reject rows both name the two dedups by these (the asset names).
EXACT_STAGE = "exact_deduped"
NEAR_STAGE = "near_deduped"
# The entry of a source's `skip:` list that keeps its documents out of near dedup.
NEAR_SKIP_KEY = "near_dedup"

FALSE_POSITIVE_WEIGHT = 0.05
FALSE_NEGATIVE_WEIGHT = 0.95
VERIFY_BOTTOM_K = 1024
# Working set of a band split per document it holds: doc_key and band hash (16 B) as read, the lexsort
# order, run ids and the sorted copies `bucket_members` makes (about 48 B), and Polars' read buffers.
# bench/dedup_memory.py measures about 60-70 B; 96 leaves room for buckets' sketches.
BAND_BYTES_PER_DOC = 96

EDGES_SCHEMA = {"src": pl.UInt64, "dst": pl.UInt64, "similarity": pl.Float32}
CLUSTERS_SCHEMA = {"doc_key": pl.UInt64, "keeper_key": pl.UInt64, "cluster_size": pl.Int64}


def banding(threshold: float, num_perm: int, bands: int | None = None, rows: int | None = None) -> tuple[int, int]:
    """The configured (bands, rows), or the recall-weighted optimum for `threshold`."""
    if bands is not None and rows is not None:
        return bands, rows
    return lsh_params(threshold, num_perm, FALSE_POSITIVE_WEIGHT, FALSE_NEGATIVE_WEIGHT)


def band_keys(bands: int) -> list[str]:
    width = max(2, len(str(bands - 1)))
    return [f"b{i:0{width}d}" for i in range(bands)]


def band_column(band: int) -> str:
    return f"band_{band:03d}"


def band_hashes(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """uint64[n, bands]: each band's `rows` signature values folded with a multiplier and mixed."""
    n = signatures.shape[0]
    cut = signatures[:, : bands * rows].astype(np.uint64).reshape(n, bands, rows)
    acc = np.full((n, bands), 0x9E3779B97F4A7C15, dtype=np.uint64)
    for r in range(rows):
        acc *= np.uint64(0xC2B2AE3D27D4EB4F)
        acc ^= cut[:, :, r]
    acc ^= acc >> np.uint64(33)
    acc *= np.uint64(0xFF51AFD7ED558CCD)
    acc ^= acc >> np.uint64(33)
    return acc


def band_splits(near_docs: int, max_memory_mb: int | None, fixed: int | None = None) -> int:
    """How many hash-prefix splits a band's step takes: `fixed` when given, else as many as keep
    `near_docs * BAND_BYTES_PER_DOC / splits` under `max_memory_mb`, else 1."""
    if fixed is not None:
        return fixed
    if max_memory_mb is None:
        return 1
    return max(1, -(-near_docs * BAND_BYTES_PER_DOC // (max_memory_mb * 2**20)))


def band_edges(
    signatures: pl.LazyFrame,
    shard_signatures: Sequence[pl.LazyFrame],
    dropped: pl.LazyFrame | None,
    band: int,
    settings: "DedupSettings",
    splits: int,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """Verified candidate edges of one band among the near-dedup rows of `signatures` whose doc_key
    is not in `dropped`, taken one hash-prefix split at a time; edges sorted by (src, dst), and the
    counts docs, candidates, edges, splits and the documents held by the largest split.
    `shard_signatures[o]` holds the rows of shard ordinal o (the same rows as `signatures`): the
    candidates' sketches are read from it (`read_sketches`)."""
    if splits < 1:
        raise ValueError(f"band splits must be at least 1, got {splits}")
    column = band_column(band)
    counts = {"docs": 0, "candidates": 0, "edges": 0, "splits": splits, "largest_split_docs": 0}
    parts = [pl.DataFrame(schema=EDGES_SCHEMA)]
    for part in range(splits):
        docs = signatures.filter(pl.col("near") & (ex.hash_range_expr(pl.col(column), splits) == part)).select("doc_key", column)
        if dropped is not None:
            docs = docs.join(dropped, on="doc_key", how="anti")
        docs = docs.collect(engine="streaming")
        members, buckets = bucket_members(docs["doc_key"].to_numpy(), docs[column].to_numpy())
        counts["docs"] += docs.height
        counts["largest_split_docs"] = max(counts["largest_split_docs"], docs.height)
        counts["candidates"] += int(members.size)
        del docs
        if not members.size:
            continue
        keys, sketches = read_sketches(shard_signatures, members)
        rows = np.searchsorted(keys, members)
        parts.append(verified_edges(members, buckets, [sketches[r] for r in rows], settings.threshold, settings.bottom_k))
    edges = pl.concat(parts).sort("src", "dst")
    counts["edges"] = edges.height
    return edges, counts


def read_sketches(shard_signatures: Sequence[pl.LazyFrame], keys: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The distinct `keys`, sorted, and the bottom sketch of each, read one shard at a time from the
    shards that hold them, and copied out: a filtered Polars frame can keep the shard's whole decoded
    `bottom` column alive, and one scan over every file buffers every file's. Either way the state
    would grow with the corpus (bench/RESULTS.md, "Bounded dedup state at 1M and 10M documents")."""
    keys = np.unique(keys)
    ordinals = keys >> np.uint64(ex.ROW_BITS)
    found_keys, sketches = [], []
    for ordinal in np.unique(ordinals).tolist():
        if ordinal >= len(shard_signatures):
            raise KeyError(f"doc_key of shard ordinal {ordinal}, but only {len(shard_signatures)} shards")
        wanted = pl.Series(keys[ordinals == ordinal]).implode()
        frame = shard_signatures[ordinal].select("doc_key", "bottom").filter(pl.col("doc_key").is_in(wanted)).collect()
        found_keys.append(np.array(frame["doc_key"].to_numpy(), dtype=np.uint64))
        sketches.extend(np.array(s.to_numpy(), dtype=np.uint32) for s in frame["bottom"])
        del frame
    order = np.argsort(np.concatenate(found_keys), kind="stable") if found_keys else np.zeros(0, np.int64)
    if order.size != keys.size:
        raise KeyError(f"{keys.size - order.size} candidate doc_key(s) have no row in their shard's signatures")
    return keys, [sketches[i] for i in order.tolist()]


def bucket_members(keys: np.ndarray, band: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Documents that share their band hash with another: (doc_key, bucket id), sorted by bucket
    then doc_key. Bucket ids are dense and ordered by the bucket's smallest doc_key."""
    if keys.size == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    order = np.lexsort((keys, band))
    b, k = band[order], keys[order]
    new = np.concatenate(([True], b[1:] != b[:-1]))
    run = np.cumsum(new) - 1
    sizes = np.bincount(run)
    shared = sizes[run] > 1
    k, run = k[shared], run[shared]
    if k.size == 0:
        return k, np.zeros(0, np.int64)
    # Renumber buckets by their first (smallest) key so the output order does not depend on hash values.
    firsts = np.flatnonzero(np.concatenate(([True], run[1:] != run[:-1])))
    rank = np.empty(firsts.size, dtype=np.int64)
    rank[np.argsort(k[firsts], kind="stable")] = np.arange(firsts.size)
    bucket = rank[np.cumsum(np.concatenate(([True], run[1:] != run[:-1]))) - 1]
    order = np.lexsort((k, bucket))
    return k[order], bucket[order]


def verified_edges(
    keys: np.ndarray, buckets: np.ndarray, sketches: list[np.ndarray], threshold: float, bottom_k: int
) -> pl.DataFrame:
    """Leader-by-leader verification inside each bucket (see the module docstring).

    `keys`/`buckets` as from `bucket_members` (sorted by bucket, then key); `sketches[i]` is the
    bottom-k sketch of `keys[i]`. Returns edges (src = leader, dst, similarity), sorted by (src, dst)."""
    src, dst, sim = [], [], []
    idx = np.arange(keys.size)
    bkt = buckets.copy()
    while idx.size > 1:
        first = np.concatenate(([True], bkt[1:] != bkt[:-1]))
        leader_pos = np.flatnonzero(first)
        leader_of = np.repeat(idx[leader_pos], np.diff(np.append(leader_pos, idx.size)))
        follower = ~first
        f_idx, f_lead = idx[follower], leader_of[follower]
        s = np.array(
            [bottom_k_jaccard(sketches[a], sketches[b], bottom_k) for a, b in zip(f_lead.tolist(), f_idx.tolist())],
            dtype=np.float64,
        )
        ok = s >= threshold
        src.append(keys[f_lead[ok]])
        dst.append(keys[f_idx[ok]])
        sim.append(s[ok].astype(np.float32))
        # Unmatched followers stay in their bucket and elect a new leader next round.
        idx, bkt = f_idx[~ok], bkt[follower][~ok]
        if bkt.size:
            keep = np.bincount(bkt)[bkt] > 1
            idx, bkt = idx[keep], bkt[keep]
    if not src:
        return pl.DataFrame(schema=EDGES_SCHEMA)
    return pl.DataFrame(
        {"src": np.concatenate(src), "dst": np.concatenate(dst), "similarity": np.concatenate(sim)},
        schema=EDGES_SCHEMA,
    ).sort("src", "dst")


def clusters(src: np.ndarray, dst: np.ndarray) -> pl.DataFrame:
    """Union-find over undirected edges. One row per document that has an edge: its cluster's
    keeper (the smallest doc_key in the component) and the component size; sorted by doc_key."""
    if src.size == 0:
        return pl.DataFrame(schema=CLUSTERS_SCHEMA)
    nodes, inverse = np.unique(np.concatenate((src, dst)), return_inverse=True)
    parent = list(range(nodes.size))

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    half = src.size
    for a, b in zip(inverse[:half].tolist(), inverse[half:].tolist()):
        ra, rb = find(a), find(b)
        if ra != rb:
            # `nodes` is sorted, so the smaller index is the smaller doc_key: roots are keepers.
            if ra < rb:
                parent[rb] = ra
            else:
                parent[ra] = rb
    roots = np.array([find(i) for i in range(nodes.size)], dtype=np.int64)
    sizes = np.bincount(roots)
    return pl.DataFrame(
        {"doc_key": nodes, "keeper_key": nodes[roots], "cluster_size": sizes[roots].astype(np.int64)},
        schema=CLUSTERS_SCHEMA,
    )


# ---- the per-shard ends of the graph: signatures in, decisions applied ------------------------------


@dataclass(frozen=True)
class DedupSettings:
    """Everything that shapes dedup outputs, resolved from the config."""

    num_perm: int
    shingle_size: int
    seed: int
    threshold: float
    bands: int
    rows: int
    hash_ranges: int

    @classmethod
    def from_config(cls, cfg: RefineryConfig) -> "DedupSettings":
        near = cfg.stages.near_dedup
        bands, rows = banding(near.threshold, near.num_perm, near.bands, near.rows)
        return cls(near.num_perm, near.shingle_size, near.seed, near.threshold, bands, rows,
                       cfg.stages.exact_dedup.hash_ranges)

    bottom_k: int = VERIFY_BOTTOM_K

    def hasher(self) -> MinHasher:
        return MinHasher(self.num_perm, self.seed, self.shingle_size)

    def summary(self) -> dict[str, Any]:
        return {
            "hash": "blake2b-128 of lowercased, whitespace-collapsed text",
            "hash_ranges": self.hash_ranges,
            "num_perm": self.num_perm,
            "shingle_size": self.shingle_size,
            "seed": self.seed,
            "scheme": MinHasher.scheme,
            "threshold": self.threshold,
            "bands": self.bands,
            "rows": self.rows,
            "verify": f"Jaccard of shingle-hash sets >= threshold (bottom-{self.bottom_k} sketch)",
        }


def signature_table(docs: pl.DataFrame, shard_ordinal: int, settings: DedupSettings, near_enabled: bool,
                    first_row: int = 0) -> pl.DataFrame:
    """One row per document with text: doc_key, doc_id, the exact hash, whether it takes part in
    near dedup (its source does not skip it and it has at least one word), the band hashes of its
    MinHash signature (the signature itself is read by nothing after them, so it is not kept) and
    its bottom-k sketch (`compute_signatures` stores it apart, to be dropped once read). Documents with null text get no row; `apply_decisions` rejects them.
    `docs` may be a record batch of the shard's table that starts at row `first_row`."""
    if "text" not in docs.columns:
        raise ValueError(f"the document table has no `text` column (columns: {docs.columns})")
    has_text = docs["text"].is_not_null()
    keys = ex.doc_keys(shard_ordinal, docs.height, first_row)[has_text.to_numpy()]
    texts = docs.filter(has_text)["text"].to_list()
    hi, lo = ex.text_hashes(texts)
    sigs, bottoms = settings.hasher().sketch(texts, settings.bottom_k)
    near = ~(sigs == EMPTY_HASH).all(axis=1) & near_enabled
    bands = band_hashes(sigs, settings.bands, settings.rows)
    columns: dict[str, Any] = {
        "doc_key": pl.Series(keys, dtype=pl.UInt64),
        "doc_id": docs.filter(has_text)["doc_id"],
        "hash_hi": pl.Series(hi, dtype=pl.UInt64),
        "hash_lo": pl.Series(lo, dtype=pl.UInt64),
        "near": pl.Series(near, dtype=pl.Boolean),
        # Polars builds an Array column when every sketch has the same length, whatever the dtype says.
        "bottom": pl.Series(bottoms, dtype=pl.List(pl.UInt32)).cast(pl.List(pl.UInt32)),
    }
    for band in range(settings.bands):
        columns[band_column(band)] = pl.Series(bands[:, band], dtype=pl.UInt64)
    return pl.DataFrame(columns)


def apply_decisions(
    docs: pl.DataFrame, shard_ordinal: int, exact_drops: pl.DataFrame, near_clusters: pl.DataFrame,
    first_row: int = 0,
) -> tuple[StageOutput, StageOutput]:
    """Apply the global decisions to one shard, or to a record batch of it that starts at row
    `first_row`: (exact dedup output, near dedup output).

    `exact_drops`: rows of `ex.DROPS_SCHEMA` (any shard; others are ignored). `near_clusters`:
    doc_key, keeper_key, keeper_doc_id, cluster_size for cluster members. Kept documents gain
    `dup_cluster` (the keeper's doc_id, null outside clusters) and `dup_cluster_size` (1 outside)."""
    start = time.perf_counter()
    keyed = docs.with_columns(pl.Series("_key", ex.doc_keys(shard_ordinal, docs.height, first_row), dtype=pl.UInt64))
    exact = keyed.join(exact_drops.rename({"doc_key": "_key"}), on="_key", how="left", maintain_order="left")
    drops: dict[int, Drop] = {}
    for i, (text_null, kept_id, size) in enumerate(
        exact.select(pl.col("text").is_null(), "kept_doc_id", "group_size").iter_rows()
    ):
        if text_null:
            drops[i] = Drop("exact_dedup/null_text", None, "text is null")
        elif size is not None:
            drops[i] = Drop("exact_dedup/duplicate", float(size), f"duplicate of {kept_id}")
    after_exact = without_drops(keyed, drops)
    exact_out = stage_output(EXACT_STAGE, docs, after_exact.drop("_key"), drops, StageStats(stage=EXACT_STAGE))
    exact_out.stats.wall_s = time.perf_counter() - start

    start = time.perf_counter()
    joined = after_exact.join(near_clusters.rename({"doc_key": "_key"}), on="_key", how="left", maintain_order="left")
    near_drops: dict[int, Drop] = {}
    for i, (key, keeper, keeper_id, size) in enumerate(
        joined.select("_key", "keeper_key", "keeper_doc_id", "cluster_size").iter_rows()
    ):
        if keeper is not None and keeper != key:
            near_drops[i] = Drop(
                "near_dedup/duplicate", float(size), f"duplicate of {keeper_id}; cluster {keeper_id} of {size} documents"
            )
    kept = without_drops(joined, near_drops).with_columns(
        pl.col("keeper_doc_id").alias("dup_cluster"),
        pl.col("cluster_size").fill_null(1).cast(pl.Int64).alias("dup_cluster_size"),
    ).drop("_key", "keeper_key", "keeper_doc_id", "cluster_size")
    near_out = stage_output(NEAR_STAGE, joined, kept, near_drops, StageStats(stage=NEAR_STAGE))
    near_out.stats.wall_s = time.perf_counter() - start
    return exact_out, near_out


def cluster_signatures(
    keys: np.ndarray, signatures: np.ndarray, sketches: list[np.ndarray], settings: DedupSettings
) -> pl.DataFrame:
    """Every band, verification and union-find in one process: the whole near-dedup decision for
    a set of signatures small enough to hold at once (tests, benchmarks, one-machine runs). The
    assets run the same steps one band per partition."""
    hashes = band_hashes(signatures, settings.bands, settings.rows)
    position = np.argsort(keys)
    sorted_keys = keys[position]
    src, dst = [], []
    for band in range(settings.bands):
        members, buckets = bucket_members(keys, hashes[:, band])
        rows = position[np.searchsorted(sorted_keys, members)]
        edges = verified_edges(members, buckets, [sketches[r] for r in rows], settings.threshold, settings.bottom_k)
        src.append(edges["src"].to_numpy())
        dst.append(edges["dst"].to_numpy())
    return clusters(np.concatenate(src), np.concatenate(dst))
