"""shuffled_shards: the seeded external shuffle of entries, exactly once, byte-identical on rerun."""

from __future__ import annotations

import struct

import numpy as np
import polars as pl
import pytest

from refinery import layout
from refinery.global_steps import shuffle as sh
from refinery.global_steps import tokenize as tk
from refinery.documents import input_shards
from refinery.shard_format import HEADER, ShardFormatError, ShardReader
from helpers.corpus import bucket_parts, make_corpus, series_indexes, shuffle, tokenize_all


def entry_tokens(c, stage: str, bucket: str) -> dict[tuple[str, int], tuple[bytes, int]]:
    """(doc_id, window) -> (token bytes, overlap) over every shard of a bucket, asserting no repeats."""
    out, root = {}, c.root
    for ref in (ref for index in series_indexes(c, stage, bucket) for ref in index["shards"]):
        reader = ShardReader(root.local_path(ref["prefix"] + ".idx").with_suffix(""))
        for i, row in enumerate(reader.entries.iter_rows(named=True)):
            key = (row["doc_id"], row["window"])
            assert key not in out, f"entry {key} appears twice"
            out[key] = (np.asarray(reader.entry(i)).tobytes(), int(reader.overlaps[i]))
    return out


def shuffled_files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root.root)): p.read_bytes() for p in (root.root / "shards" / "final").rglob("*") if p.is_file()}


@pytest.fixture
def tokenized(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 150, "web/b": 100, "math/m": 40})
    tokenize_all(c)
    return c


def test_shuffle_moves_every_entry_exactly_once(tokenized):
    root = tokenized.root
    result = shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    before = entry_tokens(tokenized, tk.TOKENIZED, "web")
    after = entry_tokens(tokenized, tk.FINAL, "web")
    assert after == before
    assert len(after) == result.index["entries"] and result.index["documents"] == 250
    docs = {doc for doc, _ in after}
    assert docs == {d for d, b in tokenized.buckets.items() if b == "web"}
    tokenized_tables = pl.concat([root.read_parquet(layout.bucket_entries_key(tk.TOKENIZED, "web", part))
                                  for part in bucket_parts(tokenized, "web")])
    order_in = tokenized_tables["doc_id"].to_list()
    table = root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web"))
    assert table["doc_id"].to_list() != order_in and sorted(table["doc_id"].to_list()) == sorted(order_in)
    assert table["entry"].to_list() == list(range(table.height))
    src = tokenized_tables.select("doc_id", "window", "quality_score", "n_windows")
    joined = table.join(src, on=["doc_id", "window"], suffix="_in")
    assert joined.height == table.height
    assert (joined["quality_score"] == joined["quality_score_in"]).all()
    assert (joined["n_windows"] == joined["n_windows_in"]).all()
    for ref in result.index["shards"]:
        ShardReader(root.local_path(ref["prefix"] + ".idx").with_suffix("")).verify(ref["sha256"])


def test_shuffle_mixes_documents_across_input_shards(tokenized):
    shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    first_shard = tokenized.root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web")).filter(pl.col("shard") == 0)
    sources = {d.split("/")[0] for d in first_shard["doc_id"]}
    assert sources == {"web-a", "web-b"}


def test_many_small_runs_give_the_same_order_and_tokens_as_one_run(tokenized, tmp_path, monkeypatch):
    # Key ranges are packed into shards by parallel tasks, so each range ends its own last shard:
    # the number of ranges moves shard boundaries, never the order of entries or their tokens.
    root = tokenized.root

    def stream() -> tuple[list[tuple], bytes]:
        table = root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web"))
        rows = table.select("doc_id", "window", "n_windows", "tokens", "overlap", "quality_score", "difficulty").rows()
        shards = root.read_json(layout.shard_index_key(tk.FINAL, "web"))["shards"]
        return rows, b"".join((root.root / (ref["prefix"] + ".bin")).read_bytes() for ref in shards)

    one = shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=64)
    stream_one = stream()
    monkeypatch.setattr(sh, "RUN_FRACTION", 0.0005)  # about 500 bytes per key range
    many = shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    assert one.runs == 1 and many.runs > 20
    assert stream() == stream_one
    assert len(many.index["shards"]) >= len(one.index["shards"])


def test_same_seed_same_bytes_other_seed_other_order(tokenized, tmp_path):
    root = tokenized.root
    shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    first = shuffled_files(root)
    shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    assert shuffled_files(root) == first
    order_3 = root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web"))["doc_id"].to_list()
    shuffle(tokenized, "web", seed=4, shard_tokens=1024, buffer_mb=1)
    order_4 = root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web"))["doc_id"].to_list()
    assert order_3 != order_4 and sorted(order_3) == sorted(order_4)


