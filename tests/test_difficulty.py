"""The difficulty score: a reference token n-gram model orders a crafted corpus as expected, saves to
identical bytes, is bounded by its token cap, and its scores reach the final entries beside
quality_score; bad documents, bad model files and bad config values fail or pass as they should."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import yaml

from assets import tokens
from helpers.configs import DEMO, demo_config
from helpers.corpus import bucket_parts, make_corpus, shuffle, tokenize_all
from helpers.materialize import materialize, module_assets
from orchestration.cli import main
from refinery import layout
from refinery.config import load_config
from refinery.documents import input_batches
from refinery.models import difficulty as dfc
from refinery.models import difficulty_published as dpub
from refinery.global_steps import shuffle as shuffle_stage
from refinery.global_steps import tokenize as tk
from refinery.global_steps.tokenize import train_tokenizer

EOD = "<|endoftext|>"

# The reference corpus: plain English prose about everyday things.
REFERENCE = [
    "The village lies in a green valley between two low hills. In the morning the farmers walk to their fields, "
    "and the children walk to the small school beside the church. The river runs past the mill and under the old "
    "stone bridge, and in the summer the water is warm and slow.",
    "On market day the square is full of people. They buy bread, fruit, cheese and fish, and they talk about the "
    "weather and the price of wheat. When the sun is high the old men sit in the shade of the trees and watch the "
    "people go by. In the evening the square is quiet again.",
    "The house by the river has a red door and a small garden. A family of four lives there with a dog and two "
    "cats. The father works at the mill and the mother teaches at the school. On Sunday they walk along the river "
    "to the bridge and back, and the children throw stones into the water.",
    "In the winter the valley is white with snow and the river is slow and cold. The farmers stay at home and mend "
    "their tools, and the children play in the snow after school. At night the people sit by the fire and tell "
    "stories about the long summer days and the warm water of the river.",
]
EASY = "The children walk to the school and the farmers walk to their fields. " * 8
DENSE = ("Eigendecomposition of Hermitian operators yields orthonormal eigenbases; cf. Lanczos tridiagonalization, "
         "Householder QR with Wilkinson shifts, and Cholesky-preconditioned GMRES(k) on ill-conditioned Krylov spaces.")
GERMAN = ("Die Kinder gehen am Morgen zur Schule, und die Bauern arbeiten auf ihren Feldern neben dem Fluss. "
          "Am Abend sitzen die Leute am Feuer und erzählen Geschichten über den langen Sommer.")
JAPANESE = "朝になると子どもたちは学校へ行き、農家の人々は川のそばの畑で働きます。夕方には皆で火を囲んで話をします。"


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(REFERENCE, 400, EOD)


def encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.uint32)


@pytest.fixture(scope="module")
def model(tokenizer):
    return dfc.train([encode(tokenizer, t) for t in REFERENCE], tokenizer.get_vocab_size(), order=3)


def test_repetitive_easy_text_scores_below_dense_technical_text(tokenizer, model):
    easy, dense = dfc.score(model, encode(tokenizer, EASY)), dfc.score(model, encode(tokenizer, DENSE))
    assert 0 < easy < dense, (easy, dense)
    # Below the uniform guess over the vocabulary, which no text the model has learnt from can reach.
    assert easy < math.log(tokenizer.get_vocab_size()) / 2


@pytest.mark.parametrize("text", [GERMAN, JAPANESE])
def test_non_english_text_gets_a_finite_score_above_english_prose(tokenizer, model, text):
    score = dfc.score(model, encode(tokenizer, text))
    assert score is not None and math.isfinite(score)
    assert score > dfc.score(model, encode(tokenizer, EASY))


def test_probabilities_of_every_next_token_sum_to_one(tokenizer, model):
    vocab = tokenizer.get_vocab_size()
    for context in ([], list(encode(tokenizer, "the river")[-2:]), [7, 311]):  # seen, and never seen
        candidates = [np.asarray([*context, w], dtype=np.uint32) for w in range(vocab)]
        logp, starts = dfc._log_probs(model, candidates)
        assert np.exp(logp[starts + len(context)]).sum() == pytest.approx(1.0, abs=1e-9)


def test_documents_of_zero_or_one_token_get_no_score(tokenizer, model):
    docs = [np.zeros(0, np.uint32), encode(tokenizer, "The")[:1], encode(tokenizer, EASY)]
    scores = dfc.score_documents(model, docs)
    assert np.isnan(scores[:2]).all() and math.isfinite(scores[2])
    assert dfc.score(model, docs[0]) is None and dfc.score(model, docs[1]) is None
    assert scores[2] == dfc.score(model, docs[2])  # batched or alone, the same number


def test_saved_bytes_are_deterministic_and_load_scores_identically(tokenizer, model):
    docs = [encode(tokenizer, t) for t in REFERENCE]
    data = model.to_bytes()
    assert dfc.train(docs, tokenizer.get_vocab_size(), order=3).to_bytes() == data
    loaded = dfc.ReferenceModel.from_bytes(data, "reference.npz")
    assert loaded.to_bytes() == data
    probe = [encode(tokenizer, t) for t in (EASY, DENSE, GERMAN, JAPANESE)]
    assert dfc.score_documents(loaded, probe).tobytes() == dfc.score_documents(model, probe).tobytes()


def test_the_token_cap_bounds_the_model(tokenizer):
    docs = [encode(tokenizer, t) for t in REFERENCE]
    cap = len(docs[0]) + 17
    capped = dfc.train(docs, tokenizer.get_vocab_size(), order=3, max_tokens=cap)
    by_hand = dfc.train([docs[0], docs[1][:17]], tokenizer.get_vocab_size(), order=3, max_tokens=10**9)
    assert capped.tokens == cap and capped.to_bytes() == by_hand.to_bytes()
    assert all(n <= cap for n in capped.distinct_ngrams())


def test_a_corrupt_or_missing_model_file_is_an_error_naming_it(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 5, "math/m": 5})
    with pytest.raises(dfc.DifficultyModelError, match=r"models/difficulty/reference\.npz: no difficulty reference "
                                                         r"model; materialize difficulty_model first"):
        dpub.load_published_model(c.root)
    c.root.write_bytes(layout.DIFFICULTY_MODEL_KEY, b"not a zip file")
    with pytest.raises(dfc.DifficultyModelError, match=r"reference\.npz: not a reference model file"):
        dpub.load_published_model(c.root)


def scored_corpus(tmp_path, **difficulty):
    """A hand-made corpus with difficulty enabled (reference bucket: math), its tokenizer and model."""
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 40, "web/b": 30, "math/m": 30}, empty_docs=1,
                    stages={"difficulty": {"enabled": True, "reference_buckets": ["math"], **difficulty}})
    tok = tk.build_tokenizer(c.root, c.cfg).tokenizer
    return c, tok, dpub.build_reference_model(c.root, c.cfg, tok)


def test_the_column_reaches_the_final_entries_beside_quality_score(tmp_path):
    c, tok, built = scored_corpus(tmp_path)
    assert built.source == "trained" and 0 < built.model.tokens <= c.cfg.stages.difficulty.max_train_tokens
    tokenize_all(c)
    shuffle(c, "web", seed=3, shard_tokens=1024, buffer_mb=1)
    final = c.root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web"))
    assert final.schema["difficulty"] == pl.Float64 and final.schema["quality_score"] == pl.Float64
    first = final.filter(pl.col("window") == 0)
    expected = {doc: dfc.score(built.model, encode(tok, c.texts[doc])) for doc in first["doc_id"]}
    assert dict(zip(first["doc_id"], first["difficulty"])) == expected
    assert sum(v is not None for v in expected.values()) > 60  # nearly every document has two tokens or more
    # Every window of a document carries its document's score, as quality_score does.
    assert final.group_by("doc_id").agg(pl.col("difficulty").n_unique())["difficulty"].max() == 1
    tokenized = pl.concat([c.root.read_parquet(layout.bucket_entries_key(tk.TOKENIZED, "web", part))
                           for part in bucket_parts(c, "web")])
    joined = final.join(tokenized.select("doc_id", "window", "difficulty"), on=["doc_id", "window"], suffix="_in")
    assert joined.height == final.height and joined["difficulty"].equals(joined["difficulty_in"])
    scored = np.array([v for v in expected.values() if v is not None])
    summary = shuffle_stage.bucket_difficulty(c.root, "web")
    assert summary["count"] == len(scored) and summary["mean"] == pytest.approx(scored.mean(), abs=1e-4)
    for q in (10, 50, 90):  # its histogram bin's lower edge: at most 1/1000 nat below the exact quantile
        exact = float(np.quantile(scored, q / 100, method="inverted_cdf"))
        assert exact - 1e-3 - 1e-4 <= summary[f"p{q}"] <= exact + 1e-4


def test_disabled_the_column_is_null(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 10, "math/m": 5})
    tokenize_all(c)
    table = c.root.read_parquet(layout.bucket_entries_key(tk.TOKENIZED, "web", "web-a"))
    assert table.height > 0 and table["difficulty"].null_count() == table.height
    assert "difficulty_model_sha256" not in c.root.read_json(layout.shard_index_key(tk.TOKENIZED, "web", "web-a"))


def test_a_named_model_file_is_used_and_checked_against_the_tokenizer(tmp_path):
    c, tok, built = scored_corpus(tmp_path / "a")
    named = tmp_path / "reference.npz"
    named.write_bytes(built.model.to_bytes())
    again = make_corpus(tmp_path / "b", docs_per_shard={"web/a": 40, "web/b": 30, "math/m": 30}, empty_docs=1,
                        stages={"difficulty": {"enabled": True, "model_path": str(named)}})
    loaded = dpub.build_reference_model(again.root, again.cfg, tk.build_tokenizer(again.root, again.cfg).tokenizer)
    assert loaded.source == str(named) and loaded.sha256 == built.sha256
    other = make_corpus(tmp_path / "c", docs_per_shard={"web/a": 40, "web/b": 30, "math/m": 30},
                        stages={"difficulty": {"enabled": True, "model_path": str(named)}},
                        tokenizer={"vocab_size": 300})
    with pytest.raises(dfc.DifficultyModelError, match="trained on token ids of tokenizer"):
        dpub.build_reference_model(other.root, other.cfg, tk.build_tokenizer(other.root, other.cfg).tokenizer)
    named.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(dfc.DifficultyModelError, match=f"{named}: not a reference model file"):
        dpub.build_reference_model(again.root, again.cfg, tk.read_tokenizer(again.root, EOD))


def test_assets_train_score_and_report_the_distribution(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 30, "math/m": 30},
                    stages={"difficulty": {"enabled": True, "reference_buckets": ["math"]}})
    assets = module_assets(tokens, c.config_path)
    assert "difficulty_model" in {k.to_user_string() for k in assets["tokenized_shards"].dependency_keys}
    materialize([assets["tokenizer"]], c.config_path)
    model_md = {k: v.value for k, v in materialize([assets["difficulty_model"]], c.config_path)
                .asset_materializations_for_node("difficulty_model")[0].metadata.items()}
    sha = c.root.sha256(layout.DIFFICULTY_MODEL_KEY)
    assert model_md["model_sha256"] == sha and model_md["content_hashes"] == {layout.DIFFICULTY_MODEL_KEY: sha}
    assert model_md["tokens_trained_on"] > 0 and list(model_md["distinct_ngrams"]) == ["order_1", "order_2", "order_3"]
    for batch in input_batches(c.cfg):
        materialize([assets["tokenized_shards"]], c.config_path, partition_key=batch.key)
    md = {k: v.value for k, v in materialize([assets["shuffled_shards"]], c.config_path, partition_key="web")
          .asset_materializations_for_node("shuffled_shards")[0].metadata.items()}
    assert md["difficulty"]["count"] > 20 and md["difficulty"]["p10"] <= md["difficulty"]["p50"] <= md["difficulty"]["p90"]


def test_without_difficulty_the_graph_has_no_reference_model(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 5, "math/m": 5})
    assets = module_assets(tokens, c.config_path)
    assert "difficulty_model" not in assets
    assert "difficulty_model" not in {k.to_user_string() for k in assets["tokenized_shards"].dependency_keys}


@pytest.mark.parametrize("difficulty, message", [
    ({"order": 0}, "stages.difficulty.order: Input should be greater than or equal to 1"),
    ({"max_train_tokens": 0}, "stages.difficulty.max_train_tokens: Input should be greater than or equal to 1"),
    ({"reference_buckets": ["books", "nope"]}, "stages.difficulty.reference_buckets: unknown bucket(s) ['nope']"),
    ({"reference_buckets": ["code"]}, "stages.difficulty.reference_buckets: ['code'] names and no source feeds"),
])
def test_preflight_refuses_impossible_difficulty_settings(tmp_path, capsys, difficulty, message):
    data = demo_config(tmp_path / "out")
    data["stages"]["difficulty"] = {"enabled": True, **difficulty}
    data["sources"] = [s for s in data["sources"] if s["bucket"] != "code"]
    path = tmp_path / "refinery.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["demo", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_the_demo_config_scores_difficulty():
    cfg = load_config(DEMO)
    assert cfg.stages.difficulty.enabled and dpub.reference_buckets(cfg) == ["books", "wiki"]


def test_a_model_file_that_decompresses_to_far_more_than_it_holds_is_refused_from_its_headers(tmp_path):
    """Issue 38: every member was decompressed before any check (a 2.4 MB file reached 2.45 GB)."""
    import tracemalloc

    from helpers.bombs import write_difficulty_model_bomb

    bomb = tmp_path / "bomb.npz"
    write_difficulty_model_bomb(bomb, 256 << 20)
    assert bomb.stat().st_size < 2 << 20
    data = bomb.read_bytes()
    tracemalloc.start()
    try:
        with pytest.raises(dfc.DifficultyModelError, match=r"bomb\.npz: not a reference model file \(its members "
                                                            r"declare 268,43\d,\d+ bytes decompressed, more than"):
            dfc.ReferenceModel.from_bytes(data, str(bomb))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak:,} bytes allocated before the refusal"
    with pytest.raises(dfc.DifficultyModelError, match="declare"):
        dfc.check_model_file(str(bomb))


@pytest.mark.parametrize("member, value, message", [
    ("ngram_counts", np.array([-5], dtype=np.int64), r"ngram_counts_1\.npy holds int64"),
    ("ngram_counts", np.array([0], dtype=np.uint32), r"ngram_counts_1: not sorted unique keys, counts of at least one"),
    ("ngram_keys", None, r"ngram_keys_1: not sorted unique keys"),
    ("context_followers", np.array([10**6], dtype=np.uint32), r"context_followers_0: .* followers within totals"),
])
def test_a_model_with_impossible_values_is_refused(tokenizer, model, member, value, message):
    """Issue 38: a model with negative counts loaded and scored."""
    import dataclasses

    tables = list(getattr(model, member))
    first = tables[0] if member != "context_followers" else tables[0].copy()
    if value is None:
        first = first[::-1].copy()  # keys out of order
    else:
        first = np.concatenate([value, first[1:]]) if member != "context_followers" else value[:len(first)]
    tables[0] = first
    damaged = dataclasses.replace(model, **{member: tuple(tables)}).to_bytes()
    with pytest.raises(dfc.DifficultyModelError, match=message):
        dfc.ReferenceModel.from_bytes(damaged, "reference.npz")
