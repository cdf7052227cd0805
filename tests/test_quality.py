"""The quality classifier: features, deterministic training, scoring and its rejections."""

import random

import numpy as np
import polars as pl
import pytest

from refinery.models import quality as q
from refinery.models import quality_features as qf
from refinery.models import quality_fit as qfit
from refinery.models import quality_training as qt
from refinery.config import ConfigError, parse_config
from refinery.storage import LocalDataRoot

from helpers.quality_memory import peak_rss_kib

CURATED = (
    "the river valley was settled by farmers who built stone houses and kept detailed records of "
    "harvests weather and trade with neighbouring towns over several centuries of history"
).split()
SPAM = (
    "click here buy now cheap deals free shipping best price casino bonus win money online today "
    "limited offer subscribe hot sale discount code"
).split()

SETTINGS = dict(num_features=4096, ngram=2, epochs=5, learning_rate=0.5, holdout_fraction=0.2, max_chars=100_000,
                max_docs_per_class=10_000, seed=7)


def synthetic_corpus(n: int = 240, seed: int = 0) -> pl.DataFrame:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        bucket = ("wiki", "web", "books", "web")[i % 4]
        vocab = SPAM if bucket == "web" else CURATED
        words = [rng.choice(vocab) if rng.random() < 0.85 else rng.choice(CURATED + SPAM) for _ in range(60)]
        rows.append({"doc_id": f"{bucket}-0/{i:07d}", "bucket": bucket, "text": " ".join(words)})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def trained():
    return qfit.train_quality_model(synthetic_corpus(), ["books", "wiki"], ["web"], **SETTINGS)


# ---- features ------------------------------------------------------------------------------------


K = qf.SHAPE_SIGNALS


def ngrams(feats, doc: int) -> list[int]:
    """Document `doc`'s n-gram buckets: its features after its SHAPE_SIGNALS shape rows."""
    return feats.indices[feats.indptr[doc] + K : feats.indptr[doc + 1]].tolist()


def test_features_count_unigrams_and_bigrams_per_document():
    feats = qf.hash_features(pl.Series(["One two three", "", None, "four"]), 1 << 16, 2, 1000)
    # each document: its shape rows, then 3 unigrams + 2 bigrams; nothing; nothing; 1
    assert np.diff(feats.indptr).tolist() == [K + 5, K, K, K + 1]
    assert all(0 <= i < 1 << 16 for d in range(4) for i in ngrams(feats, d))
    shape = feats.indices[(feats.indptr[:-1, None] + np.arange(K)).ravel()]
    assert shape.min() >= 1 << 16 and shape.max() < (1 << 16) + qf.SHAPE_ROWS


def test_features_are_case_insensitive_and_stable_across_calls():
    a = qf.hash_features(pl.Series(["Hello World"]), 1 << 20, 2, 1000)
    b = qf.hash_features(pl.Series(["other text first", "hello world"]), 1 << 20, 2, 1000)
    assert a.indices.tolist() == b.indices[b.indptr[1] :].tolist()
    assert len(set(ngrams(a, 0))) == 3  # hello, world, "hello world" land in different buckets


def test_bigrams_never_cross_document_boundaries():
    joined = qf.hash_features(pl.Series(["alpha beta"]), 1 << 20, 2, 1000)
    split = qf.hash_features(pl.Series(["alpha", "beta"]), 1 << 20, 2, 1000)
    assert split.indptr.tolist() == [0, K + 1, 2 * K + 2]
    assert set(ngrams(split, 0) + ngrams(split, 1)) < set(ngrams(joined, 0))


def test_features_read_only_the_first_max_chars():
    feats = qf.hash_features(pl.Series(["aa bb " + "cc " * 1000]), 1 << 16, 1, 5)
    assert feats.indptr.tolist() == [0, K + 2]


# ---- training ------------------------------------------------------------------------------------


def test_training_separates_curated_from_web_on_held_out_documents(trained):
    model, report = trained
    assert report.accuracy is not None and report.accuracy >= 0.95
    assert report.precision >= 0.9 and report.recall >= 0.9
    held = report.holdout_by_bucket
    assert (held["books"] + held["wiki"], held["web"]) == (24, 24)  # 20% of each class, by doc_id hash
    assert report.train_positive == 96 and report.train_negative == 96
    # unseen documents made as the training ones are (so their shape signals, such as length and
    # distinct words, are those the model learned on)
    fresh = synthetic_corpus(8, seed=99)
    scores = model.score(fresh["text"])
    curated = fresh["bucket"].is_in(["books", "wiki"]).to_numpy()
    assert scores[curated].min() > 0.75 and scores[~curated].max() < 0.25


def test_training_is_byte_identical_and_independent_of_row_order(trained):
    model, _ = trained
    shuffled = synthetic_corpus().sample(fraction=1.0, shuffle=True, seed=3)
    again, _ = qfit.train_quality_model(shuffled, ["books", "wiki"], ["web"], **SETTINGS)
    assert again.to_bytes() == model.to_bytes()


