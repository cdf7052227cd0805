"""The ablations' evaluation hold-out: the curated documents that no variant trains on and that the
proxy models are scored on (refinery/ablations/eval_set.py), and that nothing the pipeline learns
may see either: the quality classifier leaves them out of its training documents
(refinery/models/quality_training.py), so that `quality_top` does not select web pages by their
likeness to the very pages it is then scored on.

A document is held out when it is in a curated bucket (`ablations.eval_buckets`; by default the
quality classifier's positive buckets that a source feeds) and the hash of the run's seed and its
doc id falls below `ablations.eval_fraction` of the hash space: a function of the document alone,
so every part that asks gets the same answer without reading anything. Without an `ablations`
section nothing is held out.
"""

from __future__ import annotations

import hashlib

import polars as pl

from refinery.config import RefineryConfig

_HASH_SPACE = 1 << 64


def eval_buckets(cfg: RefineryConfig) -> list[str]:
    """The curated buckets the held-out documents come from (see the module docstring)."""
    assert cfg.ablations is not None
    if cfg.ablations.eval_buckets is not None:
        return list(cfg.ablations.eval_buckets)
    fed = {s.bucket for s in cfg.sources}
    return [b for b in cfg.stages.quality.positive_buckets if b in fed]


def _holdout_key(seed: int, doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"ablations-eval:{seed}:{doc_id}".encode(), digest_size=8).digest(), "big")


def held_out_mask(cfg: RefineryConfig, doc_ids: pl.Series, buckets: pl.Series) -> pl.Series:
    """True for the documents the evaluation set holds out (all False without `ablations`)."""
    if cfg.ablations is None:
        return pl.Series([False] * len(doc_ids), dtype=pl.Boolean)
    curated = set(eval_buckets(cfg))
    limit = cfg.ablations.eval_fraction * _HASH_SPACE
    return pl.Series([b in curated and _holdout_key(cfg.seed, d) < limit
                      for d, b in zip(doc_ids.to_list(), buckets.to_list())], dtype=pl.Boolean)
