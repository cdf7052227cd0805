"""Near dedup: banding, verification, union-find, and recall/precision against exact Jaccard."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest

from refinery.global_steps import exact_dedup as ex
from refinery.global_steps import minhash as mh
from refinery.global_steps import near_dedup as nd
from helpers.documents import provenance_frame

SETTINGS = nd.DedupSettings(num_perm=128, shingle_size=5, seed=1, threshold=0.8, bands=16, rows=8, hash_ranges=4)


def shingle_set(text: str) -> set:
    return set(mh.shingles(mh.shingle_words(text), 5))


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def variants_corpus(seed: int, bases: int = 150, words: int = 200) -> tuple[list[str], list[int]]:
    """Base documents and 0-3 edited copies of each (1-8 words replaced), so pair similarities
    spread across 0.6-0.97, densest around the 0.8 threshold. Returns texts and each one's base."""
    rng = random.Random(seed)
    vocab = [f"v{i}" for i in range(30_000)]
    texts, family = [], []
    for b in range(bases):
        base = [rng.choice(vocab) for _ in range(words)]
        texts.append(" ".join(base))
        family.append(b)
        for _ in range(rng.randint(0, 3)):
            edited = list(base)
            for _ in range(rng.randint(1, 8)):
                edited[rng.randrange(words)] = rng.choice(vocab)
            texts.append(" ".join(edited))
            family.append(b)
    return texts, family


def test_default_banding_is_recall_weighted_and_configured_banding_wins():
    assert nd.banding(0.8, 128) == (16, 8)
    assert nd.banding(0.8, 128, 20, 5) == (20, 5)
    assert nd.band_keys(16) == [f"b{i:02d}" for i in range(16)]


def test_band_hashes_differ_only_in_the_band_that_differs():
    sig = np.arange(2 * 32, dtype=np.uint32).reshape(2, 32)
    sig[1] = sig[0]
    sig[1, 9] += 1  # inside band 2 of 4 x 4 (values 8..11)
    bands = nd.band_hashes(sig, 4, 4)
    assert bands.dtype == np.uint64
    assert (bands[0] == bands[1]).tolist() == [True, True, False, True]
    assert nd.band_hashes(sig[:1, :16], 4, 4).tolist() == bands[:1].tolist()


def test_bucket_members_keep_only_shared_buckets_ordered_by_smallest_key():
    keys = np.array([50, 10, 40, 30, 20], dtype=np.uint64)
    band = np.array([7, 9, 7, 5, 9], dtype=np.uint64)
    members, buckets = nd.bucket_members(keys, band)
    assert members.tolist() == [10, 20, 40, 50]
    assert buckets.tolist() == [0, 0, 1, 1]
    none = nd.bucket_members(keys, np.arange(5, dtype=np.uint64))
    assert none[0].size == 0 and none[1].size == 0


def test_a_false_leader_does_not_hide_true_duplicates():
    unrelated = np.array([1, 2, 3, 4, 5], dtype=np.uint32)
    doc = np.arange(100, 200, dtype=np.uint32)
    near = np.concatenate([doc[:95], np.arange(900, 905, dtype=np.uint32)])
    keys = np.array([1, 2, 3], dtype=np.uint64)
    edges = nd.verified_edges(keys, np.zeros(3, np.int64), [unrelated, doc, np.sort(near)], 0.8, 1024)
    assert edges.rows() == [(2, 3, pytest.approx(95 / 105))]


def test_union_find_clusters_keep_the_smallest_key():
    src = np.array([5, 3, 9, 20], dtype=np.uint64)
    dst = np.array([7, 5, 3, 21], dtype=np.uint64)
    table = nd.clusters(src, dst)
    assert table.rows() == [(3, 3, 4), (5, 3, 4), (7, 3, 4), (9, 3, 4), (20, 20, 2), (21, 20, 2)]
    assert nd.clusters(np.zeros(0, np.uint64), np.zeros(0, np.uint64)).height == 0


def test_bottom_k_jaccard_is_exact_for_small_sets_and_close_for_large():
    rng = np.random.default_rng(0)
    a = np.unique(rng.integers(0, 2**32, 600, dtype=np.uint64)).astype(np.uint32)
    b = np.sort(np.concatenate([a[:500], np.arange(50, dtype=np.uint32)]))
    assert mh.bottom_k_jaccard(a, b, 1024) == pytest.approx(jaccard(set(a.tolist()), set(b.tolist())))
    big_a = np.unique(rng.integers(0, 2**32, 20_000, dtype=np.uint64)).astype(np.uint32)
    shared = big_a[rng.random(big_a.size) < 0.85]
    big_b = np.unique(np.concatenate([shared, rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)]))
    truth = jaccard(set(big_a.tolist()), set(big_b.tolist()))
    assert abs(mh.bottom_k_jaccard(big_a[:1024], big_b[:1024], 1024) - truth) < 0.05


