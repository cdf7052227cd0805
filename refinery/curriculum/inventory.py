"""Inventory: what the final shuffled shards hold per bucket, read from the data root, and what a
phase with a quality cutoff keeps of it.

A bucket may be read `max_epochs` times (OLMo-core's max repetition ratio), so demand is checked
against tokens x max_epochs (refinery/curriculum/contract.py). A phase with a quality cutoff draws
only from the top fraction of each bucket by `quality_score`; its demand is also checked against
that slice. Entries of a bucket are numbered globally across its final shards in shard order
(shard 0's entries first), so one integer names one entry of the bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from refinery.config import RefineryConfig
from refinery.curriculum.schedule import CurriculumError
from refinery.layout import final_index_key

if TYPE_CHECKING:
    from refinery.storage import DataRoot



@dataclass(frozen=True)
class ShardRef:
    """One final shard, pinned by the sha256 of each of its files."""

    prefix: str  # data-root key without suffix, e.g. "shards/final/web/shard-00000"
    tokens: int
    entries: int
    sha256: dict[str, str]  # suffix (".bin", ".idx", ".entries.parquet") -> hex


@dataclass(frozen=True)
class BucketInventory:
    """A bucket's final shards in order, and per entry (in global entry order, shard 0 first) its
    tokens, doc_id and quality_score (NaN where the document has none)."""

    bucket: str
    shards: list[ShardRef]
    entry_tokens: np.ndarray  # int64
    doc_ids: list[str]
    quality: np.ndarray  # float64

    @property
    def tokens(self) -> int:
        return int(self.entry_tokens.sum())

    @property
    def entries(self) -> int:
        return len(self.entry_tokens)


def has_final_shards(root: "DataRoot", buckets: list[str] | tuple[str, ...]) -> bool:
    return any(root.exists(final_index_key(b)) for b in buckets)


def read_bucket_inventory(root: "DataRoot", bucket: str) -> BucketInventory:
    """The bucket's final shards from shuffled_shards' index.json and per-entry table. A bucket
    without an index has an empty inventory (0 tokens), which validation reports if it is weighted."""
    key = final_index_key(bucket)
    if not root.exists(key):
        return BucketInventory(bucket, [], np.zeros(0, dtype=np.int64), [], np.zeros(0))
    index = root.read_json(key)
    try:
        refs = [ShardRef(prefix=s["prefix"], tokens=int(s["tokens"]), entries=int(s["entries"]), sha256=dict(s["sha256"])) for s in index["shards"]]
        table_key = index["entries_table"]["key"]
    except (KeyError, TypeError) as err:
        raise CurriculumError(f"{root.display(key)}: malformed shard index ({err}); re-materialize shuffled_shards[{bucket}]") from None
    table = root.read_parquet(table_key, columns=["tokens", "doc_id", "quality_score"])
    # The table stores each entry's tokens as Int32, which polars sums in Int32: widen before summing.
    entry_tokens = table["tokens"].cast(pl.Int64).to_numpy()
    table_tokens = int(entry_tokens.sum())
    if table.height != sum(r.entries for r in refs) or table_tokens != sum(r.tokens for r in refs):
        raise CurriculumError(
            f"{root.display(table_key)}: {table.height} entries / {table_tokens} tokens, but {root.display(key)} "
            f"lists {sum(r.entries for r in refs)} / {sum(r.tokens for r in refs)}; re-materialize shuffled_shards[{bucket}]"
        )
    return BucketInventory(
        bucket=bucket,
        shards=refs,
        entry_tokens=entry_tokens,
        doc_ids=table["doc_id"].to_list(),
        quality=table["quality_score"].cast(float).fill_null(float("nan")).to_numpy().astype(np.float64),
    )


def read_inventory(root: "DataRoot", buckets: list[str] | tuple[str, ...]) -> dict[str, BucketInventory]:
    from refinery.progress import track

    return {b: read_bucket_inventory(root, b) for b in track(buckets, desc="validate: read bucket inventory", unit="bucket")}


@dataclass(frozen=True)
class QualitySelection:
    """The entries of a bucket a phase keeps under its quality cutoff."""

    entry_ids: np.ndarray  # sorted int64 global entry ids
    cutoff: float  # the lowest kept document score
    documents: int
    tokens: int


def select_top_quality(inv: BucketInventory, top_fraction: float) -> QualitySelection:
    """Keep the documents whose quality_score is at or above the score of the document ranked
    ceil(top_fraction x documents), best first, with every window of a kept document. Ties at
    the cutoff are all kept; a document without a score (empty text) is never kept."""
    doc_score = dict(zip(inv.doc_ids, inv.quality.tolist()))
    scored = np.array([s for s in doc_score.values() if not math.isnan(s)], dtype=np.float64)
    if scored.size == 0:
        return QualitySelection(entry_ids=np.zeros(0, dtype=np.int64), cutoff=math.inf, documents=0, tokens=0)
    keep_docs = max(1, math.ceil(top_fraction * len(doc_score)))
    cutoff = float(np.sort(scored)[::-1][min(keep_docs, scored.size) - 1])
    kept = np.flatnonzero(inv.quality >= cutoff).astype(np.int64)
    return QualitySelection(
        entry_ids=kept,
        cutoff=cutoff,
        documents=sum(1 for s in doc_score.values() if s >= cutoff),
        tokens=int(inv.entry_tokens[kept].sum()),
    )


def phase_selections(cfg: RefineryConfig, inventory: dict[str, BucketInventory]) -> dict[str, dict[str, QualitySelection]]:
    """For each phase with a quality cutoff: each non-empty bucket's kept entries."""
    assert cfg.curriculum is not None
    return {
        p.name: {b: select_top_quality(inv, p.quality_top_fraction) for b, inv in inventory.items() if inv.entries}
        for p in cfg.curriculum.phases
        if p.quality_top_fraction is not None
    }