def test_training_is_the_same_however_the_documents_are_batched(trained):
    model, _ = trained
    shuffled = synthetic_corpus().sample(fraction=1.0, shuffle=True, seed=3)
    sliced, _ = qfit.train_quality_model(lambda: shuffled.iter_slices(7), ["books", "wiki"], ["web"], **SETTINGS)
    assert sliced.to_bytes() == model.to_bytes()


def test_training_in_small_chunks_is_deterministic_and_still_separates_the_classes():
    settings = {**SETTINGS, "chunk_bytes": 4096}  # about 34 documents of 119 features each
    model, report = qfit.train_quality_model(synthetic_corpus(), ["books", "wiki"], ["web"], **settings)
    shuffled = synthetic_corpus().sample(fraction=1.0, shuffle=True, seed=3)
    again, _ = qfit.train_quality_model(lambda: shuffled.iter_slices(50), ["books", "wiki"], ["web"], **settings)
    assert again.to_bytes() == model.to_bytes()
    assert report.accuracy >= 0.95


def test_training_featurizes_bounded_slices_and_holds_bounded_chunks(monkeypatch):
    featurized, chunks = [], []
    hash_features, read = qf.hash_features, qfit.FeatureSpill.read

    def counting_hash_features(texts, *args):
        featurized.append(len(texts))
        return hash_features(texts, *args)

    def counting_read(spill, starts, lengths):
        feats = read(spill, starts, lengths)
        chunks.append(feats.indices.nbytes)
        return feats

    monkeypatch.setattr(qfit, "hash_features", counting_hash_features)
    monkeypatch.setattr(qfit.FeatureSpill, "read", counting_read)
    _, report = qfit.train_quality_model(synthetic_corpus(1000), ["books", "wiki"], ["web"],
                                      **{**SETTINGS, "chunk_bytes": 16_384})
    # One table of 1,000 documents in: featurized once each, FEATURIZE_DOCS at a time at most.
    assert sum(featurized) == 1000 and max(featurized) <= qfit.FEATURIZE_DOCS and len(featurized) >= 4
    assert report.train_positive + report.train_negative + report.holdout_size == 1000
    # 800 training documents of 476 bytes of features are 24 chunks an epoch, each within 16 KiB.
    assert max(chunks) <= 16_384 and len(chunks) >= SETTINGS["epochs"] * 24


@pytest.mark.slow
def test_peak_memory_of_training_does_not_grow_with_the_corpus():
    small, large = peak_rss_kib(500), peak_rss_kib(2000)
    # With every document featurized at once, 4x the documents took 1.34x the peak RSS (408 MB to
    # 545 MB on this helper); streamed, the peak stays where imports and one chunk put it.
    assert large < 1.1 * small, (small, large)


def test_a_different_seed_gives_a_different_model(trained):
    model, _ = trained
    other, _ = qfit.train_quality_model(synthetic_corpus(), ["books", "wiki"], ["web"], **{**SETTINGS, "seed": 8})
    assert other.to_bytes() != model.to_bytes()


def test_max_docs_per_class_caps_each_class():
    _, report = qfit.train_quality_model(synthetic_corpus(), ["books", "wiki"], ["web"],
                                      **{**SETTINGS, "max_docs_per_class": 50})
    assert report.train_positive + sum(v for b, v in report.holdout_by_bucket.items() if b != "web") == 50
    assert report.train_negative + report.holdout_by_bucket["web"] == 50


def test_holdout_leaves_every_class_something_to_train_on():
    labels = np.array([1, 0, 0, 1, 1, 1])
    keys = np.array([0.9, 0.5, 0.1, 0.3, 0.2, 0.8])
    assert qfit.split_holdout(labels, keys, 0.5).tolist() == [False, False, True, True, True, False]
    assert qfit.split_holdout(labels, keys, 0.99).tolist() == [False, False, True, True, True, True]
    assert qfit.split_holdout(np.array([1, 0]), np.array([0.1, 0.2]), 0.5).tolist() == [False, False]


@pytest.mark.parametrize("positive,negative,field", [(["code"], ["web"], "positive_buckets"),
                                                     (["wiki"], ["math"], "negative_buckets")])
def test_no_documents_for_a_class_names_the_config_field(positive, negative, field):
    with pytest.raises(qfit.NoTrainingData, match=rf"stages\.quality\.{field}"):
        qfit.train_quality_model(synthetic_corpus(), positive, negative, **SETTINGS)


def test_documents_without_text_do_not_count_as_training_data():
    docs = pl.DataFrame({"doc_id": ["a", "b", "c"], "bucket": ["wiki", "web", "web"], "text": ["", None, "spam"]})
    with pytest.raises(qfit.NoTrainingData, match="positive_buckets"):
        qfit.train_quality_model(docs, ["wiki"], ["web"], **SETTINGS)


