"""The quality classifier's training run over the corpus: stream its documents from the data root,
fit it (`refinery.models.quality_fit`), publish the model and its `latest.json` pointer, and read it back.

The classifier learns curated buckets (positive) against raw web (negative) from the `deduped`
documents of those buckets, with their language, whether or not the config has an `ablations`
section: the ablations' evaluation hold-out (refinery/holdout.py) leaves the main graph alone, so
adding the section reruns nothing the graph trains on (docs/ablations.md says what that costs a
`quality_top` verdict). Those are read through deduped's attribute table (refinery/stages/attributes.py) a record batch of at most `qfit.FEATURIZE_DOCS` rows at a time, never
as whole tables, so the memory of training does not grow with the corpus.

Labelled pages join them as the buckets `labelled/high` (positive), `labelled/low` and
`labelled/spam` (negative): real low-value text among the negatives, and real documentation of
every kind among the positives. They are `stages.quality.labelled_set`, or by default the pages
Refinery ships (data/labelled and data/multilingual, `labelled_sets`). Their held-out pages, chosen
by doc_id hash like every other document's, are the labelled check set the model is measured on,
its within-bucket figure (refinery/models/quality_metrics.py).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any, Iterator

import polars as pl

from refinery.config import RefineryConfig
from refinery.config.paths import CHECKOUT, SHIPPED_LABELLED_SETS
from refinery.documents import input_shards
from refinery.layout import QUALITY_MODEL_DIR
from refinery.models import quality as q
from refinery.models import quality_fit as qfit
from refinery.models import quality_metrics as qm
from refinery.models.quality_features import WORD_PATTERN
from refinery.stages import registry
from refinery.stages.attributes import stage_batches
from refinery.storage import DataRoot


UPSTREAM = registry.funnel_stage(q.QualityScorer.name).upstream  # the documents quality_scored reads


class LabelledSetError(ValueError):
    """The labelled set is missing, unreadable, or has a row without text or a known label."""


def labelled_batches(path: str, label: str | None = None) -> Iterator[pl.DataFrame]:
    """A labelled set's pages as doc_id ("labelled:" + url), bucket (`labelled/<label>`), language
    and text, `qfit.FEATURIZE_DOCS` rows at a time, streamed line by line. `label` gives every page
    that label (a file of one kind, as data/multilingual's); None reads each page's own."""
    rows: list[dict] = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                page = json.loads(line)
                page_label = label or page.get("label")
                if page_label not in qm.LABELLED_BUCKETS or not isinstance(page.get("text"), str):
                    raise LabelledSetError(f"{path}:{number}: a labelled page needs text and a label of "
                                           f"{sorted(qm.LABELLED_BUCKETS)}")
                rows.append({"doc_id": f"labelled:{page['url']}", "bucket": qm.LABELLED_BUCKETS[page_label],
                             "language": page.get("lang"), "text": page["text"]})
                if len(rows) == qfit.FEATURIZE_DOCS:
                    yield pl.DataFrame(rows, schema=LABELLED_SCHEMA)
                    rows = []
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LabelledSetError(f"stages.quality.labelled_set: {path}: {err}") from None
    if rows:
        yield pl.DataFrame(rows, schema=LABELLED_SCHEMA)


def labelled_sets(cfg: RefineryConfig) -> list[tuple[str, str | None]]:
    """The labelled files training reads, each with the label all its pages take (None: their own):
    stages.quality.labelled_set, else the shipped ones (SHIPPED_LABELLED_SETS) unless
    shipped_labelled_pages is off."""
    qc = cfg.stages.quality
    if qc.labelled_set:
        return [(cfg.resolve(qc.labelled_set), None)]
    if qc.shipped_labelled_pages:
        return [(str(CHECKOUT / path), label) for path, label in SHIPPED_LABELLED_SETS]
    return []


LABELLED_SCHEMA = {"doc_id": pl.String, "bucket": pl.String, "language": pl.String, "text": pl.String}


def training_batches(cfg: RefineryConfig, root: DataRoot) -> qfit.DocumentBatches:
    """A function that reads doc_id, bucket, language and text of the upstream documents of the
    positive and negative buckets, file by file in input order, `qfit.FEATURIZE_DOCS` rows at a time,
    then the labelled pages (`labelled_sets`); each call is a fresh pass."""
    qc = cfg.stages.quality
    wanted = set(qc.positive_buckets) | set(qc.negative_buckets)
    partitions = [s.key for s in input_shards(cfg) if s.bucket in wanted]
    labelled = labelled_sets(cfg)

    def read() -> Iterator[pl.DataFrame]:
        for partition in partitions:
            for batch in stage_batches(root, UPSTREAM, partition, qfit.FEATURIZE_DOCS):
                language = pl.col("language") if "language" in batch.columns else pl.lit(None, dtype=pl.String)
                if batch.height:
                    yield batch.select("doc_id", "bucket", language.cast(pl.String).alias("language"), "text")
        for path, label in labelled:
            yield from labelled_batches(path, label)

    return read


def training_buckets(cfg: RefineryConfig) -> tuple[list[str], list[str]]:
    """The positive and negative buckets training labels by, the labelled set's included."""
    qc = cfg.stages.quality
    positive, negative = list(qc.positive_buckets), list(qc.negative_buckets)
    if labelled_sets(cfg):
        positive.append(qm.LABELLED_BUCKETS["high"])
        negative += [qm.LABELLED_BUCKETS["low"], qm.LABELLED_BUCKETS["spam"]]
    return positive, negative




def train_and_publish(cfg: RefineryConfig, root: DataRoot) -> tuple[dict, qfit.TrainingReport]:
    """Fit the classifier on `training_batches` with `stages.quality`'s settings and publish it;
    returns the published pointer (model key, hash, sha256, settings) and the training report."""
    qc = cfg.stages.quality
    positive, negative = training_buckets(cfg)
    model, report = qfit.train_quality_model(
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
    return publish_model(root, model, report, quality_settings(cfg)), report


def quality_settings(cfg: RefineryConfig) -> dict:
    """The settings a model is published with: `stages.quality` and the seed."""
    return {**cfg.stages.quality.model_dump(mode="json"), "seed": cfg.seed}


def publish_model(root: DataRoot, model: q.QualityModel, report: qfit.TrainingReport, settings: dict[str, Any]) -> dict[str, Any]:
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
        "format": q.MODEL_FORMAT,
        "features": {"num_features": model.num_features, "ngram": model.ngram, "max_chars": model.max_chars,
                     "word_pattern": WORD_PATTERN},
        "settings": settings,
        **{k: v for k, v in report.to_dict().items() if k != "wall_s"},
    }
    root.write_json(q.LATEST_KEY, pointer)
    return pointer


def load_published_model(root: DataRoot) -> tuple[q.QualityModel, dict[str, Any]]:
    """The model `latest.json` points at, checked against the sha256 recorded there."""
    if not root.exists(q.LATEST_KEY):
        raise FileNotFoundError(f"{root.display(q.LATEST_KEY)}: no quality model yet; materialize quality_model first")
    pointer = root.read_json(q.LATEST_KEY)
    data = root.read_bytes(pointer["model_key"])
    if hashlib.sha256(data).hexdigest() != pointer["sha256"]:
        raise ValueError(
            f"{root.display(pointer['model_key'])}: content does not match the sha256 in {q.LATEST_KEY}; "
            "re-materialize quality_model"
        )
    return q.QualityModel.from_bytes(data), pointer
