"""Inventory: what the final shuffled shards hold per bucket, read from the data root, and what a
phase with a quality cutoff keeps of it, in memory that does not grow with the bucket.

A bucket may be read `max_epochs` times (OLMo-core's max repetition ratio), so demand is checked
against tokens x max_epochs (refinery/curriculum/contract.py). A phase with a quality cutoff draws
only from the top fraction of each bucket by `quality_score`; its demand is also checked against
that slice. Entries of a bucket are numbered globally across its final shards in shard order
(shard 0's entries first), so one integer names one entry of the bucket.

A bucket's totals are its index.json's per-shard counts (Python ints: exact past 2^32). Only a
quality cutoff reads the per-entry table, and it streams it in batches of `ENTRY_BATCH_ROWS`:
histograms of the scores' leading bits, 16 bits a pass, narrow the cutoff to one bin, and once a bin
holds at most `BRACKET_ENTRIES` entries their scores are read and the cutoff found exactly. The
cutoff, kept documents, entries and tokens are exactly those of ranking every document at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np

from refinery.config import RefineryConfig
from refinery.curriculum.schedule import CurriculumError
from refinery.layout import final_index_key

if TYPE_CHECKING:
    from refinery.storage import DataRoot

# Entries read from a bucket's entry table at a time (shuffled_shards writes row groups of 65,536).
ENTRY_BATCH_ROWS = 65_536
# The most entries whose scores are held at once to find a cutoff exactly: 17 bytes each (a 64-bit
# score key, 64-bit tokens, a flag), so 17 MiB.
BRACKET_ENTRIES = 1 << 20
# Bits of the score key one histogram pass resolves: 65,536 bins of three 64-bit counts, 1.5 MiB.
LEVEL_BITS = 16
KEY_BITS = 64


@dataclass(frozen=True)
class ShardRef:
    """One final shard, pinned by the sha256 of each of its files."""

    prefix: str  # data-root key without suffix, e.g. "shards/final/web/shard-00000"
    tokens: int
    entries: int
    sha256: dict[str, str]  # suffix (".bin", ".idx", ".entries.parquet") -> hex


@dataclass(frozen=True)
class BucketInventory:
    """A bucket's final shards in order, and the key of its per-entry table (tokens, doc_id,
    window, quality_score per entry in global entry order; None for a bucket without shards)."""

    bucket: str
    shards: list[ShardRef]
    entries_table: str | None

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.shards)


def has_final_shards(root: "DataRoot", buckets: list[str] | tuple[str, ...]) -> bool:
    return any(root.exists(final_index_key(b)) for b in buckets)


def read_bucket_inventory(root: "DataRoot", bucket: str) -> BucketInventory:
    """The bucket's final shards from shuffled_shards' index.json. A bucket without an index has an
    empty inventory (0 tokens), which validation reports if it is weighted."""
    key = final_index_key(bucket)
    if not root.exists(key):
        return BucketInventory(bucket, [], None)
    index = root.read_json(key)
    try:
        refs = [ShardRef(prefix=s["prefix"], tokens=int(s["tokens"]), entries=int(s["entries"]), sha256=dict(s["sha256"])) for s in index["shards"]]
        table_key = index["entries_table"]["key"]
    except (KeyError, TypeError) as err:
        raise CurriculumError(f"{root.display(key)}: malformed shard index ({err}); re-materialize shuffled_shards[{bucket}]") from None
    return BucketInventory(bucket=bucket, shards=refs, entries_table=table_key)


def read_inventory(root: "DataRoot", buckets: list[str] | tuple[str, ...]) -> dict[str, BucketInventory]:
    from refinery.progress import track

    return {b: read_bucket_inventory(root, b) for b in track(buckets, desc="validate: read bucket inventory", unit="bucket")}


@dataclass(frozen=True)
class EntryBatch:
    """Consecutive entries of a bucket's entry table, from global entry id `first`."""

    first: int
    tokens: np.ndarray  # int64
    first_window: np.ndarray  # bool: the entry is its document's first window (one per document)
    scores: np.ndarray  # float64, NaN where the document has no score


