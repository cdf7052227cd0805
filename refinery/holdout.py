"""The ablations' evaluation hold-out: the documents of every bucket that no variant trains on and
that the proxy models are scored on (refinery/ablations/eval_set.py).

A document is held out when it is in an evaluation bucket (`ablations.eval_buckets`; by default
every bucket a source feeds, so that each bucket's filters are judged on its own text) and the
hash of the run's seed and its doc id falls below `ablations.eval_fraction` of the hash space: a
function of the document alone, so every part that asks gets the same answer without reading
anything. Without an `ablations` section nothing is held out.

The hold-out leaves the main graph alone: the funnel, the quality classifier and the main training
read every document whether or not the config has an `ablations` section, so adding the section
reruns none of them and never changes what the main run trains on (refinery/models/quality_training.py).
The price: the classifier that `quality_top` variants rank by has learned the held-out pages with the
rest of their buckets (docs/ablations.md).
"""

from __future__ import annotations

import hashlib

import polars as pl

from refinery.config import RefineryConfig

_HASH_SPACE = 1 << 64


def eval_buckets(cfg: RefineryConfig) -> list[str]:
    """The buckets the held-out documents come from (see the module docstring)."""
    assert cfg.ablations is not None
    if cfg.ablations.eval_buckets is not None:
        return list(cfg.ablations.eval_buckets)
    fed = {s.bucket for s in cfg.sources}
    return [b for b in cfg.buckets if b in fed]


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
