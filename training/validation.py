"""The anneal playbook's validation loss (seed 000): per-bucket loss on held-out entries, every
`training.eval_every_tokens` trained tokens, and the rule that halts a run when a bucket's
validation loss rises during anneal.

Held-out entries are whole documents, so no window of a held-out document is ever trained on: per
bucket, documents are ordered by a seeded hash of their doc_id, and the first ones are taken until
they hold at least `eval_entries_per_bucket` entries. The choice depends only on the seed and the
bucket's shards (the same in every phase), and `training.data` removes these entries from every entry
set the sampler reads.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from refinery.manifest import BucketSlice, PhaseManifest
    from refinery.storage import DataRoot
    from training.data import BucketShards


def doc_rank_keys(doc_ids: list[str], seed: int) -> np.ndarray:
    """A seeded, platform-stable sort key per document (sha256 of seed and doc_id)."""
    return np.array([int.from_bytes(hashlib.sha256(f"{seed}:{d}".encode()).digest()[:8], "little") for d in doc_ids],
                    dtype=np.uint64)


def choose_heldout(entry_docs: list[str], k: int, seed: int) -> np.ndarray:
    """Sorted int64 ids of the held-out entries of one bucket, given each entry's doc_id: every entry
    of the first documents in seeded order, until at least `k` entries (or all) are held out."""
    if k <= 0 or not entry_docs:
        return np.zeros(0, dtype=np.int64)
    docs, entry_doc = np.unique(np.array(entry_docs, dtype=object), return_inverse=True)
    per_doc = np.bincount(entry_doc, minlength=len(docs))
    order = np.argsort(doc_rank_keys(list(docs), seed), kind="stable")
    taken = order[: int(np.searchsorted(np.cumsum(per_doc[order]), k)) + 1]
    return np.flatnonzero(np.isin(entry_doc, taken)).astype(np.int64)


def bucket_entry_docs(root: "DataRoot", bucket: "BucketSlice") -> list[str]:
    """doc_id of every global entry of the bucket, in global entry order."""
    docs: list[str] = []
    for ref in bucket.shards:
        docs.extend(root.read_parquet(ref.prefix + ".entries.parquet", columns=["doc_id"])["doc_id"].to_list())
    return docs


def heldout_entries(root: "DataRoot", manifests: list["PhaseManifest"], k: int, seed: int) -> dict[str, np.ndarray]:
    """Held-out entry ids of every bucket the manifests name (empty arrays when k is 0)."""
    slices = {name: bs for m in manifests for name, bs in m.buckets.items()}
    return {name: choose_heldout(bucket_entry_docs(root, bs) if k > 0 else [], k, seed) for name, bs in sorted(slices.items())}


def heldout_fingerprints(heldout: dict[str, np.ndarray]) -> dict[str, str]:
    """Per bucket, what identifies its held-out entries ("" when none). A checkpoint refuses to
    resume when a bucket it shares with the run holds out other entries: its entry sets, and so the
    sampler's cursors into them, would mean something else. A bucket only one side knows is fine (an
    anneal variant may add one)."""
    return {name: hashlib.sha256(np.ascontiguousarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16] if ids.size else ""
            for name, ids in sorted(heldout.items())}


@dataclass
class EvalRows:
    """Held-out entries packed back to back into rows of one seq_len, with the loss mask."""

    tokens: np.ndarray  # int64 (rows, L)
    doc_ids: np.ndarray  # int32 (rows, L): entry ordinal, for document-masked attention
    target_mask: np.ndarray  # bool (rows, L): position i's target (token i+1) counts


def pack_eval_rows(shards: "BucketShards", ids: np.ndarray, seq_len: int) -> EvalRows:
    """Entries `ids` of one bucket as rows of `seq_len`: a target counts when it lies in the same entry
    and outside the entry's overlap prefix (the tokens its previous window already trained on), as
    in training; the last row is padded with masked tokens."""
    pieces = [shards.arrays[int(shards.entry_shard[e])][int(shards.entry_offset[e]):int(shards.entry_offset[e] + shards.lengths[e])]
              for e in ids]
    lengths = shards.lengths[ids]
    n = int(lengths.sum())
    rows = max(1, -(-n // seq_len))
    tokens = np.zeros(rows * seq_len, dtype=np.int64)
    if n:
        tokens[:n] = np.concatenate(pieces)
    doc = np.full(rows * seq_len, -1, dtype=np.int64)
    doc[:n] = np.repeat(np.arange(len(ids)), lengths)
    starts = np.cumsum(lengths) - lengths
    in_overlap = np.zeros(rows * seq_len, dtype=bool)
    for s, ov in zip(starts, np.minimum(shards.overlaps[ids], lengths)):
        in_overlap[s:s + ov] = True
    doc, in_overlap = doc.reshape(rows, seq_len), in_overlap.reshape(rows, seq_len)
    mask = np.zeros((rows, seq_len), dtype=bool)
    mask[:, :-1] = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0) & ~in_overlap[:, 1:]
    return EvalRows(tokens.reshape(rows, seq_len), doc.astype(np.int32), mask)


def val_rise(losses: list[float], patience: int, min_delta: float) -> tuple[float, list[float]] | None:
    """The rule: the last `patience` evaluations each lie more than `min_delta` above the best loss
    before them (all within one phase). Returns (that best, the rising losses) when it fires."""
    if len(losses) <= patience:
        return None
    best_before = np.minimum.accumulate(np.asarray(losses, dtype=np.float64))
    recent = range(len(losses) - patience, len(losses))
    if all(losses[i] > best_before[i - 1] + min_delta for i in recent):
        return float(best_before[len(losses) - patience - 1]), [float(losses[i]) for i in recent]
    return None


def rising_buckets(history: dict[str, list[float]], patience: int, min_delta: float) -> dict[str, tuple[float, list[float]]]:
    """Buckets whose validation losses (in evaluation order, one phase) fire `val_rise`."""
    out = {}
    for bucket, losses in sorted(history.items()):
        fired = val_rise(losses, patience, min_delta)
        if fired is not None:
            out[bucket] = fired
    return out
