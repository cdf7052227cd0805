"""The quality classifier's training run over the corpus: stream its documents from the data root,
fit it (`refinery.stages.quality`), publish the model and its `latest.json` pointer.

The classifier learns curated buckets (positive) against raw web (negative) from the `deduped`
documents of those buckets. Those are read through deduped's attribute table
(refinery/stages/attributes.py) a record batch of at most `q.FEATURIZE_DOCS` rows at a time, never
as whole tables, so the memory of training does not grow with the corpus.
"""

from __future__ import annotations

from typing import Iterator

import polars as pl

from refinery.config import RefineryConfig
from refinery.documents import input_shards
from refinery.stages import quality as q
from refinery.stages.attributes import stage_batches
from refinery.stages.dedup_compute import STAGE as UPSTREAM
from refinery.storage import DataRoot


def training_batches(cfg: RefineryConfig, root: DataRoot) -> q.DocumentBatches:
    """A function that reads doc_id, bucket and text of the upstream documents of the positive and
    negative buckets, file by file in input order, `q.FEATURIZE_DOCS` rows at a time; each call is
    a fresh pass."""
    qc = cfg.stages.quality
    wanted = set(qc.positive_buckets) | set(qc.negative_buckets)
    partitions = [s.key for s in input_shards(cfg) if s.bucket in wanted]

    def read() -> Iterator[pl.DataFrame]:
        for partition in partitions:
            for batch in stage_batches(root, UPSTREAM, partition, q.FEATURIZE_DOCS):
                yield batch.select("doc_id", "bucket", "text")

    return read


def train_and_publish(cfg: RefineryConfig, root: DataRoot) -> tuple[dict, q.TrainingReport]:
    """Fit the classifier on `training_batches` with `stages.quality`'s settings and publish it;
    returns the published pointer (model key, hash, sha256, settings) and the training report."""
    qc = cfg.stages.quality
    model, report = q.train_quality_model(
        training_batches(cfg, root),
        list(qc.positive_buckets),
        list(qc.negative_buckets),
        num_features=qc.num_features,
        ngram=qc.ngram,
        epochs=qc.epochs,
        learning_rate=qc.learning_rate,
        holdout_fraction=qc.holdout_fraction,
        max_chars=qc.max_chars,
        max_docs_per_class=qc.max_train_docs_per_class,
        seed=cfg.seed,
        chunk_bytes=qc.train_chunk_mb << 20,
    )
    return q.publish_model(root, model, report, quality_settings(cfg)), report


def quality_settings(cfg: RefineryConfig) -> dict:
    """The settings a model is published with: `stages.quality` and the seed."""
    return {**cfg.stages.quality.model_dump(mode="json"), "seed": cfg.seed}
