"""Training the quality classifier: which documents train it, the held-out split, per-language
class weights, and the streamed fit (docs/quality.md).

Curated buckets (books, wiki) are the positive class, raw web the negative one; each language weighs
its two classes equally, a language with one class only does not train, and the labelled pages
weigh at least as much as the corpus's documents (`class_weights`), so
neither language nor source can be the signal.

Training is torch (an `EmbeddingBag` of width 1 and `torch.optim.Adagrad`, which suits sparse
features), seeded and run with `torch.use_deterministic_algorithms`: the same documents, config and
seed give the same weights and therefore the same model file bytes. The held-out set is chosen by a
hash of each doc_id, so it does not depend on the order documents arrive in. Training streams: it
reads the documents in slices of FEATURIZE_DOCS, spills their hashed features to a temporary file
and trains on one chunk of at most `chunk_bytes` of features at a time, so its memory is bounded by
those two and by `max_docs_per_class` (a few small columns per chosen document), never by the
corpus (`train_quality_model`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import polars as pl

from refinery.config import QualityConfig
from refinery.models import quality_metrics as qm
from refinery.models.quality import QualityModel, reproducible_torch
from refinery.models.quality_features import SHAPE_ROWS, Features, hash_features

TRAIN_BATCH_DOCS = 32
# Training reads and featurizes at most this many documents at once: with `max_chars` 100k, a
# slice's text and word table stay within tens of MB however large the corpus.
FEATURIZE_DOCS = 256
# The hashed features training holds in memory at once, unless told: stages.quality's default.
DEFAULT_CHUNK_BYTES = QualityConfig.model_fields["train_chunk_mb"].default << 20

# A function that starts a fresh pass over the training documents (tables with doc_id, bucket and
# text) each time it is called: training reads them twice.
DocumentBatches = Callable[[], Iterable[pl.DataFrame]]


class NoTrainingData(ValueError):
    """One class has no documents to learn from."""


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


def class_weights(languages: pl.Series, labels: np.ndarray, labelled: np.ndarray | None = None
                  ) -> tuple[np.ndarray, dict[str, dict[str, int]], list[str]]:
    """A loss weight per training document such that, within each language, the two classes weigh
    the same (each as much as the smaller one's count) and a language with one class weighs nothing:
    a language seen only as web, or only as curated, cannot become the signal. With `labelled` (True
    for a labelled set's page), the labelled pages together weigh at least as much as the rest. Weights average 1
    over the weighted documents. Also returns each language's class counts and the untrained ones."""
    frame = pl.DataFrame({"language": languages.fill_null(qm.UNKNOWN_LANGUAGE), "label": labels})
    counts = frame.group_by("language").agg(positive=(pl.col("label") == 1).sum(), negative=(pl.col("label") != 1).sum())
    per_language = {lang: {"positive": int(pos), "negative": int(neg)} for lang, pos, neg in counts.sort("language").iter_rows()}
    weights = frame.join(counts, on="language", how="left", maintain_order="left").select(
        pl.min_horizontal("positive", "negative") / pl.when(pl.col("label") == 1).then("positive").otherwise("negative")
    ).to_series().to_numpy().astype(np.float64)
    if labelled is not None:
        # The labelled pages weigh at least as much as the corpus's documents: a web bucket of a
        # million pages would otherwise drown the few thousand that teach the model what a
        # low-value page inside web looks like.
        ours, corpus = weights[labelled].sum(), weights[~labelled].sum()
        if 0 < ours < corpus:
            weights[labelled] *= corpus / ours
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
    weights, per_language, untrained = class_weights(train_plan["language"], train_plan["label"].to_numpy(),
                                                     train_plan["bucket"].str.starts_with(qm.LABELLED_PREFIX).to_numpy())
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
