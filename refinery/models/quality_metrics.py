"""How well the quality classifier measures quality: ROC AUC, and precision, recall and F1 at a
threshold, overall and per language, on documents it did not train on; whether it only tells two
sources apart; and how much of each language it scores above the threshold (docs/quality.md).

ROC AUC is the Mann-Whitney statistic: the chance that a random positive scores above a random
negative, ties counting one half. It is computed from ranks in O(n log n), exact for any ties.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

# A language gets its own figures when both its classes have at least this many documents.
MIN_LANGUAGE_DOCS = 10
# Buckets the labelled set's documents take in training (refinery/models/quality_training.py).
LABELLED_PREFIX = "labelled/"
LABELLED_BUCKETS = {"high": f"{LABELLED_PREFIX}high", "low": f"{LABELLED_PREFIX}low", "spam": f"{LABELLED_PREFIX}spam"}
UNKNOWN_LANGUAGE = "unknown"


def decision_threshold(threshold: float) -> float:
    """The threshold precision, recall, F1 and shares above it are measured at: stages.quality.threshold,
    or 0.5 (the classifier's own decision) when it is 0 (score without dropping)."""
    return threshold or 0.5


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """P(score of a positive > score of a negative) + P(tie) / 2; None without both classes."""
    labels = np.asarray(labels) == 1
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    # 1-based ranks, tied scores sharing the mean of their ranks
    _, group, counts = np.unique(np.asarray(scores, dtype=np.float64), return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[group]
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def at_threshold(scores: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float | None]:
    """Precision, recall and F1 of "positive when score >= threshold", and accuracy."""
    pred, truth = np.asarray(scores) >= threshold, np.asarray(labels) == 1
    tp = int(np.sum(pred & truth))
    precision = tp / int(pred.sum()) if pred.any() else None
    recall = tp / int(truth.sum()) if truth.any() else None
    if precision is None or recall is None:
        f1 = None
    else:
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    accuracy = float(np.mean(pred == truth)) if len(truth) else None
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": accuracy}


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}


def classification(scores: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, Any]:
    """AUC, the threshold's precision/recall/F1/accuracy, and the class sizes."""
    labels = np.asarray(labels)
    return _rounded({"auc": roc_auc(scores, labels), **at_threshold(scores, labels, threshold),
                     "positives": int((labels == 1).sum()), "negatives": int((labels != 1).sum())})


def by_language(frame: pl.DataFrame, threshold: float) -> dict[str, dict[str, Any]]:
    """`classification` per language of a frame with language, label and score, for the languages
    whose two classes both have MIN_LANGUAGE_DOCS documents."""
    out = {}
    for (lang,), part in frame.with_columns(pl.col("language").fill_null(UNKNOWN_LANGUAGE)).partition_by(
            "language", as_dict=True, maintain_order=True).items():
        labels = part["label"].to_numpy()
        if min(int((labels == 1).sum()), int((labels != 1).sum())) >= MIN_LANGUAGE_DOCS:
            out[str(lang)] = classification(part["score"].to_numpy(), labels, threshold)
    return dict(sorted(out.items()))


def share_above(frame: pl.DataFrame, threshold: float) -> dict[str, float]:
    """Per language, the share of its documents scoring at or above `threshold`."""
    shares = (frame.with_columns(pl.col("language").fill_null(UNKNOWN_LANGUAGE))
              .group_by("language").agg(share=(pl.col("score") >= threshold).mean()).sort("language"))
    return {lang: round(float(v), 6) for lang, v in shares.iter_rows()}


def source_separation(frame: pl.DataFrame, within_bucket_measured: bool) -> list[str]:
    """Warnings on each pair of a positive and a negative bucket (sources) of the held-out documents.
    Without a within-bucket figure (no labelled pages held out), every pair's AUC is the only one
    measured, and it is flagged whatever its value: telling curated from web at 0.98 may be telling
    two sources apart, and says nothing of how pages rank inside web. With one, a pair separated
    perfectly (AUC 1.0) is still flagged."""
    flags = []
    buckets = frame.group_by("bucket", "label").len().sort("bucket")
    positives = [b for b, label, _ in buckets.iter_rows() if label == 1]
    negatives = [b for b, label, _ in buckets.iter_rows() if label != 1]
    for p in positives:
        for n in negatives:
            part = frame.filter(pl.col("bucket").is_in([p, n]))
            auc = roc_auc(part["score"].to_numpy(), part["label"].to_numpy())
            if auc is None or part.height < 2 * 2:
                continue
            if not within_bucket_measured:
                flags.append(f"held-out AUC {auc:.3f} between buckets {p!r} and {n!r} is the only AUC measured: it may "
                             "be the classifier telling these sources apart, and says nothing of how it ranks pages "
                             "within a bucket; train with a labelled set (stages.quality.labelled_set, or "
                             "shipped_labelled_pages: true) to measure that")
            elif auc >= 1.0:
                flags.append(f"held-out AUC 1.0 between buckets {p!r} and {n!r}: the classifier separates these "
                             "sources, not quality; judge it on the within-bucket figure (held-out labelled pages)")
    return flags


def labelled_check(frame: pl.DataFrame, threshold: float) -> dict[str, Any] | None:
    """The classifier on the labelled set's held-out pages: high-value against real low-value pages
    (overall and per language) and against synthetic spam. None without labelled pages."""
    labelled = frame.filter(pl.col("bucket").str.starts_with(LABELLED_PREFIX))
    if labelled.height == 0:
        return None
    out: dict[str, Any] = {}
    for name, negative in (("high_vs_low", LABELLED_BUCKETS["low"]), ("high_vs_spam", LABELLED_BUCKETS["spam"])):
        part = labelled.filter(pl.col("bucket").is_in([LABELLED_BUCKETS["high"], negative]))
        labels = part["label"].to_numpy()
        out[name] = {**classification(part["score"].to_numpy(), labels, threshold),
                     "by_language": by_language(part, threshold)}
    return out


def within_bucket(check: dict[str, Any] | None) -> dict[str, Any] | None:
    """The within-bucket figure: AUC of the held-out labelled high-value pages against the real
    low-value ones and against spam, all pages of one source (so a classifier that only tells
    sources apart scores 0.5 here). None without labelled pages."""
    if check is None:
        return None
    return {"high_vs_low_auc": check["high_vs_low"]["auc"], "high_vs_spam_auc": check["high_vs_spam"]["auc"],
            "pages": check["high_vs_low"]["positives"] + check["high_vs_low"]["negatives"]
            + check["high_vs_spam"]["negatives"]}


def evaluate(held: pl.DataFrame, threshold: float) -> dict[str, Any]:
    """Every figure of a held-out frame (bucket, language, label, score) at `threshold`: the
    corpus's own held-out documents (the labelled set's excluded), per language, the share of each
    language above the threshold, the labelled check and its within-bucket AUCs, and the
    source-separation flags."""
    corpus = held.filter(~pl.col("bucket").str.starts_with(LABELLED_PREFIX))
    check = labelled_check(held, threshold)
    inside = within_bucket(check)
    return {
        "decision_threshold": threshold,
        "holdout": classification(corpus["score"].to_numpy(), corpus["label"].to_numpy(), threshold),
        "holdout_by_language": by_language(corpus, threshold),
        "share_above_threshold": share_above(corpus, threshold),
        "check": check,
        "within_bucket": inside,
        "flags": source_separation(corpus, inside is not None and inside["high_vs_low_auc"] is not None),
    }
