"""Exact dedup: normalization, the 128-bit hash, hash ranges, and the deterministic survivor."""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pytest

from refinery.global_steps import exact_dedup as ex


def test_normalized_hash_ignores_case_and_whitespace_only():
    hi, lo = ex.text_hashes(["Hello   World\n", "hello world", "hello, world", ""])
    assert (hi[0], lo[0]) == (hi[1], lo[1])
    assert (hi[0], lo[0]) != (hi[2], lo[2])
    digest = hashlib.blake2b(b"hello world", digest_size=16).digest()
    assert int(hi[1]) == int.from_bytes(digest[:8], "big")
    assert int(lo[1]) == int.from_bytes(digest[8:], "big")
    empty = hashlib.blake2b(b"", digest_size=16).digest()
    assert int(hi[3]) == int.from_bytes(empty[:8], "big")


def test_doc_keys_order_by_shard_then_row_and_reject_overflow():
    a, b = ex.doc_keys(0, 3), ex.doc_keys(1, 2)
    assert a.tolist() == [0, 1, 2]
    assert b.tolist() == [1 << ex.ROW_BITS, (1 << ex.ROW_BITS) + 1]
    assert a.max() < b.min()
    keys = pl.Series(np.concatenate([a, b]), dtype=pl.UInt64)
    assert pl.select(ex.shard_of(pl.lit(keys))).to_series().to_list() == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="split the input file"):
        ex.doc_keys(0, ex.MAX_ROWS + 1)
    with pytest.raises(ValueError, match="does not fit"):
        ex.doc_keys(ex.MAX_SHARDS, 1)


@pytest.mark.parametrize("ranges", [1, 3, 4, 16])
def test_hash_ranges_partition_the_hash_space_evenly(ranges):
    rng = np.random.default_rng(0)
    hi = rng.integers(0, 2**64, size=40_000, dtype=np.uint64)
    hi[:2] = [0, 2**64 - 1]
    idx = pl.select(ex.hash_range_expr(pl.lit(pl.Series(hi, dtype=pl.UInt64)), ranges)).to_series().to_numpy()
    assert idx[0] == 0 and idx[1] == ranges - 1
    assert idx.min() >= 0 and idx.max() == ranges - 1
    counts = np.bincount(idx, minlength=ranges)
    assert counts.sum() == hi.size
    assert np.all(np.abs(counts - hi.size / ranges) < 0.05 * hi.size / ranges + 50)
    # Contiguous: sorting by hash sorts by range.
    order = np.argsort(hi)
    assert np.all(np.diff(idx[order]) >= 0)


def test_range_keys():
    assert ex.range_keys(4) == ["r00-of-04", "r01-of-04", "r02-of-04", "r03-of-04"]
    assert ex.range_keys(128)[-1] == "r127-of-128"
    assert ex.range_index("r02-of-04", 4) == 2
    with pytest.raises(KeyError, match="no hash range"):
        ex.range_index("r05-of-04", 4)


def test_survivor_is_the_smallest_doc_key_whatever_the_input_order():
    keys = pl.DataFrame(
        {"doc_key": [9, 4, 7, 1, 5, 3], "hash_hi": [1, 1, 2, 2, 2, 3], "hash_lo": [10, 10, 20, 20, 20, 30]},
        schema=ex.KEY_SCHEMA,
    )
    expected = [(7, 1, 3), (5, 1, 3), (9, 4, 2)]
    for _ in range(3):
        drops = ex.duplicate_drops(keys)
        assert drops.columns == list(ex.DROPS_SCHEMA)
        assert sorted(drops.select("doc_key", "kept_key", "group_size").iter_rows(), key=lambda r: r[0]) == sorted(expected)
        assert drops["doc_key"].to_list() == sorted(drops["doc_key"].to_list())
        keys = keys.sample(fraction=1.0, shuffle=True, seed=1)


def test_same_high_half_different_low_half_is_not_a_duplicate():
    keys = pl.DataFrame({"doc_key": [1, 2], "hash_hi": [7, 7], "hash_lo": [1, 2]}, schema=ex.KEY_SCHEMA)
    assert ex.duplicate_drops(keys).height == 0
    assert ex.duplicate_drops(pl.DataFrame(schema=ex.KEY_SCHEMA)).height == 0