def test_recall_and_precision_against_exact_jaccard():
    """Recall: of all document pairs with exact shingle Jaccard >= 0.8, the fraction in one cluster.
    Precision: of the documents near dedup removes, the fraction with exact Jaccard >= 0.8 to the
    member of its cluster it was linked to, i.e. every removal is backed by a true near-duplicate;
    and every accepted edge has exact Jaccard >= 0.8."""
    texts, family = variants_corpus(seed=7)
    sets = [shingle_set(t) for t in texts]
    sigs, sketches = SETTINGS.hasher().sketch(texts, SETTINGS.bottom_k)
    keys = np.arange(len(texts), dtype=np.uint64)
    table = nd.cluster_signatures(keys, sigs, sketches, SETTINGS)
    keeper = dict(zip(table["doc_key"].to_list(), table["keeper_key"].to_list()))

    by_family: dict[int, list[int]] = {}
    for i, f in enumerate(family):
        by_family.setdefault(f, []).append(i)
    true_pairs = [
        (i, j) for members in by_family.values() for n, i in enumerate(members) for j in members[n + 1 :]
        if jaccard(sets[i], sets[j]) >= 0.8
    ]
    assert len(true_pairs) > 100
    found = sum(1 for i, j in true_pairs if i in keeper and keeper.get(i) == keeper.get(j))
    assert found / len(true_pairs) >= 0.95

    removed = [d for d, k in keeper.items() if d != k]
    assert removed
    backed = sum(
        1 for d in removed
        if any(jaccard(sets[d], sets[o]) >= 0.8 for o, k in keeper.items() if k == keeper[d] and o != d)
    )
    assert backed / len(removed) >= 0.95
    # Pairs just under the threshold exist in this corpus, so precision is not trivially 1.
    assert any(0.7 <= jaccard(sets[i], sets[j]) < 0.8 for members in by_family.values()
               for n, i in enumerate(members) for j in members[n + 1 :])


def _docs(texts: list, source: str = "web") -> pl.DataFrame:
    return provenance_frame(texts, doc_prefix=f"{source}-a", source=source)


def test_signature_table_handles_null_empty_short_and_skipping_sources():
    docs = _docs(["one two three four five six", None, "   ", "two words"])
    table = nd.signature_table(docs, 3, SETTINGS, near_enabled=True)
    assert table["doc_id"].to_list() == ["web-a/0000000", "web-a/0000002", "web-a/0000003"]
    assert table["doc_key"].to_list() == ex.doc_keys(3, 4)[[0, 2, 3]].tolist()
    assert table["near"].to_list() == [True, False, True]  # no words: nothing to shingle
    assert [len(b) for b in table["bottom"].to_list()] == [2, 0, 1]  # short doc: one shingle of all words
    assert table.width == 6 + SETTINGS.bands  # no MinHash signature: only its band hashes are read
    skipping = nd.signature_table(docs, 3, SETTINGS, near_enabled=False)
    assert not skipping["near"].any()
    with pytest.raises(ValueError, match="no `text` column"):
        nd.signature_table(docs.drop("text"), 0, SETTINGS, True)
    assert nd.signature_table(docs.head(0), 0, SETTINGS, True).height == 0


def test_apply_decisions_writes_reasons_and_cluster_columns():
    docs = _docs(["keep me", "exact copy", None, "near copy", "cluster keeper", "plain"])
    keys = ex.doc_keys(2, docs.height)
    exact = pl.DataFrame(
        {"doc_key": [keys[1]], "kept_key": [7], "kept_doc_id": ["wiki-a/0000003"], "group_size": [2]},
        schema=ex.DROPS_SCHEMA,
    )
    near = pl.DataFrame(
        {"doc_key": [keys[3], keys[4], 99], "keeper_key": [keys[4], keys[4], keys[4]],
         "keeper_doc_id": ["web-a/0000004"] * 3, "cluster_size": [3, 3, 3]},
        schema={"doc_key": pl.UInt64, "keeper_key": pl.UInt64, "keeper_doc_id": pl.String, "cluster_size": pl.Int64},
    )
    exact_out, near_out = nd.apply_decisions(docs, 2, exact, near)
    assert exact_out.rejects.select("doc_id", "stage", "rule", "detail").rows() == [
        ("web-a/0000001", "exact_deduped", "exact_dedup/duplicate", "duplicate of wiki-a/0000003"),
        ("web-a/0000002", "exact_deduped", "exact_dedup/null_text", "text is null"),
    ]
    assert near_out.rejects.select("doc_id", "stage", "rule", "detail").rows() == [
        ("web-a/0000003", "near_deduped", "near_dedup/duplicate",
         "duplicate of web-a/0000004; cluster web-a/0000004 of 3 documents"),
    ]
    kept = near_out.documents
    assert kept["doc_id"].to_list() == ["web-a/0000000", "web-a/0000004", "web-a/0000005"]
    assert kept["dup_cluster"].to_list() == [None, "web-a/0000004", None]
    assert kept["dup_cluster_size"].to_list() == [1, 3, 1]
    assert kept.columns == docs.columns + ["dup_cluster", "dup_cluster_size"]
    assert (exact_out.stats.docs_in, exact_out.stats.docs_out) == (6, 4)
    assert (near_out.stats.docs_in, near_out.stats.docs_out) == (4, 3)
    assert exact_out.stats.dropped == {"exact_dedup/duplicate": 1, "exact_dedup/null_text": 1}
    assert near_out.stats.dropped == {"near_dedup/duplicate": 1}
    assert exact_out.stats.by_bucket["web"].docs_in == 6