def entry_batches(root: "DataRoot", inv: BucketInventory) -> Iterator[EntryBatch]:
    """The bucket's entry table, `ENTRY_BATCH_ROWS` entries at a time."""
    import pyarrow.parquet as pq

    assert inv.entries_table is not None
    first = 0
    table = pq.ParquetFile(root.local_path(inv.entries_table))
    for batch in table.iter_batches(batch_size=ENTRY_BATCH_ROWS, columns=["tokens", "window", "quality_score"]):
        scores = batch.column("quality_score").to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN
        yield EntryBatch(
            first=first,
            # Int32 in the table: widened before anything sums it
            tokens=batch.column("tokens").to_numpy(zero_copy_only=False).astype(np.int64),
            first_window=batch.column("window").to_numpy(zero_copy_only=False) == 0,
            scores=scores + 0.0,  # -0.0 becomes 0.0, which it equals
        )
        first += batch.num_rows


def score_keys(scores: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the (non-NaN) float64 scores: the sign bit flipped for positive
    scores, every bit for negative ones."""
    bits = scores.view(np.uint64)
    return np.where(bits >> np.uint64(63) != 0, ~bits, bits | np.uint64(1 << 63))


def key_score(key: int) -> float:
    bits = key & ~(1 << 63) if key >> 63 else ~key & (2**64 - 1)
    return float(np.array(bits, dtype=np.uint64).view(np.float64))


@dataclass
class Kept:
    """What a cutoff keeps: entries, their tokens and the documents they belong to."""

    entries: int = 0
    tokens: int = 0
    documents: int = 0

    def add_bins(self, hist: "ScoreHistogram", bins: slice) -> None:
        self.entries += int(hist.entries[bins].sum())
        self.tokens += int(hist.tokens[bins].sum())
        self.documents += int(hist.documents[bins].sum())


@dataclass(frozen=True)
class ScoreHistogram:
    """Per bin of the next `LEVEL_BITS` bits of the score key, over the scored entries whose key
    starts with a prefix: entries, documents (first windows) and tokens. Plus the whole table's
    entries, documents and tokens, scored or not."""

    entries: np.ndarray
    documents: np.ndarray
    tokens: np.ndarray
    table: Kept


def score_histogram(root: "DataRoot", inv: BucketInventory, prefix: int, fixed: int) -> ScoreHistogram:
    """One pass over the entry table: the histogram of the keys whose leading `fixed` bits are `prefix`."""
    bins = 1 << LEVEL_BITS
    entries, documents, tokens = (np.zeros(bins, dtype=np.int64) for _ in range(3))
    table = Kept()
    shift = np.uint64(KEY_BITS - fixed - LEVEL_BITS)
    for batch in entry_batches(root, inv):
        table.entries += len(batch.tokens)
        table.tokens += int(batch.tokens.sum())
        table.documents += int(batch.first_window.sum())
        scored = ~np.isnan(batch.scores)
        keys = score_keys(batch.scores[scored])
        inside = keys >> np.uint64(KEY_BITS - fixed) == np.uint64(prefix) if fixed else np.ones(len(keys), dtype=bool)
        binned = ((keys[inside] >> shift) & np.uint64(bins - 1)).astype(np.intp)
        entries += np.bincount(binned, minlength=bins)
        documents += np.bincount(binned[batch.first_window[scored][inside]], minlength=bins)
        # float64 weights are exact here: a batch's tokens stay far below 2^53
        tokens += np.bincount(binned, weights=batch.tokens[scored][inside], minlength=bins).astype(np.int64)
    return ScoreHistogram(entries, documents, tokens, table)


def check_table(root: "DataRoot", inv: BucketInventory, table: Kept) -> None:
    if (table.entries, table.tokens) != (inv.entries, inv.tokens):
        assert inv.entries_table is not None
        raise CurriculumError(
            f"{root.display(inv.entries_table)}: {table.entries} entries / {table.tokens} tokens, but "
            f"{root.display(final_index_key(inv.bucket))} lists {inv.entries} / {inv.tokens}; "
            f"re-materialize shuffled_shards[{inv.bucket}]"
        )


def bracket_cutoff(root: "DataRoot", inv: BucketInventory, prefix: int, fixed: int, rank: int, kept: Kept) -> int:
    """The key of the `rank`-th best document among the entries whose key starts with `prefix`
    (at most BRACKET_ENTRIES of them, read in one pass); adds what it keeps of them to `kept`."""
    keys, tokens, first_window = [], [], []
    for batch in entry_batches(root, inv):
        scored = ~np.isnan(batch.scores)
        batch_keys = score_keys(batch.scores[scored])
        inside = batch_keys >> np.uint64(KEY_BITS - fixed) == np.uint64(prefix)
        keys.append(batch_keys[inside])
        tokens.append(batch.tokens[scored][inside])
        first_window.append(batch.first_window[scored][inside])
    all_keys, all_tokens, all_first = np.concatenate(keys), np.concatenate(tokens), np.concatenate(first_window)
    cutoff = int(np.sort(all_keys[all_first])[::-1][rank - 1])
    kept_here = all_keys >= np.uint64(cutoff)
    kept.entries += int(kept_here.sum())
    kept.tokens += int(all_tokens[kept_here].sum())
    kept.documents += int((kept_here & all_first).sum())
    return cutoff


@dataclass(frozen=True)
class QualitySelection:
    """What a phase keeps of a bucket under its quality cutoff: the entries of the documents scoring
    at least `cutoff` (`kept_entry_ids` lists them)."""

    cutoff: float  # the lowest kept document score
    documents: int
    entries: int
    tokens: int


def select_top_quality(root: "DataRoot", inv: BucketInventory, top_fraction: float) -> QualitySelection:
    """Keep the documents whose quality_score is at or above the score of the document ranked
    ceil(top_fraction x documents), best first, with every window of a kept document. Ties at
    the cutoff are all kept; a document without a score (empty text) is never kept. Reads the entry
    table once per histogram level and once for the last bracket, never all of it at once."""
    kept = Kept()
    prefix = fixed = 0
    hist = score_histogram(root, inv, prefix, fixed)
    check_table(root, inv, hist.table)
    scored = int(hist.documents.sum())
    if scored == 0:
        return QualitySelection(cutoff=math.inf, documents=0, entries=0, tokens=0)
    rank = min(max(1, math.ceil(top_fraction * hist.table.documents)), scored)
    while True:
        # the highest bin whose documents, with those of every bin above it, reach `rank`
        above = np.cumsum(hist.documents[::-1])
        chosen = len(above) - 1 - int(np.searchsorted(above, rank))
        kept.add_bins(hist, slice(chosen + 1, None))
        rank -= int(hist.documents[chosen + 1:].sum())
        prefix, fixed = (prefix << LEVEL_BITS) | chosen, fixed + LEVEL_BITS
        if fixed == KEY_BITS:  # every entry of the bin has the cutoff's score
            kept.add_bins(hist, slice(chosen, chosen + 1))
            cutoff = prefix
            break
        if hist.entries[chosen] <= BRACKET_ENTRIES:
            cutoff = bracket_cutoff(root, inv, prefix, fixed, rank, kept)
            break
        hist = score_histogram(root, inv, prefix, fixed)
    return QualitySelection(cutoff=key_score(cutoff), documents=kept.documents, entries=kept.entries, tokens=kept.tokens)


def kept_entry_ids(root: "DataRoot", inv: BucketInventory, cutoff: float) -> Iterator[np.ndarray]:
    """The global ids of the entries scoring at least `cutoff`, ascending, one array per batch."""
    for batch in entry_batches(root, inv):
        yield batch.first + np.flatnonzero(batch.scores >= cutoff).astype(np.int64)


def phase_selections(cfg: RefineryConfig, root: "DataRoot", inventory: dict[str, BucketInventory]) -> dict[str, dict[str, QualitySelection]]:
    """For each phase with a quality cutoff: what it keeps of each non-empty bucket."""
    assert cfg.curriculum is not None
    return {
        p.name: {b: select_top_quality(root, inv, p.quality_top_fraction) for b, inv in inventory.items() if inv.entries}
        for p in cfg.curriculum.phases
        if p.quality_top_fraction is not None
    }
