"""The difficulty reference model in the data root (refinery/models/difficulty.py is the model).

`build_reference_model` trains on the clean documents of the reference buckets (or loads
`stages.difficulty.model_path`) and publishes `models/difficulty/reference.npz`;
`load_published_model` reads it back for `tokenized_shards`, which scores each document it encodes.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE, input_shards
from refinery.layout import DIFFICULTY_MODEL_KEY, TOKENIZER_KEY, documents_key
from refinery.models.difficulty import DifficultyModelError, ReferenceModel, train
from refinery.stages.parquet_batches import parquet_batches
from refinery.storage import DataRoot

# Documents the reference model's training encodes at once, and at most this many bytes of their text.
ENCODE_BATCH_DOCS = 256
ENCODE_BATCH_BYTES = 16 << 20


def reference_buckets(cfg: RefineryConfig) -> list[str]:
    """The buckets the reference model learns from: `stages.difficulty.reference_buckets`, else the
    quality classifier's curated (positive) buckets."""
    named = cfg.stages.difficulty.reference_buckets
    return list(named if named is not None else cfg.stages.quality.positive_buckets)


def difficulty_settings(cfg: RefineryConfig) -> dict[str, Any]:
    """What a published reference model was made with: `stages.difficulty`, the buckets it read and the seed."""
    return {**cfg.stages.difficulty.model_dump(mode="json"), "reference_buckets": reference_buckets(cfg),
            "seed": cfg.seed}


def reference_documents(root: DataRoot, cfg: RefineryConfig, tokenizer) -> Iterator[np.ndarray]:
    """The token ids of the reference buckets' clean documents, file by file in input order,
    encoded ENCODE_BATCH_DOCS documents and at most ENCODE_BATCH_BYTES of text at a time (a
    consumer that stops early stops the reading)."""
    wanted = set(reference_buckets(cfg))
    for shard in input_shards(cfg):
        if shard.bucket not in wanted:
            continue
        path = root.local_path(documents_key(CLEAN_STAGE, shard.key))
        for batch in parquet_batches(path, ENCODE_BATCH_DOCS, ["text"], ENCODE_BATCH_BYTES):
            texts = [t for t in batch["text"].to_list() if t]
            for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False):
                yield np.asarray(encoding.ids, dtype=np.uint32)


@dataclass
class PublishedModel:
    model: ReferenceModel
    sha256: str
    source: str  # "trained", or the model file it was read from
    wall_s: float


def build_reference_model(root: DataRoot, cfg: RefineryConfig, tokenizer) -> PublishedModel:
    """Train the reference model on the reference buckets (or read `stages.difficulty.model_path`,
    checked against the run's tokenizer) and publish it at DIFFICULTY_MODEL_KEY, atomically."""
    t0 = time.perf_counter()
    dc = cfg.stages.difficulty
    tokenizer_sha = root.sha256(TOKENIZER_KEY)
    if dc.model_path is not None:
        path = cfg.resolve(dc.model_path)
        try:
            data = Path(path).read_bytes()
        except OSError as err:
            raise DifficultyModelError(f"stages.difficulty.model_path: {path}: cannot be read ({err.strerror})") from None
        model, source = ReferenceModel.from_bytes(data, path), path
        check_tokenizer(model, tokenizer_sha, path)
    else:
        vocab = tokenizer.get_vocab_size()
        model = train(reference_documents(root, cfg, tokenizer), vocab, dc.order, dc.max_train_tokens, dc.discount,
                      tokenizer_sha)
        if not model.tokens:
            raise DifficultyModelError(
                f"no clean documents in the reference buckets {reference_buckets(cfg)} to train the difficulty "
                f"model on; set stages.difficulty.reference_buckets to buckets with documents, or name a model in "
                f"stages.difficulty.model_path"
            )
        source = "trained"
    sha = root.write_bytes(DIFFICULTY_MODEL_KEY, model.to_bytes())
    return PublishedModel(model, sha, source, time.perf_counter() - t0)


def check_tokenizer(model: ReferenceModel, tokenizer_sha256: str, name: str) -> None:
    if model.tokenizer_sha256 != tokenizer_sha256:
        raise DifficultyModelError(
            f"{name}: the reference model was trained on token ids of tokenizer {model.tokenizer_sha256[:12] or '?'}, "
            f"but this run's tokenizer is {tokenizer_sha256[:12]}; materialize difficulty_model again (or name a "
            f"model trained with this tokenizer)"
        )


def load_published_model(root: DataRoot) -> tuple[ReferenceModel, str]:
    """The published reference model and its file's sha256, checked against the run's tokenizer."""
    if not root.exists(DIFFICULTY_MODEL_KEY):
        raise DifficultyModelError(f"{root.display(DIFFICULTY_MODEL_KEY)}: no difficulty reference model; "
                                   f"materialize difficulty_model first")
    data = root.read_bytes(DIFFICULTY_MODEL_KEY)
    model = ReferenceModel.from_bytes(data, root.display(DIFFICULTY_MODEL_KEY))
    check_tokenizer(model, root.sha256(TOKENIZER_KEY), root.display(DIFFICULTY_MODEL_KEY))
    return model, hashlib.sha256(data).hexdigest()
