"""The quality classifier: a logistic regression over hashed word n-grams and text-shape signals
(refinery/models/quality_features.py), its model file, and its scoring stage (docs/quality.md).
Training is in quality_fit.py, publishing and loading in quality_training.py.

A document's logit is the mean of its n-gram weights plus the sum of its shape weights plus a bias,
squashed by a sigmoid.

Broken text (U+FFFD replacement characters or UTF-8 read as Latin-1, at least BROKEN_RULE of
the text's characters) scores 0 whatever the model says: a rule before the classifier.

`QualityScorer` scores a table in batches (one featurization and one `EmbeddingBag` call per
batch, not one per document), adds `quality_score`, and drops documents below the threshold with
reason `quality/below_threshold` (value: the score). Documents without text are dropped as
`quality/empty_text`. Sources that skip the quality stage are scored but never dropped on score.
"""

from __future__ import annotations

import io
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import polars as pl

from refinery.models import quality_metrics as qm
from refinery.models.quality_features import SHAPE_ROWS, WORD_PATTERN, Features, hash_features
from refinery.stages.base import Outcome, RecordStage, StageOutput
from refinery.stages.parquet_batches import batch_spans
from refinery.stages.stats import Drop, StageStats, count_in_out, rejects_frame
from refinery.layout import QUALITY_MODEL_DIR

MODEL_FORMAT = 2
LATEST_KEY = f"{QUALITY_MODEL_DIR}/latest.json"
SCORE_BATCH_DOCS = 2048
# Bytes of text (each document's first `max_chars` characters) featurized at once when scoring: the
# hashed features and EmbeddingBag's int64 work arrays are a few times these, whatever the documents.
SCORE_BATCH_BYTES = 8 << 20


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
