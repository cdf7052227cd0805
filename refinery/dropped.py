"""Intermediate stores dropped once their last reader has run, and the one line a later reader says.

Two stores are read once and are each larger than the product at scale (docs/scale-out.md): an input
file's token series (`shards/tokenized/<bucket>/<file>/`), which only its bucket's shuffle reads, and
an input file's bottom-k sketches (`dedup/sketches/<file>.parquet`), which only near_deduped's
verification reads. Once the reader has written what it derives from them (the bucket's final
shards published; every band's edges joined into near_dup_clusters), the step that ran it drops
them and leaves a marker where they were: what was dropped, its bytes, which step dropped it and
which partition to materialize to have it back. The small files that later readers still use stay:
a series' index.json (its entry count numbers a bucket's entries for lineage, and the shuffle hashes
it) and the signatures table (doc_key to doc_id for `refinery why` and the ablations).

A reader that needs a dropped store (the shuffle or a band run again, `refinery lineage` on a
tokenized shard) raises with `refusal`, one line naming the partition to materialize again;
`refinery demo --changed` plans that partition before a planned reader runs (orchestration/changed.py).
Materializing the store again removes its marker (the series' `finish`, `compute_signatures`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refinery.config import RefineryConfig
from refinery.documents import input_batches
from refinery.layout import SKETCHES_PREFIX, bucket_shards_prefix, series_dropped_key, shard_index_key, sketches_dropped_key, sketches_key
from refinery.storage import DataRoot

TOKENIZED = "tokenized"  # the stage of the per-file token series (refinery/global_steps/tokenize.py)


@dataclass(frozen=True)
class Dropped:
    """What one drop removed: the input files whose store went, the stores (keys or key prefixes)
    and their bytes in all."""

    parts: list[str]
    stores: list[str]
    bytes: int

    def metadata(self) -> dict[str, Any]:
        """The dropping step's materialization entries: what is gone from the data root, in its view."""
        return {"dropped_stores": len(self.stores), "dropped_bytes": self.bytes}


def batch_of(cfg: RefineryConfig) -> dict[str, str]:
    """Input file key -> the key of its input batch (the partition of the per-file assets)."""
    return {shard.key: batch.key for batch in input_batches(cfg) for shard in batch.shards}


def _drop(root: DataRoot, keys: dict[str, int], store: str, marker: str, dropped_by: str, asset: str) -> int:
    """Delete `keys` (key -> bytes) of `store` and write its marker; returns the bytes freed."""
    freed = sum(keys.values())
    root.write_json(marker, {"store": store, "bytes": freed, "dropped_by": dropped_by, "materialize": asset})
    for key in keys:
        root.delete(key)
    return freed


def drop_token_series(root: DataRoot, cfg: RefineryConfig, bucket: str, parts: list[str]) -> Dropped:
    """Once `bucket`'s final shards are published: each of its files' token series (shards and entry
    table) deleted, its index.json kept, a marker beside it."""
    batches, done, stores, freed = batch_of(cfg), [], [], 0
    for part in parts:
        prefix = bucket_shards_prefix(TOKENIZED, bucket, part)
        marker = series_dropped_key(TOKENIZED, bucket, part)
        keys = {k: n for k, n in root.sizes(prefix).items() if k not in (shard_index_key(TOKENIZED, bucket, part), marker)}
        if not keys:
            continue
        freed += _drop(root, keys, prefix, marker, f"shuffled_shards[{bucket}]",
                       f"tokenized_shards[{batches.get(part, part)}]")
        done.append(part)
        stores.append(prefix)
    return Dropped(done, stores, freed)


def drop_sketches(root: DataRoot, cfg: RefineryConfig) -> Dropped:
    """Once near_dup_clusters has joined every band's edges: each input file's bottom-k sketches
    deleted, a marker in their place."""
    done, stores, freed = [], [], 0
    written = root.sizes(SKETCHES_PREFIX)
    for part, batch in batch_of(cfg).items():
        key = sketches_key(part)
        if key not in written:
            continue
        freed += _drop(root, {key: written[key]}, key, sketches_dropped_key(part), "near_dup_clusters",
                       f"dedup_signatures[{batch}]")
        done.append(part)
        stores.append(key)
    return Dropped(done, stores, freed)


def refusal(root: DataRoot, marker: str, needed_by: str) -> str | None:
    """The one line a reader that needs a dropped store says (None when the store was not dropped)."""
    if not root.exists(marker):
        return None
    note = root.read_json(marker)
    return (f"{root.display(note['store'])}: dropped by {note['dropped_by']} once its last reader had run "
            f"({note['bytes']} bytes), and {needed_by} needs it; materialize {note['materialize']} again")


def series_refusal(root: DataRoot, bucket: str, part: str, needed_by: str) -> str | None:
    return refusal(root, series_dropped_key(TOKENIZED, bucket, part), needed_by)


def sketches_refusal(root: DataRoot, part: str, needed_by: str) -> str | None:
    return refusal(root, sketches_dropped_key(part), needed_by)