def test_unknown_bucket_in_positive_buckets_is_a_config_error():
    data = {"data_root": "out", "buckets": ["web", "wiki"],
            "sources": [{"name": "web", "path": "x/*.warc", "format": "warc", "bucket": "web"}],
            "stages": {"quality": {"positive_buckets": ["wiki", "bookz"]}}}
    with pytest.raises(ConfigError, match=r"stages\.quality\.positive_buckets: unknown bucket 'bookz'"):
        parse_config(data)


# ---- model file ----------------------------------------------------------------------------------


def test_published_model_round_trips_and_is_named_by_its_hash(trained, tmp_path):
    model, report = trained
    root = LocalDataRoot(tmp_path)
    pointer = qt.publish_model(root, model, report, {"seed": 7})
    assert pointer["model_key"] == f"models/quality/quality-{pointer['model_hash']}.pt"
    assert root.sha256(pointer["model_key"]) == pointer["sha256"]
    assert root.read_json(q.LATEST_KEY)["accuracy"] == pytest.approx(report.accuracy)
    loaded, _ = qt.load_published_model(root)
    texts = synthetic_corpus()["text"]
    assert np.array_equal(loaded.score(texts), model.score(texts))


def test_a_model_file_that_does_not_match_its_pointer_is_refused(trained, tmp_path):
    model, report = trained
    root = LocalDataRoot(tmp_path)
    pointer = qt.publish_model(root, model, report, {})
    root.write_bytes(pointer["model_key"], root.read_bytes(pointer["model_key"])[:-1] + b"x")
    with pytest.raises(ValueError, match="re-materialize quality_model"):
        qt.load_published_model(root)


def test_missing_model_says_what_to_materialize(tmp_path):
    with pytest.raises(FileNotFoundError, match="materialize quality_model first"):
        qt.load_published_model(LocalDataRoot(tmp_path))


# ---- scoring stage -------------------------------------------------------------------------------


def scored_input() -> pl.DataFrame:
    texts = [" ".join(CURATED), " ".join(SPAM), "", None, " ".join(CURATED[:10])]
    return pl.DataFrame({
        "doc_id": [f"web-0/{i:07d}" for i in range(len(texts))],
        "url": [f"https://example.com/{i}" for i in range(len(texts))],
        "source": ["web"] * len(texts),
        "bucket": ["web"] * len(texts),
        "text": texts,
    })


def test_scorer_drops_below_threshold_with_the_score_as_value(trained):
    model, _ = trained
    out = q.QualityScorer(model, threshold=0.5).run(scored_input())
    assert out.documents["doc_id"].to_list() == ["web-0/0000000", "web-0/0000004"]
    assert out.documents["quality_score"].min() >= 0.5
    rules = dict(zip(out.rejects["doc_id"], out.rejects["rule"]))
    assert rules == {"web-0/0000001": "quality/below_threshold", "web-0/0000002": "quality/empty_text",
                     "web-0/0000003": "quality/empty_text"}
    spam_value = out.rejects.filter(pl.col("rule") == "quality/below_threshold")["value"][0]
    assert spam_value == pytest.approx(model.score(pl.Series([" ".join(SPAM)]))[0])
    assert out.stats.dropped == {"quality/below_threshold": 1, "quality/empty_text": 2}
    assert (out.stats.docs_in, out.stats.docs_out) == (5, 2)
    assert out.stats.by_bucket["web"].docs_out == 2


def test_scorer_for_a_skipping_source_keeps_low_scores(trained):
    model, _ = trained
    out = q.QualityScorer(model, threshold=0.5, enforce_threshold=False).run(scored_input())
    assert out.documents.height == 3  # only the two documents without text leave
    assert out.stats.counters["quality/below_threshold_kept_by_skip"] == 1
    assert out.documents["quality_score"].null_count() == 0


def test_scores_are_identical_on_rerun(trained):
    model, _ = trained
    a = q.QualityScorer(model, 0.2).run(synthetic_corpus().with_columns(url=pl.lit(None, pl.String), source=pl.lit("s")))
    b = q.QualityScorer(model, 0.2).run(synthetic_corpus().with_columns(url=pl.lit(None, pl.String), source=pl.lit("s")))
    assert a.documents.equals(b.documents)
    assert a.documents["quality_score"].is_between(0.0, 1.0).all()


def test_huge_single_line_document_is_scored_from_its_first_max_chars(trained):
    model, _ = trained
    huge = ("buy now cheap " * 2_000_000)[:20_000_000]
    docs = scored_input().head(1).with_columns(text=pl.lit(huge))
    out = q.QualityScorer(model, threshold=0.5).run(docs)
    assert out.rejects["rule"].to_list() == ["quality/below_threshold"]
    assert out.stats.bytes_in == 20_000_000
