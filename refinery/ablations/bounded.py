"""A variant holds what its proxy runs read, not its whole selection (issue 49).

Every proxy run of a variant trains `budget` tokens mixed by the variant's bucket weights, one pass:
bucket b serves budget x w_b tokens, within one row (the sampler's guarantee). So a variant stores,
per bucket, documents in sample order until it holds

    target_b = ceil(budget x w_b x (1 + MARGIN)) + seq_len

tokens of entries (its documents as windowed at the packing window): one pass of its share, one row
of the sampler's slack, and MARGIN (5%) to spare; the last document taken may run past it, so the
bucket holds at most bound_b = target_b + its largest document's entry tokens. Every seed so reads
nearly the same documents and differs in initial weights and order, which is what a paired verdict
pairs on. A bucket whose selection is within its target is kept whole; a bucket without weight
stores nothing. The `funnel` variant's data also feeds the schedule variants and anneal mixtures
(refinery/ablations/schedules.py), whose tables may want more of a bucket than the funnel's own
mixture (a docs-heavy anneal): its target is at least their largest demand (`floors`).

The sample is deterministic and spread across languages: within a bucket, each language's documents
are ordered by a hash of the run's seed and the doc id, and the bucket takes them in the order of
their position within their language (the i-th of n at (i + 0.5) / n), so every prefix of the
order holds each language in proportion to its documents in the selection.

The selection's counts (documents, bytes, tokens, share of the raw text) are counted before the
sample, so the report prints what a variant selects, not what it stores.
Memory: a few numbers per document of the variant (no text).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import polars as pl

from refinery.shard_format import split_windows

MARGIN = 0.05


def entry_tokens(doc_lengths: list[int], window: int, overlap: int) -> list[int]:
    """Tokens of the entries each document becomes: its tokens and EOD, cut into windows that
    repeat `overlap` tokens (refinery/global_steps/tokenize.py packs them so)."""
    return [sum(b - a for a, b, _ in split_windows(n + 1, window, overlap)) for n in doc_lengths]


def bucket_target(budget: int, weight: float, seq_len: int) -> int:
    """The entry tokens a bucket of weight `weight` takes documents until it holds (module docstring)."""
    return math.ceil(budget * weight * (1 + MARGIN)) + seq_len


def _sample_keys(seed: int, doc_ids: list[str]) -> np.ndarray:
    return np.array([hashlib.blake2b(f"ablations-sample:{seed}:{d}".encode(), digest_size=8).digest()
                     for d in doc_ids], dtype="S8")


def sample_order(part: pl.DataFrame, seed: int) -> pl.DataFrame:
    """`part` (doc_id, language, ...) in sample order: by position within its language, then hash."""
    keyed = part.with_columns(_key=pl.Series(_sample_keys(seed, part["doc_id"].to_list()), dtype=pl.Binary),
                              _lang=pl.col("language").fill_null(""))
    keyed = keyed.sort("_key").with_columns(
        _position=(pl.int_range(pl.len()).over("_lang") + 0.5) / pl.len().over("_lang"))
    return keyed.sort("_position", "_key").drop("_key", "_lang", "_position")


def bounded_sample(facts: pl.DataFrame, budget: int, weights: dict[str, float], seq_len: int,
                   seed: int, floors: dict[str, int] | None = None) -> tuple[pl.Series, dict[str, int]]:
    """The doc ids a variant stores, of `facts` (doc_id, bucket, language, tokens: one row per
    selected document), and each bucket's bound (module docstring); `floors`: entry tokens a bucket
    holds at least, whatever its weight."""
    floors = floors or {}
    chosen: list[str] = []
    bounds: dict[str, int] = {}
    for (bucket,), part in facts.sort("doc_id").group_by(["bucket"], maintain_order=True):
        floor = floors.get(bucket, 0)
        if weights.get(bucket, 0.0) <= 0.0 and not floor:  # no share of any mixture: nothing of it is read
            continue
        target = max(bucket_target(budget, weights.get(bucket, 0.0), seq_len), floor)
        bounds[bucket] = target + int(part["tokens"].max())
        ordered = sample_order(part, seed)
        before = ordered["tokens"].cum_sum() - ordered["tokens"]  # what the bucket holds before each document
        chosen += ordered.filter(before < target)["doc_id"].to_list()
    return pl.Series("doc_id", sorted(chosen), dtype=pl.String), bounds