def test_shuffle_keys_are_a_seeded_permutation():
    keys = sh.shuffle_keys(1, "web", 0, 10_000)
    assert len(np.unique(keys)) == 10_000
    assert np.array_equal(keys[100:200], sh.shuffle_keys(1, "web", 100, 100))
    assert not np.array_equal(keys, sh.shuffle_keys(2, "web", 0, 10_000))
    assert not np.array_equal(keys, sh.shuffle_keys(1, "math", 0, 10_000))
    runs = sh.run_of(keys, 7)
    assert runs.min() == 0 and runs.max() == 6
    assert np.all(np.diff(runs[np.argsort(keys)]) >= 0)  # runs are ordered key ranges


def test_empty_bucket_shuffles_to_an_empty_index(tokenized):
    result = shuffle(tokenized, "code", seed=3, shard_tokens=1024, buffer_mb=1)
    assert result.index["entries"] == 0 and result.index["shards"] == []
    assert tokenized.root.read_parquet(layout.bucket_entries_key(tk.FINAL, "code")).height == 0


def test_missing_tokenized_index_names_the_asset_and_file(tmp_path):
    c = make_corpus(tmp_path)
    tok = tk.build_tokenizer(c.root, c.cfg).tokenizer
    tk.tokenize_file(c.root, c.cfg, next(s for s in input_shards(c.cfg) if s.key == "web-a"), tok)
    with pytest.raises(sh.ShuffleError, match=r"materialize tokenized_shards for input file 'web-b'"):
        shuffle(c, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    assert not c.root.exists(layout.shard_index_key(tk.FINAL, "web"))


def test_a_series_from_another_tokenizer_or_window_is_refused(tokenized):
    key = layout.shard_index_key(tk.TOKENIZED, "web", "web-b")
    index = tokenized.root.read_json(key)
    tokenized.root.write_json(key, {**index, "window": index["window"] * 2})
    with pytest.raises(sh.ShuffleError, match=r"web-b/index.json: tokenized with another window .* input file 'web-b'"):
        shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)


def test_entries_count_across_the_files_of_a_bucket_in_input_order(tokenized):
    """The shuffle key of an entry is its number in the bucket, counting web-a's entries then web-b's."""
    result = shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    counts = [tokenized.root.read_json(layout.shard_index_key(tk.TOKENIZED, "web", p))["entries"]
              for p in ("web-a", "web-b")]
    keys = sh.shuffle_keys(3, "web", 0, sum(counts))
    expected = pl.concat([tokenized.root.read_parquet(layout.bucket_entries_key(tk.TOKENIZED, "web", p))
                          for p in ("web-a", "web-b")])["doc_id"].gather(np.argsort(keys, kind="stable"))
    final = tokenized.root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web"))
    assert final["doc_id"].to_list() == expected.to_list()
    assert result.index["source_parts"] == 2


def _first_shard(c) -> str:
    return str(c.root.local_path(layout.shard_key(tk.TOKENIZED, "web", 0, "web-a") + ".idx"))


def test_changed_shard_content_fails_its_hash_and_writes_nothing(tokenized):
    bin_path = _first_shard(tokenized)[: -len(".idx")] + ".bin"
    data = bytearray(open(bin_path, "rb").read())
    data[10] ^= 0xFF
    open(bin_path, "wb").write(bytes(data))
    with pytest.raises(ShardFormatError, match="content hash .* does not match"):
        shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    assert not tokenized.root.exists(layout.shard_index_key(tk.FINAL, "web"))


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda raw: b"XXXX" + raw[4:], "bad magic"),
        (lambda raw: raw[:-3], "truncated"),
        (lambda raw: raw[:8], "shorter than the 16-byte header"),
        (lambda raw: raw[: HEADER.size + 8] + struct.pack("<q", 10**9) + raw[HEADER.size + 16 :], "not monotone"),
    ],
)
def test_corrupt_idx_is_a_clear_error(tokenized, corrupt, message):
    path = _first_shard(tokenized)
    raw = open(path, "rb").read()
    open(path, "wb").write(corrupt(raw))
    with pytest.raises(ShardFormatError, match=message):
        shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)


def test_a_failed_shuffle_keeps_the_previous_final_shards(tokenized):
    shuffle(tokenized, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    before = shuffled_files(tokenized.root)
    path = _first_shard(tokenized)
    open(path, "wb").write(b"RFSH" + open(path, "rb").read()[4:-1])
    with pytest.raises(ShardFormatError):
        shuffle(tokenized, "web", seed=4, shard_tokens=1024, buffer_mb=1)
    assert shuffled_files(tokenized.root) == before
