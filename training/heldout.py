"""The validation entries held out of training (the anneal playbook, seed 000).

Held-out entries are whole documents, so no window of a held-out document is ever trained on. Per
bucket, the shards are read in a seeded order (sha256 of the seed and the shard's key), only their
entry sidecars and only until the documents found whole in them (every window present) hold at
least `HELDOUT_POOL` times `eval_entries_per_bucket` entries, or the bucket ends: a bounded read,
not a scan of the bucket. Among those whole documents, ordered by a seeded hash of their doc_id,
the first are taken until they hold at least `eval_entries_per_bucket` entries. The shards were
globally shuffled, so the pool is a uniform sample of the bucket's documents, except that a
document cut into windows that landed in other shards is not whole in the pool: long documents are
held out less often than their share. The choice depends only on the seed and the bucket's shards
(the same in every phase). `training.data` removes these entries from every entry set the sampler
reads, and `training.validation` measures the loss on them.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

# Whole documents read before choosing, in entries, per held-out entry asked for: the choice ranks
# a pool several times larger than it takes.
HELDOUT_POOL = 4

if TYPE_CHECKING:
    from refinery.curriculum import BucketSlice, PhaseManifest, ShardRef
    from refinery.storage import DataRoot


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


def shard_entry_docs(root: "DataRoot", ref: "ShardRef") -> tuple[list[str], np.ndarray]:
    """(doc_id, n_windows) of each entry of one shard, from its sidecar."""
    table = root.read_parquet(ref.prefix + ".entries.parquet", columns=["doc_id", "n_windows"])
    return table["doc_id"].to_list(), table["n_windows"].to_numpy().astype(np.int64)


def bucket_heldout(root: "DataRoot", bucket: "BucketSlice", k: int, seed: int) -> np.ndarray:
    """Sorted int64 global ids of one bucket's held-out entries (see the module doc)."""
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum([ref.entries for ref in bucket.shards])])
    order = np.argsort(doc_rank_keys([ref.prefix for ref in bucket.shards], seed), kind="stable")
    ids, docs, windows = [], [], []
    for s in order.tolist():
        shard_docs, n_windows = shard_entry_docs(root, bucket.shards[s])
        ids.append(np.arange(first[s], first[s + 1], dtype=np.int64))
        docs.extend(shard_docs)
        windows.append(n_windows)
        whole = whole_documents(docs, np.concatenate(windows))
        if whole.sum() >= HELDOUT_POOL * k:
            break
    whole_ids = np.concatenate(ids)[whole]
    chosen = choose_heldout([d for d, w in zip(docs, whole.tolist()) if w], k, seed)
    return np.sort(whole_ids[chosen])


def whole_documents(docs: list[str], n_windows: np.ndarray) -> np.ndarray:
    """bool per entry: every window of its document is among `docs`."""
    _, inverse, counts = np.unique(np.array(docs, dtype=object), return_inverse=True, return_counts=True)
    return counts[inverse] == n_windows


def heldout_entries(root: "DataRoot", manifests: list["PhaseManifest"], k: int, seed: int) -> dict[str, np.ndarray]:
    """Held-out entry ids of every bucket the manifests name (empty arrays when k is 0)."""
    slices = {name: bs for m in manifests for name, bs in m.buckets.items()}
    return {name: bucket_heldout(root, bs, k, seed) for name, bs in sorted(slices.items())}


def heldout_fingerprints(heldout: dict[str, np.ndarray]) -> dict[str, str]:
    """Per bucket, what identifies its held-out entries ("" when none). A checkpoint refuses to
    resume when a bucket it shares with the run holds out other entries: its entry sets, and so the
    sampler's cursors into them, would mean something else. A bucket only one side knows is fine (an
    anneal variant may add one)."""
    return {name: hashlib.sha256(np.ascontiguousarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16] if ids.size else ""
            for name, ids in sorted(heldout.items())}