def _band_edges_all(table: pl.DataFrame, splits: int, dropped: pl.LazyFrame | None = None) -> tuple[pl.DataFrame, list]:
    per_band = [nd.band_edges(table.lazy(), [table.lazy()], dropped, band, SETTINGS, splits) for band in range(SETTINGS.bands)]
    return pl.concat([edges for edges, _ in per_band]), [counts for _, counts in per_band]


def test_band_splits_give_the_same_edges_and_clusters_holding_a_slice_each():
    texts, _ = variants_corpus(seed=11, bases=120)
    table = nd.signature_table(_docs(texts), 0, SETTINGS, near_enabled=True)
    whole, whole_counts = _band_edges_all(table, 1)
    split, split_counts = _band_edges_all(table, 4)
    assert whole.height > 50
    assert whole.equals(split)  # same rows, same order, same similarities
    assert [c["docs"] for c in whole_counts] == [c["docs"] for c in split_counts] == [table.height] * SETTINGS.bands
    assert all(c["largest_split_docs"] < 0.4 * table.height for c in split_counts)
    def cluster_table(edges: pl.DataFrame) -> pl.DataFrame:
        return nd.clusters(edges["src"].to_numpy(), edges["dst"].to_numpy())
    assert cluster_table(whole).equals(cluster_table(split))
    assert (cluster_table(whole)["doc_key"] != cluster_table(whole)["keeper_key"]).sum() > 20

    # Documents exact dedup dropped take no part, in every split.
    dropped_keys = whole["dst"].unique().head(10)
    dropped = pl.DataFrame({"doc_key": dropped_keys}, schema={"doc_key": pl.UInt64}).lazy()
    for splits in (1, 4):
        edges, _ = _band_edges_all(table, splits, dropped)
        assert not edges["dst"].is_in(dropped_keys.implode()).any()
        assert not edges["src"].is_in(dropped_keys.implode()).any()
    assert _band_edges_all(table, 1, dropped)[0].equals(_band_edges_all(table, 4, dropped)[0])


def test_read_sketches_reads_each_key_from_its_own_shard():
    shards = [nd.signature_table(_docs(texts), ordinal, SETTINGS, near_enabled=True)
              for ordinal, texts in enumerate((["a b c d e f", "g h i j k"], ["l m n o p q r", "s t"]))]
    keys = np.array([shards[1]["doc_key"][1], shards[0]["doc_key"][0], shards[1]["doc_key"][1]], dtype=np.uint64)
    found, sketches = nd.read_sketches([t.lazy() for t in shards], keys)
    assert found.tolist() == sorted({int(k) for k in keys})
    assert [s.tolist() for s in sketches] == [shards[0]["bottom"][0].to_list(), shards[1]["bottom"][1].to_list()]
    with pytest.raises(KeyError, match="shard ordinal 1, but only 1 shards"):
        nd.read_sketches([shards[0].lazy()], keys)
    with pytest.raises(KeyError, match="1 candidate doc_key"):
        nd.read_sketches([t.lazy() for t in shards], np.append(keys, ex.doc_keys(0, 5)[4]))


def test_band_split_count_from_memory_budget():
    assert nd.band_splits(10_000_000, None) == 1
    assert nd.band_splits(10_000_000, 64, fixed=3) == 3
    fits = 64 * 2**20 // nd.BAND_BYTES_PER_DOC
    assert nd.band_splits(fits, 64) == 1
    assert nd.band_splits(fits + 1, 64) == 2
    assert nd.band_splits(10_000_000, 100) == -(-10_000_000 * nd.BAND_BYTES_PER_DOC // (100 * 2**20))
    with pytest.raises(ValueError, match="at least 1"):
        nd.band_edges(pl.LazyFrame(), [], None, 0, SETTINGS, 0)
