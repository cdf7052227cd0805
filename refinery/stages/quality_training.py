"""The quality classifier's training run over the corpus: gather its documents from the data root,
fit it (`refinery.stages.quality`), publish the model and its `latest.json` pointer.

The classifier learns curated buckets (positive) against raw web (negative) from the `deduped`
documents of those buckets.
"""

from __future__ import annotations

import polars as pl

from refinery.config import RefineryConfig
from refinery.documents import input_shards
from refinery.layout import documents_key
from refinery.stages import quality as q
from refinery.stages.dedup_compute import STAGE as UPSTREAM
from refinery.storage import DataRoot


def training_documents(cfg: RefineryConfig, root: DataRoot) -> pl.DataFrame:
    """doc_id, bucket and text of the upstream documents the classifier trains on. A first pass
    keeps only lengths, so memory holds the chosen texts (at most max_train_docs_per_class per
    class), never every document of the corpus."""
    qc = cfg.stages.quality
    wanted = set(qc.positive_buckets) | set(qc.negative_buckets)
    keys = [documents_key(UPSTREAM, s.key) for s in input_shards(cfg) if s.bucket in wanted]
    columns = ["doc_id", "bucket", "text"]
    if not keys:
        return pl.DataFrame(schema={"doc_id": pl.String, "bucket": pl.String, "text": pl.String})
    index = pl.concat([q.text_index(root.read_parquet(k, columns=columns)) for k in keys])
    chosen = q.training_set(index, list(qc.positive_buckets), list(qc.negative_buckets),
                            qc.max_train_docs_per_class, cfg.seed)["doc_id"]
    return pl.concat([root.read_parquet(k, columns=columns).filter(pl.col("doc_id").is_in(chosen)) for k in keys])


def train_and_publish(cfg: RefineryConfig, root: DataRoot) -> tuple[dict, q.TrainingReport]:
    """Fit the classifier on `training_documents` with `stages.quality`'s settings and publish it;
    returns the published pointer (model key, hash, sha256, settings) and the training report."""
    qc = cfg.stages.quality
    model, report = q.train_quality_model(
        training_documents(cfg, root),
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
    )
    return q.publish_model(root, model, report, quality_settings(cfg)), report


def quality_settings(cfg: RefineryConfig) -> dict:
    """The settings a model is published with: `stages.quality` and the seed."""
    return {**cfg.stages.quality.model_dump(mode="json"), "seed": cfg.seed}
