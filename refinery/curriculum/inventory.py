"""Inventory: what the final shuffled shards hold per bucket, read from the data root, and the
streamed reads of a bucket's entry table that a quality cut (quality_cut.py) and the difficulty bands
make, in memory that does not grow with the bucket.

A bucket may be read `max_epochs` times (OLMo-core's max repetition ratio), so demand is checked
against tokens x max_epochs (refinery/curriculum/contract.py). A phase with a quality cutoff draws
only from the top fraction of each bucket by `quality_score`; its demand is also checked against
that slice. Entries of a bucket are numbered globally across its final shards in shard order
(shard 0's entries first), so one integer names one entry of the bucket.

A bucket's totals are its index.json's per-shard counts (Python ints: exact past 2^32). Only a
quality cutoff or a band reads the per-entry table, and it streams it in batches of
`ENTRY_BATCH_ROWS`, one final shard's rows (`TableSlice`) a task.

Each pass runs as tasks (`refinery.tasks`: in this process, or fanned out over `partitions.workers`
processes by phase_manifests), one per final shard: a task reads its shard's rows of the entry table
(`TableSlice`) and returns that shard's counts, 64-bit token totals and score histogram; the step
adds them up in shard order, `TASK_CHUNK` tasks' results at a time, so neither a task nor the step
holds more than a shard's rows or a chunk's histograms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from refinery.curriculum.schedule import CurriculumError
from refinery.layout import final_index_key
from refinery.tasks import RunTasks, Task

if TYPE_CHECKING:
    from refinery.storage import DataRoot

# Entries read from a bucket's entry table at a time (shuffled_shards writes row groups of 65,536).
ENTRY_BATCH_ROWS = 65_536
# Tasks whose results the step holds at once before adding them up: a chunk of sparse histograms or
# of shards' kept ids.
TASK_CHUNK = 64


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
class TableSlice:
    """Rows [first, first + rows) of a bucket's entry table: what one manifest task reads (a final
    shard's entries, or a batch of rows). The table's last slice has `to_end`: it also reads any row
    past the index's count, so a table longer than its index.json is caught as a whole read would."""

    bucket: str
    table: str  # the entry table's data-root key
    first: int
    rows: int
    to_end: bool = False


def table_slices(bucket: str, table: str, shard_entries: list[int]) -> list[TableSlice]:
    """One slice per final shard, in shard order."""
    firsts = np.concatenate([[0], np.cumsum(shard_entries, dtype=np.int64)]).tolist()
    return [TableSlice(bucket, table, firsts[k], n, k == len(shard_entries) - 1) for k, n in enumerate(shard_entries)]


def inventory_slices(inv: BucketInventory) -> list[TableSlice]:
    assert inv.entries_table is not None
    return table_slices(inv.bucket, inv.entries_table, [s.entries for s in inv.shards])


class CountedTasks:
    """A `RunTasks` that counts the tasks it ran: phase_manifests reports the count as `tasks`."""

    def __init__(self, run_tasks: RunTasks):
        self.run_tasks, self.tasks = run_tasks, 0

    def __call__(self, task: Task, items: list) -> list:
        self.tasks += len(items)
        return self.run_tasks(task, items)


def run_chunked(run_tasks: RunTasks, task: Task, items: list) -> Iterator[Any]:
    """`task`'s results in item order, `TASK_CHUNK` items' results held at a time."""
    for start in range(0, len(items), TASK_CHUNK):
        yield from run_tasks(task, items[start:start + TASK_CHUNK])


def slice_batches(root: "DataRoot", part: TableSlice, columns: list[str]) -> Iterator[tuple[int, Any]]:
    """(global id of the batch's first row, a pyarrow RecordBatch of `columns`) over the slice's rows,
    at most `ENTRY_BATCH_ROWS` at a time, reading only the row groups that hold them. A missing or
    unreadable table is a CurriculumError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    end = math.inf if part.to_end else part.first + part.rows
    try:
        table = pq.ParquetFile(root.local_path(part.table))
        sizes = [table.metadata.row_group(g).num_rows for g in range(table.metadata.num_row_groups)]
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
        groups = [g for g, n in enumerate(sizes) if starts[g] < end and starts[g] + n > part.first]
        at = starts[groups[0]] if groups else part.first
        for batch in table.iter_batches(batch_size=ENTRY_BATCH_ROWS, row_groups=groups, columns=columns):
            lo, hi = max(part.first - at, 0), min(end - at, batch.num_rows)
            if hi > lo:
                yield at + lo, batch.slice(lo, int(hi - lo))
            at += batch.num_rows
    except (OSError, pa.ArrowException, KeyError) as err:
        raise CurriculumError(
            f"{root.display(part.table)}: not a readable entry table ({type(err).__name__}: {err}) at entries "
            f"{part.first}..{part.first + part.rows}; re-materialize shuffled_shards[{part.bucket}]"
        ) from None


@dataclass(frozen=True)
class EntryBatch:
    """Consecutive entries of a bucket's entry table, from global entry id `first`."""

    first: int
    tokens: np.ndarray  # int64
    first_window: np.ndarray  # bool: the entry is its document's first window (one per document)
    scores: np.ndarray  # float64, NaN where the document has no score
    languages: np.ndarray | None = None  # str objects (UNKNOWN_LANGUAGE for null), when asked for


UNKNOWN_LANGUAGE = "unknown"


def has_language(root: "DataRoot", table_key: str) -> bool:
    """Whether the entry table has a `language` column (tables written before it have none: one
    stratum, UNKNOWN_LANGUAGE)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return "language" in pq.ParquetFile(root.local_path(table_key)).schema_arrow.names
    except (OSError, pa.ArrowException):
        return False  # the read that follows refuses the table by name (slice_batches)


def batch_languages(batch: Any, n: int) -> np.ndarray:
    """The `language` column of a record batch as str objects, UNKNOWN_LANGUAGE for null or absent."""
    if "language" not in batch.schema.names:
        return np.full(n, UNKNOWN_LANGUAGE, dtype=object)
    values = batch.column("language").to_numpy(zero_copy_only=False).astype(object)
    values[np.equal(values, None)] = UNKNOWN_LANGUAGE
    return values


def entry_batches(root: "DataRoot", part: TableSlice, languages: bool = False) -> Iterator[EntryBatch]:
    """The slice's rows of the entry table, `ENTRY_BATCH_ROWS` entries at a time; with `languages`,
    their language too."""
    columns = ["tokens", "window", "quality_score"] + (["language"] if languages and has_language(root, part.table) else [])
    for first, batch in slice_batches(root, part, columns):
        scores = batch.column("quality_score").to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN
        yield EntryBatch(
            first=first,
            # Int32 in the table: widened before anything sums it
            tokens=batch.column("tokens").to_numpy(zero_copy_only=False).astype(np.int64),
            first_window=batch.column("window").to_numpy(zero_copy_only=False) == 0,
            scores=scores + 0.0,  # -0.0 becomes 0.0, which it equals
            languages=batch_languages(batch, batch.num_rows) if languages else None,
        )


def in_language(batch: EntryBatch, language: str | None) -> EntryBatch:
    """The batch's entries of `language` (all of them for None); `first` is kept, so only callers
    that need no entry ids use it."""
    if language is None:
        return batch
    mine = batch.languages == language
    return EntryBatch(batch.first, batch.tokens[mine], batch.first_window[mine], batch.scores[mine], batch.languages[mine])
