"""The quality classifier's training run over the corpus: stream its documents from the data root,
fit it (`refinery.models.quality`), publish the model and its `latest.json` pointer.

The classifier learns curated buckets (positive) against raw web (negative) from the `deduped`
documents of those buckets, with their language. Those are read through deduped's attribute table
(refinery/stages/attributes.py) a record batch of at most `q.FEATURIZE_DOCS` rows at a time, never
as whole tables, so the memory of training does not grow with the corpus.

With `stages.quality.labelled_set` (data/labelled/), the labelled pages join them as the buckets
`labelled/high` (positive), `labelled/low` and `labelled/spam` (negative): real low-value text among
the negatives. Their held-out pages, chosen by doc_id hash like every other document's, are the
labelled check set the model is measured on (refinery/models/quality_metrics.py).
"""

from __future__ import annotations

import gzip
import json
from typing import Iterator

import polars as pl

from refinery.config import RefineryConfig
from refinery.documents import input_shards
from refinery.models import quality as q
from refinery.models import quality_metrics as qm
from refinery.stages import registry
from refinery.stages.attributes import stage_batches
from refinery.storage import DataRoot


UPSTREAM = registry.funnel_stage(q.QualityScorer.name).upstream  # the documents quality_scored reads


class LabelledSetError(ValueError):
    """The labelled set is missing, unreadable, or has a row without text or a known label."""


def labelled_batches(path: str) -> Iterator[pl.DataFrame]:
    """The labelled set's pages as doc_id ("labelled:" + url), bucket (`labelled/<label>`),
    language and text, `q.FEATURIZE_DOCS` rows at a time, streamed line by line."""
    rows: list[dict] = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                page = json.loads(line)
                if page.get("label") not in qm.LABELLED_BUCKETS or not isinstance(page.get("text"), str):
                    raise LabelledSetError(f"{path}:{number}: a labelled page needs text and a label of "
                                           f"{sorted(qm.LABELLED_BUCKETS)}")
                rows.append({"doc_id": f"labelled:{page['url']}", "bucket": qm.LABELLED_BUCKETS[page["label"]],
                             "language": page.get("lang"), "text": page["text"]})
                if len(rows) == q.FEATURIZE_DOCS:
                    yield pl.DataFrame(rows, schema=LABELLED_SCHEMA)
                    rows = []
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LabelledSetError(f"stages.quality.labelled_set: {path}: {err}") from None
    if rows:
        yield pl.DataFrame(rows, schema=LABELLED_SCHEMA)


LABELLED_SCHEMA = {"doc_id": pl.String, "bucket": pl.String, "language": pl.String, "text": pl.String}


def training_batches(cfg: RefineryConfig, root: DataRoot) -> q.DocumentBatches:
    """A function that reads doc_id, bucket, language and text of the upstream documents of the
    positive and negative buckets, file by file in input order, `q.FEATURIZE_DOCS` rows at a time,
    then the labelled set's pages if one is configured; each call is a fresh pass."""
    qc = cfg.stages.quality
    wanted = set(qc.positive_buckets) | set(qc.negative_buckets)
    partitions = [s.key for s in input_shards(cfg) if s.bucket in wanted]

    def read() -> Iterator[pl.DataFrame]:
        for partition in partitions:
            for batch in stage_batches(root, UPSTREAM, partition, q.FEATURIZE_DOCS):
                language = pl.col("language") if "language" in batch.columns else pl.lit(None, dtype=pl.String)
                yield batch.select("doc_id", "bucket", language.cast(pl.String).alias("language"), "text")
        if qc.labelled_set:
            yield from labelled_batches(cfg.resolve(qc.labelled_set))

    return read


def training_buckets(cfg: RefineryConfig) -> tuple[list[str], list[str]]:
    """The positive and negative buckets training labels by, the labelled set's included."""
    qc = cfg.stages.quality
    positive, negative = list(qc.positive_buckets), list(qc.negative_buckets)
    if qc.labelled_set:
        positive.append(qm.LABELLED_BUCKETS["high"])
        negative += [qm.LABELLED_BUCKETS["low"], qm.LABELLED_BUCKETS["spam"]]
    return positive, negative




def train_and_publish(cfg: RefineryConfig, root: DataRoot) -> tuple[dict, q.TrainingReport]:
    """Fit the classifier on `training_batches` with `stages.quality`'s settings and publish it;
    returns the published pointer (model key, hash, sha256, settings) and the training report."""
    qc = cfg.stages.quality
    positive, negative = training_buckets(cfg)
    model, report = q.train_quality_model(
        training_batches(cfg, root),
        positive,
        negative,
        num_features=qc.num_features,
        ngram=qc.ngram,
        epochs=qc.epochs,
        learning_rate=qc.learning_rate,
        holdout_fraction=qc.holdout_fraction,
        max_chars=qc.max_chars,
        max_docs_per_class=qc.max_train_docs_per_class,
        seed=cfg.seed,
        chunk_bytes=qc.train_chunk_mb << 20,
        threshold=qm.decision_threshold(qc.threshold),
    )
    return q.publish_model(root, model, report, quality_settings(cfg)), report


def quality_settings(cfg: RefineryConfig) -> dict:
    """The settings a model is published with: `stages.quality` and the seed."""
    return {**cfg.stages.quality.model_dump(mode="json"), "seed": cfg.seed}
