"""The validation entries held out of training (the anneal playbook, seed 000).

Held-out entries are whole documents, so no window of a held-out document is ever trained on: per
bucket, documents are ordered by a seeded hash of their doc_id, and the first ones are taken until
they hold at least `eval_entries_per_bucket` entries. The choice depends only on the seed and the
bucket's shards (the same in every phase). `training.data` removes these entries from every entry
set the sampler reads, and `training.validation` measures the loss on them.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from refinery.curriculum import BucketSlice, PhaseManifest
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
