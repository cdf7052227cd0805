"""The quality classifier: hashed word n-grams and text-shape signals into a logistic regression,
trained in the pipeline (docs/quality.md).

The fastText / DCLM idea with the smallest model that carries it: lower-cased `\\w+` words, their
unigrams and bigrams (up to `ngram`), each hashed into one of `num_features` buckets, plus
SHAPE_SIGNALS signals of the text's shape that do not depend on its language or script (words a
line, lines ending a sentence, repeated lines, distinct words, the commonest word's share, letters,
digits, length, short lines, broken characters), each binned into one of SHAPE_BINS rows after the
n-gram buckets. A document's logit is the mean of its n-gram weights plus the sum of its shape
weights plus a bias, squashed by a sigmoid. Curated buckets (books, wiki) are the positive class,
raw web the negative one; each language weighs its two classes equally and a language with one
class only does not train (`class_weights`), so neither language nor source can be the signal.

Broken text (U+FFFD replacement characters or UTF-8 read as Latin-1, at least BROKEN_RULE of
the text's characters) scores 0 whatever the model says: a rule before the classifier.

Hashing is our own (blake2b of each distinct word, then a fixed 64-bit mix for n-grams), never
Python's salted `hash()` or a library hash that may change between versions, so a saved model
scores the same features in any process.

Training is torch (an `EmbeddingBag` of width 1 and `torch.optim.Adagrad`, which suits sparse
features), seeded and run with `torch.use_deterministic_algorithms`: the same documents, config and
seed give the same weights and therefore the same model file bytes. The held-out set is chosen by a
hash of each doc_id, so it does not depend on the order documents arrive in. Training streams: it
reads the documents in slices of FEATURIZE_DOCS, spills their hashed features to a temporary file
and trains on one chunk of at most `chunk_bytes` of features at a time, so its memory is bounded by
those two and by `max_docs_per_class` (a few small columns per chosen document), never by the
corpus (`train_quality_model`).

`QualityScorer` scores a table in batches (one featurization and one `EmbeddingBag` call per
batch, not one per document), adds `quality_score`, and drops documents below the threshold with
reason `quality/below_threshold` (value: the score). Documents without text are dropped as
`quality/empty_text`. Sources that skip the quality stage are scored but never dropped on score.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import polars as pl

from refinery.config import QualityConfig
from refinery.stages.base import Outcome, RecordStage, StageOutput
from refinery.models import quality_metrics as qm
from refinery.stages.parquet_batches import batch_spans
from refinery.stages.stats import Drop, StageStats, count_in_out, rejects_frame
from refinery.hashing import GOLDEN_GAMMA, splitmix64_finalizer
from refinery.layout import QUALITY_MODEL_DIR
from refinery.storage import DataRoot

MODEL_FORMAT = 2
LATEST_KEY = f"{QUALITY_MODEL_DIR}/latest.json"
WORD_PATTERN = r"\w+"
# The shape signals count a Han, Hiragana or Katakana character as a word (those scripts write no
# spaces), any other run of word characters as one word, so words a line mean the same in any script.
SHAPE_WORD = r"[\p{Han}\p{Hiragana}\p{Katakana}]|\w+"
# A line ending a sentence, in Latin, Cyrillic, Greek and CJK punctuation (closing quotes allowed).
SENTENCE_END = r"[.!?;:\u3002\uff01\uff1f\uff1b\uff1a\u2026][\"'\u201d\u2019\u00bb)\]\u300d\u300f\uff09]*$"
# A replacement character, or a UTF-8 sequence read as Latin-1 / cp1252 ("Ã©", "Â ", "â€™").
BROKEN_CHARS = ("\ufffd|\u00c3[\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u2013-\u203a"
                "\u20ac\u2122]|\u00c2[\u00a0-\u00bf]|\u00e2\u20ac")
SHAPE_SIGNALS = 10
SHAPE_BINS = 8
SHAPE_ROWS = SHAPE_SIGNALS * SHAPE_BINS
BROKEN_SIGNAL = 9  # the signal holding the broken-character share
# The rule before the classifier: a text whose broken characters are at least 0.2% of its
# non-space characters scores 0. Clean text has none; UTF-8 read as Latin-1 turns every accented
# letter into a pair (German prose: about 1% of its characters); one stray U+FFFD in a page stays
# under it.
BROKEN_RULE = 0.002
SCORE_BATCH_DOCS = 2048
# Bytes of text (each document's first `max_chars` characters) featurized at once when scoring: the
# hashed features and EmbeddingBag's int64 work arrays are a few times these, whatever the documents.
SCORE_BATCH_BYTES = 8 << 20
TRAIN_BATCH_DOCS = 32
# Training reads and featurizes at most this many documents at once: with `max_chars` 100k, a
# slice's text and word table stay within tens of MB however large the corpus.
FEATURIZE_DOCS = 256
# The hashed features training holds in memory at once, unless told: stages.quality's default.
DEFAULT_CHUNK_BYTES = QualityConfig.model_fields["train_chunk_mb"].default << 20

# A function that starts a fresh pass over the training documents (tables with doc_id, bucket and
# text) each time it is called: training reads them twice.
DocumentBatches = Callable[[], Iterable[pl.DataFrame]]

_MIX_MUL = np.uint64(GOLDEN_GAMMA)


class NoTrainingData(ValueError):
    """One class has no documents to learn from."""


# --------------------------------------------------------------------------------------------------
# Features
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Features:
    """Hashed n-gram buckets of a batch of documents in CSR form: document i owns
    `indices[indptr[i]:indptr[i+1]]`."""

    indices: np.ndarray  # bucket ids: int64, or int32 as read back from a FeatureSpill
    indptr: np.ndarray  # int64, len = documents + 1

    @property
    def num_docs(self) -> int:
        return len(self.indptr) - 1

    def rows(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The `(indices, offsets, per_sample_weights)` a sum-mode EmbeddingBag takes, for the
        documents `docs` in that order: each document's SHAPE_SIGNALS shape rows weigh 1, its n-grams
        1/n each (their mean)."""
        starts, ends = self.indptr[docs], self.indptr[docs + 1]
        lengths = ends - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        parts = [self.indices[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
        indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        position = np.arange(len(indices), dtype=np.int64) - np.repeat(offsets, lengths)
        grams = np.repeat(np.maximum(lengths - SHAPE_SIGNALS, 1), lengths).astype(np.float32)
        weights = np.where(position < SHAPE_SIGNALS, np.float32(1.0), np.float32(1.0) / grams)
        return indices.astype(np.int64, copy=False), offsets, weights.astype(np.float32, copy=False)

    def broken(self) -> np.ndarray:
        """True for documents over the broken-text rule, read from their broken-character shape row."""
        row = self.indices[self.indptr[:-1] + BROKEN_SIGNAL].astype(np.int64)
        return row % SHAPE_BINS >= BROKEN_RULE_BIN


def _word_hashes(words: pl.Series) -> np.ndarray:
    """A stable 64-bit hash per word; each distinct word is hashed once."""
    frame = words.to_frame("w")
    distinct = frame.unique(maintain_order=True).with_row_index("wid")
    ids = frame.join(distinct, on="w", how="left", maintain_order="left")["wid"].to_numpy()
    table = np.fromiter(
        (int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little") for w in distinct["w"]),
        dtype=np.uint64,
        count=distinct.height,
    )
    return table[ids]


def _bins(values: np.ndarray, edges: list[float]) -> np.ndarray:
    return np.searchsorted(np.asarray(edges, dtype=np.float64), values, side="right").astype(np.int64)


# Bin edges of each shape signal (SHAPE_BINS - 1 edges each; signal BROKEN_SIGNAL's bin 3 starts
# at BROKEN_RULE).
_FRACTION_EDGES = [0.05, 0.15, 0.3, 0.5, 0.7, 0.85, 0.95]
_SHAPE_EDGES = [
    [1.5, 2.5, 4, 6, 9, 14, 22],  # words a line
    _FRACTION_EDGES,  # share of lines ending a sentence
    [0.001, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7],  # share of lines repeating an earlier line
    [0.1, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8],  # distinct words / words
    [0.02, 0.04, 0.07, 0.1, 0.15, 0.25, 0.4],  # the commonest word's share of words
    [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95],  # letters / non-space characters
    [0.01, 0.03, 0.06, 0.1, 0.15, 0.25, 0.4],  # digits / non-space characters
    [20, 50, 100, 200, 400, 800, 1600],  # words
    _FRACTION_EDGES,  # share of lines of at most three words
    [1e-9, 0.001, BROKEN_RULE, 0.01, 0.03, 0.1, 0.3],  # broken characters / non-space characters
]
BROKEN_RULE_BIN = 3


def shape_rows(texts: pl.Series, num_features: int, max_chars: int) -> np.ndarray:
    """[documents, SHAPE_SIGNALS] feature rows (after the `num_features` n-gram buckets) of the
    binned shape signals of each text's first `max_chars` characters."""
    text = texts.cast(pl.String).fill_null("").str.slice(0, max_chars)
    lines = text.str.split("\n").list.eval(pl.element().str.strip_chars().filter(pl.element().str.strip_chars() != ""))
    words = text.str.to_lowercase().str.extract_all(SHAPE_WORD)
    columns = {
        "n_lines": lines.list.len(),
        "ends": lines.list.eval(pl.element().str.contains(SENTENCE_END)).list.sum(),
        "repeats": lines.list.eval(pl.element().is_first_distinct().not_()).list.sum(),
        "short": lines.list.eval(pl.element().str.count_matches(SHAPE_WORD) <= 3).list.sum(),
        "n_words": words.list.len(),
        "distinct": words.list.n_unique(),
        "top": words.list.eval(pl.element().value_counts().struct.field("count").max()).list.first(),
        # Letters and non-space characters are most of a text: counted as what is left once the
        # rest is removed, or by subtraction, not match by match (2-3x less CPU).
        "letters": text.str.replace_all(r"[^\p{L}]+", "").str.len_chars(),
        "digits": text.str.count_matches(r"\d"),
        "nonspace": text.str.len_chars() - text.str.count_matches(r"\s"),
        "broken": text.str.count_matches(BROKEN_CHARS),
    }
    f = {c: v.fill_null(0).to_numpy().astype(np.float64) for c, v in columns.items()}
    lines_n, words_n, chars_n = np.maximum(f["n_lines"], 1), np.maximum(f["n_words"], 1), np.maximum(f["nonspace"], 1)
    signals = [f["n_words"] / lines_n, f["ends"] / lines_n, f["repeats"] / lines_n, f["distinct"] / words_n,
               f["top"] / words_n, f["letters"] / chars_n, f["digits"] / chars_n, f["n_words"],
               f["short"] / lines_n, f["broken"] / chars_n]
    rows = np.stack([num_features + k * SHAPE_BINS + _bins(v, _SHAPE_EDGES[k]) for k, v in enumerate(signals)], axis=1)
    return rows.reshape(len(texts), SHAPE_SIGNALS)


def hash_features(texts: pl.Series, num_features: int, ngram: int, max_chars: int) -> Features:
    """Each text's SHAPE_SIGNALS shape rows (`shape_rows`), then its word 1..ngram-grams (null
    counts as empty, only the first `max_chars` characters are read) hashed into `num_features`
    buckets."""
    words_per_doc = (
        texts.cast(pl.String).fill_null("").str.slice(0, max_chars).str.to_lowercase().str.extract_all(WORD_PATTERN)
    )
    lengths = words_per_doc.list.len().fill_null(0).to_numpy().astype(np.int64)
    words = words_per_doc.explode().drop_nulls()
    hashes = _word_hashes(words) if len(words) else np.zeros(0, dtype=np.uint64)
    doc_of_word = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)

    num_docs = len(lengths)
    docs_parts, bucket_parts = [], []
    with np.errstate(over="ignore"):
        for n in range(1, ngram + 1):
            count = len(hashes) - n + 1
            if count <= 0:
                break
            same_doc = doc_of_word[:count] == doc_of_word[n - 1 :]
            gram = hashes[:count].copy()
            for k in range(1, n):
                gram = gram * _MIX_MUL + hashes[k : k + count]
            # The finalizer spreads the combined hash over all 64 bits before the modulo.
            gram = splitmix64_finalizer(gram ^ np.uint64(n))[same_doc]
            docs_parts.append(doc_of_word[:count][same_doc])
            bucket_parts.append(_bucket(gram, num_features))
    # Each part is already in document order; place it after the earlier parts' n-grams of the
    # same document (unigrams, then bigrams, ...) instead of sorting the concatenation.
    part_counts = [np.bincount(d, minlength=num_docs) for d in docs_parts]
    counts = np.sum(part_counts, axis=0) if part_counts else np.zeros(num_docs, dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(counts + SHAPE_SIGNALS)]).astype(np.int64)
    indices = np.empty(int(indptr[-1]), dtype=np.int64)
    shape_at = indptr[:-1, None] + np.arange(SHAPE_SIGNALS)
    indices[shape_at.ravel()] = shape_rows(texts, num_features, max_chars).ravel()
    filled = indptr[:-1] + SHAPE_SIGNALS
    for doc_ids, buckets, part in zip(docs_parts, bucket_parts, part_counts):
        first_in_part = np.cumsum(part) - part
        indices[filled[doc_ids] + np.arange(len(doc_ids)) - first_in_part[doc_ids]] = buckets
        filled += part
    return Features(indices=indices, indptr=indptr)


def _bucket(h: np.ndarray, num_features: int) -> np.ndarray:
    if num_features & (num_features - 1) == 0:
        return (h & np.uint64(num_features - 1)).astype(np.int64)
    return (h % np.uint64(num_features)).astype(np.int64)


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


@contextmanager
def reproducible_torch() -> Iterator[None]:
    """Deterministic algorithms on one intra-op thread, restored on exit. One thread because the
    ops are small: on the shared 2-core machine, training the sample's classifier took 11 s with
    two threads and 2.2 s with one, and the weights are the same bytes either way."""
    import torch

    previous = (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.set_num_threads(previous[1])


@dataclass
class QualityModel:
    """Hashed-n-gram and shape logistic regression. `weight` has one value per n-gram bucket, then
    one per shape row."""

    weight: Any  # torch.Tensor [num_features + SHAPE_ROWS]
    bias: Any  # torch.Tensor [] (a scalar)
    num_features: int
    ngram: int
    max_chars: int

    def _bag(self):
        import torch

        bag = torch.nn.EmbeddingBag(self.num_features + SHAPE_ROWS, 1, mode="sum")
        with torch.no_grad():
            bag.weight.copy_(self.weight.view(-1, 1))
        return bag

    def score(self, texts: pl.Series, batch_docs: int = SCORE_BATCH_DOCS,
              batch_bytes: int = SCORE_BATCH_BYTES) -> np.ndarray:
        """Probability of the positive (curated) class for every text, as float64, in batches of
        `batch_docs` documents. A batch is featurized and bagged in pieces of at most `batch_bytes`
        bytes of what is read of its texts (their first `max_chars` characters), then squashed as
        one vector: a score depends on its batch of documents (torch's vectorized sigmoid and its
        scalar tail differ in the last bit), never on the byte bound."""
        import torch

        bag = self._bag()
        out = np.empty(len(texts), dtype=np.float64)
        read = np.minimum(texts.cast(pl.String).str.len_bytes().fill_null(0).to_numpy(), 4 * self.max_chars)
        with torch.no_grad(), reproducible_torch():
            for start in range(0, len(texts), batch_docs):
                count = min(batch_docs, len(texts) - start)
                pieces = [hash_features(texts.slice(start + first, n), self.num_features, self.ngram, self.max_chars)
                          for first, n in batch_spans(read[start:start + count].astype(np.int64), count, batch_bytes)]
                logits = torch.cat([torch.zeros(0)] + [self._logits(bag, feats) for feats in pieces])
                broken = np.concatenate([np.zeros(0, dtype=bool)] + [feats.broken() for feats in pieces])
                # The rule before the classifier: broken text scores 0.
                out[start : start + count] = np.where(broken, 0.0, torch.sigmoid(logits).double().numpy())
        return out

    def score_features(self, feats: Features, batch_docs: int = SCORE_BATCH_DOCS) -> np.ndarray:
        """`score` of documents already featurized (with this model's num_features, ngram and
        max_chars), `batch_docs` at a time: EmbeddingBag's int64 work arrays are several times
        the int32 features, so a whole chunk at once would cost several chunks of memory."""
        import torch

        bag = self._bag()
        with torch.no_grad(), reproducible_torch():
            return np.concatenate([np.zeros(0)] + [
                self._probabilities(bag, feats, np.arange(start, min(start + batch_docs, feats.num_docs)))
                for start in range(0, feats.num_docs, batch_docs)
            ])

    def _probabilities(self, bag, feats: Features, docs: np.ndarray) -> np.ndarray:
        import torch

        indices, offsets, weights = feats.rows(docs)
        logits = bag(torch.from_numpy(indices), torch.from_numpy(offsets), torch.from_numpy(weights)).view(-1) + self.bias
        # The rule before the classifier: broken text scores 0.
        return np.where(feats.broken()[docs], 0.0, torch.sigmoid(logits).double().numpy())

    def _logits(self, bag, feats: Features):
        """Every featurized document's logit (float32 tensor), before the sigmoid."""
        import torch

        indices, offsets, weights = feats.rows(np.arange(feats.num_docs))
        return bag(torch.from_numpy(indices), torch.from_numpy(offsets), torch.from_numpy(weights)).view(-1) + self.bias

    # ---- file format --------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        import torch

        buf = io.BytesIO()
        torch.save(
            {
                "format": MODEL_FORMAT,
                "weight": self.weight.detach().contiguous(),
                "bias": self.bias.detach().reshape(()),
                "num_features": self.num_features,
                "ngram": self.ngram,
                "max_chars": self.max_chars,
                "word_pattern": WORD_PATTERN,
            },
            buf,
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "QualityModel":
        import torch

        state = torch.load(io.BytesIO(data), weights_only=True)
        if state.get("format") != MODEL_FORMAT or state.get("word_pattern") != WORD_PATTERN:
            raise ValueError(
                f"quality model format {state.get('format')!r} is not {MODEL_FORMAT}; "
                "re-materialize quality_model to retrain it with this code"
            )
        return cls(state["weight"], state["bias"], state["num_features"], state["ngram"], state["max_chars"])


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def doc_hash_fraction(doc_ids: pl.Series, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per doc_id, fixed by the id and the seed alone."""
    return np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(f"{seed}:{d}".encode(), digest_size=8).digest(), "little") / 2**64
            for d in doc_ids
        ),
        dtype=np.float64,
        count=len(doc_ids),
    )


def split_holdout(labels: np.ndarray, keys: np.ndarray, fraction: float) -> np.ndarray:
    """True for held-out rows: in each class, the round(fraction * n) rows with the smallest keys
    (at least one when the class has two or more documents, so accuracy covers both classes)."""
    holdout = np.zeros(len(labels), dtype=bool)
    for cls in (0, 1):
        rows = np.flatnonzero(labels == cls)
        n = len(rows)
        take = min(max(1, round(fraction * n)), n - 1) if n >= 2 else 0
        holdout[rows[np.argsort(keys[rows], kind="stable")[:take]]] = True
    return holdout


@dataclass
class TrainingReport:
    """What training chose and how the model did on held-out documents (`quality_metrics.evaluate`)."""

    accuracy: float | None
    precision: float | None
    recall: float | None
    f1: float | None
    auc: float | None
    metrics: dict[str, Any]  # quality_metrics.evaluate: per language, shares, the labelled check, flags
    train_by_bucket: dict[str, int]
    holdout_by_bucket: dict[str, int]
    train_by_language: dict[str, dict[str, int]]  # language -> {"positive": n, "negative": n}
    untrained_languages: list[str]  # languages with one class only: they carry no training weight
    train_positive: int
    train_negative: int
    holdout_size: int
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in vars(self).items()}


def class_weights(languages: pl.Series, labels: np.ndarray) -> tuple[np.ndarray, dict[str, dict[str, int]], list[str]]:
    """A loss weight per training document such that, within each language, the two classes weigh
    the same (each as much as the smaller one's count) and a language with one class weighs nothing:
    a language seen only as web, or only as curated, cannot become the signal. Weights average 1
    over the weighted documents. Also returns each language's class counts and the untrained ones."""
    frame = pl.DataFrame({"language": languages.fill_null(qm.UNKNOWN_LANGUAGE), "label": labels})
    counts = frame.group_by("language").agg(positive=(pl.col("label") == 1).sum(), negative=(pl.col("label") != 1).sum())
    per_language = {lang: {"positive": int(pos), "negative": int(neg)} for lang, pos, neg in counts.sort("language").iter_rows()}
    weights = frame.join(counts, on="language", how="left", maintain_order="left").select(
        pl.min_horizontal("positive", "negative") / pl.when(pl.col("label") == 1).then("positive").otherwise("negative")
    ).to_series().to_numpy().astype(np.float64)
    if weights.sum() > 0:
        weights *= np.count_nonzero(weights) / weights.sum()
    untrained = [lang for lang, c in per_language.items() if min(c.values()) == 0]
    return weights.astype(np.float32), per_language, untrained


def _labelled(index: pl.DataFrame, positive: list[str], negative: list[str], seed: int) -> pl.DataFrame:
    """The rows of a text index (doc_id, bucket, chars) that can train: with text, in a positive
    (label 1) or negative (label 0) bucket; adds `label` and `_key` (the doc_id hash)."""
    labelled = index.filter(pl.col("bucket").is_in(positive + negative) & (pl.col("chars") > 0))
    if "language" not in labelled.columns:
        labelled = labelled.with_columns(language=pl.lit(None, dtype=pl.String))
    return labelled.with_columns(label=pl.col("bucket").is_in(positive).cast(pl.Int8),
                                 _key=pl.Series(doc_hash_fraction(labelled["doc_id"], seed), dtype=pl.Float64))


def _cap_per_class(labelled: pl.DataFrame, max_docs_per_class: int) -> pl.DataFrame:
    """Each class's `max_docs_per_class` smallest `_key`s (ties by doc_id), sorted by doc_id. The
    choice depends on the set of rows alone, so capping batch by batch chooses what capping the
    whole table at once does."""
    ranked = labelled.sort("_key", "doc_id")
    return ranked.filter(pl.int_range(pl.len()).over("label") < max_docs_per_class).sort("doc_id")


def _require_both_classes(chosen: pl.DataFrame, positive: list[str], negative: list[str]) -> None:
    for label, field, buckets in ((1, "positive_buckets", positive), (0, "negative_buckets", negative)):
        if chosen.filter(pl.col("label") == label).height == 0:
            raise NoTrainingData(
                f"quality classifier: no documents with text in stages.quality.{field} {buckets}; "
                f"add a source in one of those buckets, or point stages.quality.{field} at buckets that have "
                "documents, or set stages.quality.enabled: false to run without a classifier"
            )


def training_set(
    index: pl.DataFrame, positive: list[str], negative: list[str], max_docs_per_class: int, seed: int
) -> pl.DataFrame:
    """Which documents train the classifier, from an index with columns doc_id, bucket and chars
    (text length): those with text in a positive (label 1) or negative (label 0) bucket, at most
    `max_docs_per_class` per class (the smallest doc_id hashes), sorted by doc_id. Adds `label` and
    `_key` (the hash). Raises NoTrainingData naming the config field when a class is empty."""
    chosen = _cap_per_class(_labelled(index, positive, negative, seed), max_docs_per_class)
    _require_both_classes(chosen, positive, negative)
    return chosen


def text_index(docs: pl.DataFrame) -> pl.DataFrame:
    """doc_id, bucket, language (null when the table has none) and chars of a document table: what
    `training_set` chooses from."""
    language = pl.col("language").cast(pl.String) if "language" in docs.columns else pl.lit(None, dtype=pl.String)
    return docs.select("doc_id", "bucket", language=language, chars=pl.col("text").str.len_chars().fill_null(0))


def _bounded(batches: Iterable[pl.DataFrame]) -> Iterator[pl.DataFrame]:
    """The tables cut into slices of at most FEATURIZE_DOCS rows."""
    for batch in batches:
        yield from batch.iter_slices(FEATURIZE_DOCS)


def streamed_training_set(
    read: DocumentBatches, positive: list[str], negative: list[str], max_docs_per_class: int, seed: int
) -> pl.DataFrame:
    """`training_set` over one pass of `read`, holding the chosen rows so far plus at most about as
    many candidates: memory grows with `max_docs_per_class`, never with the corpus."""
    chosen = _labelled(pl.DataFrame(schema={"doc_id": pl.String, "bucket": pl.String, "language": pl.String,
                                            "chars": pl.UInt32}),
                       positive, negative, seed)
    pending: list[pl.DataFrame] = []
    pending_rows = 0
    for batch in _bounded(read()):
        candidates = _labelled(text_index(batch), positive, negative, seed)
        pending.append(candidates)
        pending_rows += candidates.height
        if pending_rows >= 2 * max_docs_per_class:
            chosen, pending, pending_rows = _cap_per_class(pl.concat([chosen, *pending]), max_docs_per_class), [], 0
    chosen = _cap_per_class(pl.concat([chosen, *pending]), max_docs_per_class)
    _require_both_classes(chosen, positive, negative)
    return chosen


class FeatureSpill:
    """The training documents' hashed features (int32 bucket ids) in one file on local disk,
    appended in the order documents are read and read back one chunk of documents at a time, so
    the whole training set's features are never in memory together."""

    def __init__(self, directory: str):
        self.file = open(f"{directory}/features.i32", "w+b")
        self.items = 0

    def append(self, feats: Features) -> np.ndarray:
        """Write a batch's features; returns where each of its documents starts, in items."""
        self.file.write(feats.indices.astype(np.int32).tobytes())
        starts = self.items + feats.indptr[:-1]
        self.items += len(feats.indices)
        return starts

    def read(self, starts: np.ndarray, lengths: np.ndarray) -> Features:
        """The documents at `starts` (with `lengths` items each), in that order, as Features."""
        self.file.flush()
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        indices = np.empty(int(indptr[-1]), dtype=np.int32)
        fd = self.file.fileno()
        for pos in np.argsort(starts, kind="stable").tolist():  # file order: sequential reads
            if lengths[pos]:
                os.preadv(fd, [indices[indptr[pos] : indptr[pos + 1]]], int(starts[pos]) * 4)
        return Features(indices=indices, indptr=indptr)

    def close(self) -> None:
        self.file.close()


def chunk_bounds(lengths: np.ndarray, chunk_bytes: int) -> list[tuple[int, int]]:
    """Consecutive [start, end) runs of documents whose features (4 bytes an item, as
    `FeatureSpill.read` returns them) stay within `chunk_bytes`; a document larger than that is a
    chunk of its own."""
    bounds, start, held = [], 0, 0
    for i, n in enumerate((lengths * 4).tolist()):
        if i > start and held + n > chunk_bytes:
            bounds.append((start, i))
            start, held = i, 0
        held += n
    if start < len(lengths):
        bounds.append((start, len(lengths)))
    return bounds


def train_quality_model(
    docs: pl.DataFrame | DocumentBatches,
    positive: list[str],
    negative: list[str],
    *,
    num_features: int,
    ngram: int,
    epochs: int,
    learning_rate: float,
    holdout_fraction: float,
    max_chars: int,
    max_docs_per_class: int,
    seed: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    threshold: float = 0.5,
) -> tuple[QualityModel, TrainingReport]:
    """Fit the classifier on `docs` (columns doc_id, bucket, text: one table, or a function that
    starts a fresh pass over tables each call) and measure it on a held-out slice chosen by doc_id
    hash. Each class keeps at most `max_docs_per_class` documents, the ones with the smallest
    doc_id hashes. Within each language the two classes weigh the same in the loss, and a language
    with one class does not train (`class_weights`; a table without a language column is one
    language). The held-out documents are measured at `threshold` (`quality_metrics.evaluate`).

    Memory is bounded, not proportional to the corpus: pass 1 reads the documents FEATURIZE_DOCS
    at a time and keeps only the chosen doc_ids (`streamed_training_set`); pass 2 reads them again,
    featurizes each slice and spills the features to a temporary file (`FeatureSpill`, under
    TMPDIR); every epoch then loads one chunk of at most `chunk_bytes` of features at a time.

    Deterministic: the result depends on the set of documents, never on the order of the tables or
    where a batch ends. The chosen set and the held-out split come from doc_id hashes; the training
    documents are ranked by hash (ties by doc_id) and cut into chunks by feature bytes in that
    rank order; each epoch visits the chunks, and the documents within a chunk, in an order drawn
    from a generator seeded with `seed`; torch runs deterministic algorithms on one thread."""
    import torch

    start = time.perf_counter()
    read = (lambda: [docs]) if isinstance(docs, pl.DataFrame) else docs
    chosen = streamed_training_set(read, positive, negative, max_docs_per_class, seed)
    holdout = split_holdout(chosen["label"].to_numpy(), chosen["_key"].to_numpy(), holdout_fraction)
    # `slot`: a document's place in rank order among the training (or the held-out) documents.
    plan = chosen.with_columns(holdout=pl.Series(holdout)).sort("_key", "doc_id").with_columns(
        slot=pl.int_range(pl.len()).over("holdout"))
    train_plan, held_plan = plan.filter(~pl.col("holdout")), plan.filter(pl.col("holdout"))
    starts = {False: np.zeros(train_plan.height, np.int64), True: np.zeros(held_plan.height, np.int64)}
    lengths = {False: np.zeros(train_plan.height, np.int64), True: np.zeros(held_plan.height, np.int64)}
    targets = torch.from_numpy(train_plan["label"].to_numpy().astype(np.float32))
    n_pos = int(train_plan["label"].sum())
    n_neg = train_plan.height - n_pos
    weights, per_language, untrained = class_weights(train_plan["language"], train_plan["label"].to_numpy())
    sample_weights = torch.from_numpy(weights)

    with tempfile.TemporaryDirectory(prefix="quality-features-") as spill_dir:
        spill = FeatureSpill(spill_dir)
        try:
            wanted = plan.select("doc_id", "holdout", "slot")
            for batch in _bounded(read()):
                rows = batch.select("doc_id", "text").join(wanted, on="doc_id", how="inner", maintain_order="left")
                if rows.height == 0:
                    continue
                feats = hash_features(rows["text"], num_features, ngram, max_chars)
                first = spill.append(feats)
                for held in (False, True):
                    mine = (rows["holdout"] == held).to_numpy()
                    slots = rows["slot"].to_numpy()[mine]
                    starts[held][slots] = first[mine]
                    lengths[held][slots] = np.diff(feats.indptr)[mine]

            # The sparse gradients come from EmbeddingBag itself, so torch's invariant checks are
            # skipped explicitly (they only warn that they are off).
            with reproducible_torch(), torch.sparse.check_sparse_tensor_invariants(enable=False):
                generator = torch.Generator().manual_seed(seed)
                # Sparse gradients: each step touches only the buckets of its batch's documents.
                bag = torch.nn.EmbeddingBag(num_features + SHAPE_ROWS, 1, mode="sum", sparse=True)
                bias = torch.nn.Parameter(torch.zeros(()))
                with torch.no_grad():
                    bag.weight.zero_()
                optimizer = torch.optim.Adagrad([bag.weight, bias], lr=learning_rate)
                # Per-document weights (class_weights): curated buckets are usually much smaller
                # than web, and languages differ in what each class holds.
                loss_fn = torch.nn.BCEWithLogitsLoss(reduction="none")
                chunks = chunk_bounds(lengths[False], chunk_bytes)
                for _ in range(epochs):
                    for c in torch.randperm(len(chunks), generator=generator).tolist():
                        lo, hi = chunks[c]
                        feats = spill.read(starts[False][lo:hi], lengths[False][lo:hi])
                        order = torch.randperm(hi - lo, generator=generator).numpy()
                        for b in range(0, len(order), TRAIN_BATCH_DOCS):
                            batch = order[b : b + TRAIN_BATCH_DOCS]
                            indices, offsets, per_sample = feats.rows(batch)
                            logits = bag(torch.from_numpy(indices), torch.from_numpy(offsets),
                                         torch.from_numpy(per_sample)).view(-1) + bias
                            rows = torch.from_numpy(batch + lo)
                            loss = (loss_fn(logits, targets[rows]) * sample_weights[rows]).sum() / len(batch)
                            optimizer.zero_grad()
                            loss.backward()
                            optimizer.step()

            model = QualityModel(bag.weight.detach().view(-1).clone(), bias.detach().clone(), num_features, ngram,
                                 max_chars)
            held_scores = np.concatenate([np.zeros(0)] + [
                model.score_features(spill.read(starts[True][lo:hi], lengths[True][lo:hi]))
                for lo, hi in chunk_bounds(lengths[True], chunk_bytes)
            ])
        finally:
            spill.close()
    metrics = qm.evaluate(held_plan.select("bucket", "language", "label").with_columns(score=pl.Series(held_scores)),
                          threshold)
    holdout = metrics["holdout"]

    def by_bucket(part: pl.DataFrame) -> dict[str, int]:
        return dict(part.group_by("bucket").len().sort("bucket").iter_rows())

    report = TrainingReport(
        accuracy=holdout["accuracy"],
        precision=holdout["precision"],
        recall=holdout["recall"],
        f1=holdout["f1"],
        auc=holdout["auc"],
        metrics=metrics,
        train_by_bucket=by_bucket(train_plan),
        holdout_by_bucket=by_bucket(held_plan),
        train_by_language=per_language,
        untrained_languages=untrained,
        train_positive=n_pos,
        train_negative=n_neg,
        holdout_size=held_plan.height,
        wall_s=time.perf_counter() - start,
    )
    return model, report


def publish_model(root: DataRoot, model: QualityModel, report: TrainingReport, settings: dict[str, Any]) -> dict[str, Any]:
    """Write `models/quality/quality-<hash>.pt` (hash: the first 16 hex digits of the file's
    sha256), then point `models/quality/latest.json` at it. Both writes are atomic, and the
    pointer moves only after the model file is complete. Returns the pointer."""
    data = model.to_bytes()
    sha = hashlib.sha256(data).hexdigest()
    key = f"{QUALITY_MODEL_DIR}/quality-{sha[:16]}.pt"
    root.write_bytes(key, data)
    pointer = {
        "model_key": key,
        "model_hash": sha[:16],
        "sha256": sha,
        "format": MODEL_FORMAT,
        "features": {"num_features": model.num_features, "ngram": model.ngram, "max_chars": model.max_chars,
                     "word_pattern": WORD_PATTERN},
        "settings": settings,
        **{k: v for k, v in report.to_dict().items() if k != "wall_s"},
    }
    root.write_json(LATEST_KEY, pointer)
    return pointer


def load_published_model(root: DataRoot) -> tuple[QualityModel, dict[str, Any]]:
    """The model `latest.json` points at, checked against the sha256 recorded there."""
    if not root.exists(LATEST_KEY):
        raise FileNotFoundError(f"{root.display(LATEST_KEY)}: no quality model yet; materialize quality_model first")
    pointer = root.read_json(LATEST_KEY)
    data = root.read_bytes(pointer["model_key"])
    if hashlib.sha256(data).hexdigest() != pointer["sha256"]:
        raise ValueError(
            f"{root.display(pointer['model_key'])}: content does not match the sha256 in {LATEST_KEY}; "
            "re-materialize quality_model"
        )
    return QualityModel.from_bytes(data), pointer


# --------------------------------------------------------------------------------------------------
# Scoring stage
# --------------------------------------------------------------------------------------------------


def unscored(docs: pl.DataFrame) -> StageOutput:
    """quality_scored with the classifier disabled: every document kept, `quality_score` null."""
    stats = StageStats(stage=QualityScorer.name)
    out = docs.with_columns(quality_score=pl.lit(None, dtype=pl.Float64))
    count_in_out(stats, docs, out)
    stats.counters["quality/disabled"] = docs.height
    return StageOutput(out, rejects_frame(docs, QualityScorer.name, {}), stats)


SCORED_PREFIX = "quality/scored_by_language/"
ABOVE_PREFIX = "quality/above_threshold_by_language/"


def shares_above_threshold(counters: dict[str, int]) -> dict[str, float]:
    """Per language, the share of its scored documents at or above the decision threshold, from the
    scorer's counters (summed over files)."""
    return {k[len(SCORED_PREFIX):]: round(counters.get(ABOVE_PREFIX + k[len(SCORED_PREFIX):], 0) / v, 6)
            for k, v in sorted(counters.items()) if k.startswith(SCORED_PREFIX) and v}


class QualityScorer(RecordStage):
    """Adds `quality_score` to every document and drops those below `threshold`, unless
    `enforce_threshold` is off. A source that skips "quality" gets the scores without the drops."""

    name = "quality_scored"
    family = "quality"
    skip_key = "quality"
    writes = {"quality_score": pl.Float64()}
    batch_size = SCORE_BATCH_DOCS
    # No byte cut here: `QualityModel.score` bounds the featurization by bytes, and a score depends
    # on its batch of documents (see there), so batches stay SCORE_BATCH_DOCS documents.
    batch_bytes = None

    def __init__(self, model: QualityModel, threshold: float, enforce_threshold: bool = True, model_id: str = ""):
        self.model = model
        self.threshold = threshold
        self.decision_threshold = qm.decision_threshold(threshold)
        self.enforce_threshold = enforce_threshold
        self.model_id = model_id

    def config_summary(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "threshold_enforced": self.enforce_threshold,
            "model": self.model_id,
            "num_features": self.model.num_features,
            "ngram": self.model.ngram,
        }

    def judge(self, text: str | None, score: float, counters: Counter, language: str | None = None) -> Outcome:
        if not text:
            return Drop("quality/empty_text", None, "no text to score")
        counters["quality/scored"] += 1
        # Per language: scored, and at or above the decision threshold (shares_above_threshold).
        lang = language or qm.UNKNOWN_LANGUAGE
        counters[f"{SCORED_PREFIX}{lang}"] += 1
        counters[f"{ABOVE_PREFIX}{lang}"] += score >= self.decision_threshold
        if score < self.threshold:
            if self.enforce_threshold:
                return Drop("quality/below_threshold", score, f"threshold {self.threshold}")
            counters["quality/below_threshold_kept_by_skip"] += 1
        return {"quality_score": score}

    def process(self, record: dict[str, Any], counters: Counter) -> Outcome:
        text = record["text"]
        score = float(self.model.score(pl.Series([text], dtype=pl.String))[0]) if text else float("nan")
        return self.judge(text, score, counters, record.get("language"))

    def process_batch(self, batch: pl.DataFrame, counters: Counter) -> list[Outcome]:
        # One featurization and one EmbeddingBag call for the whole batch.
        scores = self.model.score(batch["text"]).tolist()
        languages = batch["language"].to_list() if "language" in batch.columns else [None] * batch.height
        return [self.judge(text, score, counters, lang)
                for text, score, lang in zip(batch["text"].to_list(), scores, languages)]

    def skipped(self, docs: pl.DataFrame) -> StageOutput:
        return QualityScorer(self.model, self.threshold, False, self.model_id).run(docs)
