"""Exact dedup over normalized text, by hash range, with a deterministic survivor.

Every document gets a `doc_key`: its input shard's position in the config's shard order (sources in
the order they are declared, files sorted by path) in the top 24 bits and its row in that shard's
`heuristic_filtered` table in the low 40 bits. Ordering by `doc_key` is ordering by (source order,
file path, record order), so **the survivor of a duplicate group is the document that comes first in
that order**: list a curated source before the web crawl and its copy is the one kept. Re-running
never changes the survivor unless an earlier copy arrives.

The normalized text (lowercased, whitespace runs collapsed to one space, trimmed) is hashed with
BLAKE2b to 128 bits, stored as two uint64 columns. 128 rather than 64 bits because a false collision
silently drops a unique document: at 10^9 documents a 64-bit hash collides somewhere with
probability about 3%, a 128-bit one with about 10^-21. The top 32 bits of the hash pick the hash
range, so ranges are contiguous slices of the hash space and each holds about 1/R of the documents.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

ROW_BITS = 40
MAX_ROWS = 1 << ROW_BITS
MAX_SHARDS = 1 << (64 - ROW_BITS)

KEY_SCHEMA = {"doc_key": pl.UInt64, "hash_hi": pl.UInt64, "hash_lo": pl.UInt64}
DROPS_SCHEMA = {
    "doc_key": pl.UInt64,
    "kept_key": pl.UInt64,
    "kept_doc_id": pl.String,
    "group_size": pl.Int64,
}


def doc_keys(shard_ordinal: int, rows: int, first: int = 0) -> np.ndarray:
    """The `doc_key` of each row of a shard's table (see the module docstring), for the `rows` rows
    from row `first` on (a record batch of the table)."""
    if not 0 <= shard_ordinal < MAX_SHARDS:
        raise ValueError(f"shard ordinal {shard_ordinal} does not fit the doc_key's {64 - ROW_BITS} bits")
    if first + rows > MAX_ROWS:
        raise ValueError(f"{first + rows} rows in one shard exceed the doc_key's {ROW_BITS}-bit row field; split the input file")
    return (np.uint64(shard_ordinal) << np.uint64(ROW_BITS)) | np.arange(first, first + rows, dtype=np.uint64)


def shard_of(keys: pl.Expr) -> pl.Expr:
    return (keys // MAX_ROWS).cast(pl.Int64)


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def text_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) uint64 halves of BLAKE2b-128 of each normalized text."""
    digests = b"".join(hashlib.blake2b(normalize(t).encode("utf-8"), digest_size=16).digest() for t in texts)
    halves = np.frombuffer(digests, dtype=">u8").astype(np.uint64).reshape(-1, 2)
    return halves[:, 0].copy(), halves[:, 1].copy()


def range_keys(ranges: int) -> list[str]:
    width = max(2, len(str(ranges)))
    return [f"r{i:0{width}d}-of-{ranges:0{width}d}" for i in range(ranges)]


def range_index(key: str, ranges: int) -> int:
    keys = range_keys(ranges)
    if key not in keys:
        raise KeyError(f"no hash range {key!r} for {ranges} ranges; known: {keys[:4]}...")
    return keys.index(key)


def hash_range_expr(hash_hi: pl.Expr, ranges: int) -> pl.Expr:
    """Which of `ranges` contiguous slices of the hash space the top 32 bits fall in."""
    return ((hash_hi // (1 << 32)) * ranges) // (1 << 32)


def duplicate_drops(keys: pl.DataFrame) -> pl.DataFrame:
    """Given (doc_key, hash_hi, hash_lo) rows, the documents to drop: every member of a hash group
    except the one with the smallest doc_key, with that survivor's key. Sorted by doc_key.
    `kept_doc_id` is left null for the caller to fill."""
    grouped = keys.with_columns(
        pl.col("doc_key").min().over("hash_hi", "hash_lo").alias("kept_key"),
        pl.len().over("hash_hi", "hash_lo").cast(pl.Int64).alias("group_size"),
    )
    return (
        grouped.filter(pl.col("doc_key") != pl.col("kept_key"))
        .select(
            "doc_key",
            "kept_key",
            pl.lit(None, dtype=pl.String).alias("kept_doc_id"),
            "group_size",
        )
        .sort("doc_key")
    )
