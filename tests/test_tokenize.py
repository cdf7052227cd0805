"""Tokenizer training and tokenized_shards on hand-made clean tables (helpers/corpus.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from refinery import layout
from refinery.global_steps import tokenize as tk
from refinery.config import parse_config
from refinery.documents import CLEAN_STAGE, input_shards
from refinery.layout import documents_key
from refinery.shard_format import ShardReader, split_windows

from helpers.corpus import Corpus, make_corpus, tokenize_all


@pytest.fixture
def corpus(tmp_path) -> Corpus:
    return make_corpus(tmp_path)


def test_tokenizer_training_is_deterministic_and_records_its_sample(tmp_path, corpus):
    first = tk.build_tokenizer(corpus.root, corpus.cfg)
    bytes_a = corpus.root.read_bytes(layout.TOKENIZER_KEY)
    second = tk.build_tokenizer(corpus.root, corpus.cfg)
    assert corpus.root.read_bytes(layout.TOKENIZER_KEY) == bytes_a
    assert first.info["sha256"] == second.info["sha256"]
    info = first.info
    assert info["vocab_size"] == 400
    assert info["eod_id"] == 0 and info["dtype"] == "uint16"
    assert info["sample"]["docs"] == 130  # fewer docs than train_docs: all of them
    assert info["sample"]["shards"] == {"math-m": 30, "web-a": 60, "web-b": 40}
    assert corpus.root.read_json(layout.TOKENIZER_INFO_KEY)["sha256"] == info["sha256"]


def test_training_sample_is_seeded_and_capped(tmp_path):
    c = make_corpus(tmp_path, tokenizer={"train_docs": 50})
    texts, info = tk.training_sample(c.root, c.cfg)
    again, _ = tk.training_sample(c.root, c.cfg)
    assert texts == again and info["docs"] == 50 and sum(info["shards"].values()) == 50
    other = make_corpus(tmp_path / "other", seed=8, tokenizer={"train_docs": 50})
    _, other_info = tk.training_sample(other.root, other.cfg)
    assert other_info["shards"] != info["shards"] or other_info["bytes"] != info["bytes"]


def test_tokenizer_loaded_from_path_never_trains(tmp_path, corpus):
    built = tk.build_tokenizer(corpus.root, corpus.cfg)
    path = tmp_path / "my_tokenizer.json"
    path.write_bytes(corpus.root.read_bytes(layout.TOKENIZER_KEY))
    c2 = make_corpus(tmp_path / "two", tokenizer={"path": str(path)})
    loaded = tk.build_tokenizer(c2.root, c2.cfg)
    assert loaded.info["source"] == "file" and loaded.info["sha256"] == built.info["sha256"]


def test_tokenizer_path_errors_are_clear(tmp_path, corpus):
    c = make_corpus(tmp_path / "missing", tokenizer={"path": "nope.json"})
    with pytest.raises(tk.TokenizeError, match="names no file"):
        tk.build_tokenizer(c.root, c.cfg)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    c = make_corpus(tmp_path / "bad", tokenizer={"path": str(bad)})
    with pytest.raises(tk.TokenizeError, match="not a valid tokenizer.json"):
        tk.build_tokenizer(c.root, c.cfg)
    tk.build_tokenizer(corpus.root, corpus.cfg)
    no_eod = tmp_path / "no_eod.json"
    no_eod.write_bytes(corpus.root.read_bytes(layout.TOKENIZER_KEY))
    c = make_corpus(tmp_path / "eod", tokenizer={"path": str(no_eod), "eod_token": "<|eos|>"})
    with pytest.raises(tk.TokenizeError, match="has no '<\\|eos\\|>' token"):
        tk.build_tokenizer(c.root, c.cfg)


def test_packing_window_follows_the_curriculum(corpus):
    assert tk.packing_window(corpus.cfg) == 64
    data = corpus.cfg.model_dump(mode="json", exclude_unset=True, exclude={"base_dir"})
    data["curriculum"] = {"total_tokens": 1000, "phases": [
        {"name": "a", "share": 0.5, "weights": {"web": 1.0}, "seq_len": 32},
        {"name": "b", "share": 0.5, "weights": {"web": 1.0}, "seq_len": 128},
    ]}
    assert tk.packing_window(parse_config(data)) == 128
    data["curriculum"]["phases"][1]["seq_len"] = 24
    data["shards"]["overlap"] = 20
    with pytest.raises(tk.TokenizeError, match="more than half the packing window 32"):
        tk.windowing_overlap(parse_config(data))


def test_tokenized_shards_hold_every_document_windowed_with_eod(corpus):
    results = tokenize_all(corpus)
    tok = tk.read_tokenizer(corpus.root, corpus.cfg.tokenizer.eod_token)
    eod = tok.token_to_id(corpus.cfg.tokenizer.eod_token)
    assert sorted(results) == ["math-m", "web-a", "web-b"]  # one series per input file; code has none
    for part, result in results.items():
        index = result.index
        bucket = index["bucket"]
        assert index["part"] == part and index["stage"] == tk.TOKENIZED
        expected_docs = [d for d, b in corpus.buckets.items() if b == bucket and d.startswith(part + "/")]
        assert expected_docs and index["documents"] == len(expected_docs)
        table = corpus.root.read_parquet(layout.bucket_entries_key(tk.TOKENIZED, bucket, part))
        assert table.height == index["entries"] and int(table["tokens"].sum() or 0) == index["tokens"]
        assert table.filter(pl.col("window") == 0)["doc_id"].to_list() == expected_docs  # input order
        for ref in index["shards"]:
            assert ref["prefix"].startswith(f"shards/tokenized/{bucket}/{part}/shard-")
            assert ref["tokens"] <= 1024 or ref["entries"] == 1
            assert ShardReader(corpus.root.local_path(ref["prefix"] + ".idx").with_suffix("")).num_tokens == ref["tokens"]
        for doc_id in expected_docs:
            rows = table.filter(pl.col("doc_id") == doc_id).sort("window")
            whole = np.asarray(tok.encode(corpus.texts[doc_id], add_special_tokens=False).ids + [eod])
            cuts = split_windows(len(whole), 64, 16)
            assert rows["window"].to_list() == list(range(len(cuts)))
            assert rows["n_windows"].to_list() == [len(cuts)] * len(cuts)
            for row, (a, b, ov) in zip(rows.iter_rows(named=True), cuts):
                shard = layout.shard_key(tk.TOKENIZED, bucket, row["shard"], part)
                reader = ShardReader(corpus.root.local_path(f"{shard}.idx").with_suffix(""))
                got = np.asarray(reader.entry(row["index"]))
                assert np.array_equal(got, whole[a:b]) and row["overlap"] == ov
                assert reader.overlaps[row["index"]] == ov
                assert (got[-1] == eod) == (row["window"] == len(cuts) - 1)
                assert reader.entries.row(row["index"], named=True)["doc_id"] == doc_id
    assert results["web-a"].stats.counters["windowed_docs"] > 0


def test_a_file_is_read_a_batch_at_a_time(tmp_path, monkeypatch):
    """The clean table is read `encode_batch_docs` rows at a time: the encoder never sees more."""
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 50, "web/b": 1, "math/m": 1})
    seen = []
    real = tk.encode_texts
    monkeypatch.setattr(tk, "encode_texts", lambda tok, texts, dtype: seen.append(len(texts)) or real(tok, texts, dtype))
    tok = tk.build_tokenizer(c.root, c.cfg).tokenizer
    shard = next(s for s in input_shards(c.cfg) if s.key == "web-a")
    index = tk.tokenize_file(c.root, c.cfg, shard, tok).index
    assert seen == [16, 16, 16, 2] and index["documents"] == 50


def test_tokenized_shards_are_byte_identical_on_rerun(tmp_path):
    a = make_corpus(tmp_path / "a")
    b = make_corpus(tmp_path / "b")
    tokenize_all(a)
    tokenize_all(b)
    files_a = {p.relative_to(a.root.root): p.read_bytes() for p in a.root.root.rglob("shards/**/*") if p.is_file()}
    files_b = {p.relative_to(b.root.root): p.read_bytes() for p in b.root.root.rglob("shards/**/*") if p.is_file()}
    assert files_a and files_a == files_b
    assert a.root.read_bytes(layout.TOKENIZER_KEY) == b.root.read_bytes(layout.TOKENIZER_KEY)


def test_empty_and_null_texts_are_counted_rejections(tmp_path):
    c = make_corpus(tmp_path, empty_docs=4)
    results = tokenize_all(c)
    for part, docs in (("web-a", 60), ("web-b", 40)):  # the first 4 documents of each of web's files
        result = results[part]
        assert result.stats.dropped["tokenize/empty_text"] == 4
        assert result.rejects.height == 4 and set(result.rejects["rule"]) == {"tokenize/empty_text"}
        assert set(result.rejects["doc_id"].str.split("/").list.first()) == {part}
        assert result.index["documents"] == docs - 4 and result.stats.docs_out == docs - 4
        bucket = result.stats.by_bucket["web"]  # the funnel's per-bucket table reads these
        assert (bucket.docs_in, bucket.docs_out, bucket.bytes_in) == (docs, docs - 4, result.stats.bytes_in)


def test_missing_upstream_table_names_it(tmp_path, corpus):
    tok = tk.build_tokenizer(corpus.root, corpus.cfg).tokenizer
    corpus.root.delete(documents_key(CLEAN_STAGE, "web-b"))
    shard = next(s for s in input_shards(corpus.cfg) if s.key == "web-b")
    with pytest.raises(FileNotFoundError, match="web-b.parquet"):
        tk.tokenize_file(corpus.root, corpus.cfg, shard, tok)
    assert not corpus.root.list("shards/tokenized/web/web-b")


def test_rerun_with_fewer_shards_removes_stale_ones(tmp_path, corpus):
    tokenize_all(corpus)
    before = corpus.root.list("shards/tokenized/web/web-a")
    other = corpus.root.list("shards/tokenized/web/web-b")
    data = corpus.cfg.model_dump(mode="json", exclude_unset=True, exclude={"base_dir"})
    data["shards"]["shard_tokens"] = 100_000
    cfg = parse_config(data, base_dir=corpus.cfg.base_dir)
    tok = tk.read_tokenizer(corpus.root, cfg.tokenizer.eod_token)
    shard = next(s for s in input_shards(cfg) if s.key == "web-a")
    index = tk.tokenize_file(corpus.root, cfg, shard, tok).index
    after = corpus.root.list("shards/tokenized/web/web-a")
    prefix = "shards/tokenized/web/web-a"
    assert len(index["shards"]) == 1 and len(before) > len(after)
    assert sorted(after) == sorted([f"{prefix}/entries.parquet", f"{prefix}/index.json"]
                                   + [f"{prefix}/shard-00000{s}" for s in (".bin", ".entries.parquet", ".idx")])
    assert corpus.root.list("shards/tokenized/web/web-b") == other  # another file's series is left alone
    assert not any(p.name.startswith(".") for p in (corpus.root.root / "shards").rglob("*"))
