"""The seeded, bucket-wide shuffle of entries (never tokens), in bounded memory.

Every entry of the bucket gets a 64-bit key from a counter-based hash of (seed, bucket, entry
number), so the permutation needs no state and does not depend on how the work is split. The
final order is the entries sorted by key, built in two passes:

1. Scatter: read the tokenized shards one at a time and append each entry's tokens and a fixed-width
   record (key, length, overlap, window, n_windows, quality, difficulty) to the run that owns its key range
   (`runs` equal ranges of the key space). Runs are buffered in memory up to a quarter of
   `shards.shuffle_buffer_mb` and appended to temp files when the buffer fills.
2. Gather: load one run at a time (runs are sized to hold about a quarter of the buffer each),
   sort it by key, and append its entries to the final shards.

Peak memory is one input shard, the scatter buffer, one run and one output shard, whatever the
bucket's size; bench/shuffle.py measures it.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import polars as pl

from refinery.hashing import splitmix64
from refinery.stages.tokenize import (
    FINAL,
    TOKENIZED,
    ShardSeries,
    staging_dir,
)
from refinery.layout import bucket_entries_key, shard_index_key
from refinery.shard_format import ShardFormatError, ShardReader
from refinery.storage import DataRoot

RECORD = np.dtype(
    [
        ("key", "<u8"),
        ("length", "<u4"),
        ("overlap", "<u4"),
        ("window", "<i4"),
        ("n_windows", "<i4"),
        ("quality", "<f8"),
        ("difficulty", "<f8"),
    ]
)
# A run's expected size is this fraction of the buffer; the scatter buffer takes the same share, so
# random variation in run sizes still leaves room for one input and one output shard.
RUN_FRACTION = 0.25


class ShuffleError(ValueError):
    """Tokenized shards that cannot be shuffled as they are (missing, corrupt, or changed)."""


def shuffle_keys(seed: int, bucket: str, first: int, count: int) -> np.ndarray:
    """Sort keys of entries first..first+count-1 of `bucket`: a seeded random permutation."""
    salt = int.from_bytes(hashlib.sha256(f"shuffle/{seed}/{bucket}".encode()).digest()[:8], "little")
    return splitmix64(np.arange(first, first + count, dtype=np.uint64) ^ np.uint64(salt))


def run_of(keys: np.ndarray, runs: int) -> np.ndarray:
    """The run owning each key: runs split the key space into equal, ordered ranges."""
    return ((keys >> np.uint64(32)) * np.uint64(runs)) >> np.uint64(32)


def load_index(root: DataRoot, stage: str, bucket: str, part: str | None = None) -> dict[str, Any]:
    key = shard_index_key(stage, bucket, part)
    if not root.exists(key):
        asset = f"tokenized_shards for input file {part!r}" if stage == TOKENIZED else f"shuffled_shards[{bucket}]"
        raise ShuffleError(f"{root.display(key)}: no shard index for bucket {bucket!r}; materialize {asset} first")
    return root.read_json(key)


def open_verified(root: DataRoot, ref: dict[str, Any]) -> ShardReader:
    """A reader over a shard named in an index, after checking each file's sha256 against it."""
    prefix = ref["prefix"]
    try:
        local = str(root.local_path(prefix + ".idx"))[: -len(".idx")]
        reader = ShardReader(local)
        reader.verify(ref["sha256"])
    except FileNotFoundError as err:
        raise ShardFormatError(f"{root.display(prefix)}: shard file missing ({err}); rebuild the bucket's shards") from None
    return reader


@dataclass
class _RunFiles:
    tokens: Path
    records: Path
    ids: Path


class _Scatter:
    """Per-run buffers that spill to append-only files when their total passes `limit` bytes."""

    def __init__(self, folder: Path, runs: int, limit: int, dtype: np.dtype):
        self.files = [_RunFiles(folder / f"run-{r:05d}.bin", folder / f"run-{r:05d}.rec", folder / f"run-{r:05d}.ids")
                      for r in range(runs)]
        self.limit = limit
        self.dtype = dtype
        self._tokens: list[list[np.ndarray]] = [[] for _ in range(runs)]
        self._records: list[list[np.ndarray]] = [[] for _ in range(runs)]
        self._ids: list[list[str]] = [[] for _ in range(runs)]
        self._buffered = 0

    def add(self, run: int, tokens: np.ndarray, records: np.ndarray, ids: list[str]) -> None:
        self._tokens[run].append(tokens)
        self._records[run].append(records)
        self._ids[run].extend(ids)
        self._buffered += tokens.nbytes + records.nbytes + sum(len(i) for i in ids)
        if self._buffered >= self.limit:
            self.flush()

    def flush(self) -> None:
        for run, files in enumerate(self.files):
            if not self._records[run]:
                continue
            with open(files.tokens, "ab") as f:
                for chunk in self._tokens[run]:
                    chunk.tofile(f)
            with open(files.records, "ab") as f:
                np.concatenate(self._records[run]).tofile(f)
            with open(files.ids, "ab") as f:
                f.write(("\n".join(self._ids[run]) + "\n").encode())
            self._tokens[run], self._records[run], self._ids[run] = [], [], []
        self._buffered = 0


def plan_runs(total_tokens: int, itemsize: int, buffer_bytes: int) -> int:
    return max(1, math.ceil(total_tokens * itemsize / (buffer_bytes * RUN_FRACTION)))


def shard_entries(root: DataRoot, stage: str, bucket: str, shard: int, part: str | None = None) -> pl.DataFrame:
    """One shard's rows of the series' entry table (row groups of other shards are skipped)."""
    path = root.local_path(bucket_entries_key(stage, bucket, part))
    return pl.scan_parquet(path).filter(pl.col("shard") == shard).collect()


def _scatter(root: DataRoot, sources: Iterable[dict[str, Any]], seed: int, bucket: str, scatter: _Scatter,
             runs: int) -> None:
    first = 0
    for source in sources:
        part = source["part"]
        for number, ref in enumerate(source["shards"]):
            reader = open_verified(root, ref)
            n = len(reader)
            entries = shard_entries(root, TOKENIZED, bucket, number, part)
            if entries.height != n or not np.array_equal(entries["tokens"].to_numpy(), np.diff(reader.offsets)):
                raise ShuffleError(
                    f"{root.display(bucket_entries_key(TOKENIZED, bucket, part))}: rows of shard {number} do not "
                    f"match {ref['prefix']}.idx; rebuild tokenized_shards for input file {part!r}"
                )
            keys = shuffle_keys(seed, bucket, first, n)
            owner = run_of(keys, runs)
            offsets = reader.offsets
            records = np.empty(n, dtype=RECORD)
            records["key"] = keys
            records["length"] = entries["tokens"].to_numpy()
            records["overlap"] = reader.overlaps
            records["window"] = entries["window"].to_numpy()
            records["n_windows"] = entries["n_windows"].to_numpy()
            records["quality"] = entries["quality_score"].fill_null(np.nan).to_numpy()
            records["difficulty"] = entries["difficulty"].fill_null(np.nan).to_numpy()
            doc_ids = entries["doc_id"].to_list()
            if any("\n" in d for d in doc_ids):
                raise ShuffleError(f"{ref['prefix']}: a doc_id contains a newline; doc ids must be single-line")
            order = np.argsort(owner, kind="stable")
            bounds = np.searchsorted(owner[order], np.arange(runs + 1))
            for r in range(runs):
                picked = order[bounds[r] : bounds[r + 1]]
                if len(picked):
                    tokens = np.concatenate([reader.tokens[offsets[i] : offsets[i + 1]] for i in picked])
                    scatter.add(r, tokens, records[picked], [doc_ids[i] for i in picked])
            first += n
            del reader
    scatter.flush()


def _gather(files: _RunFiles, dtype: np.dtype, series: ShardSeries) -> None:
    if not files.records.exists():
        return
    records = np.fromfile(files.records, dtype=RECORD)
    tokens = np.fromfile(files.tokens, dtype=dtype)
    ids = files.ids.read_bytes().decode().split("\n")[:-1]
    starts = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(records["length"], dtype=np.int64, out=starts[1:])  # uint32 lengths: sum in int64 whatever the platform default
    for i in np.argsort(records["key"], kind="stable"):
        rec = records[i]
        quality = None if np.isnan(rec["quality"]) else float(rec["quality"])
        difficulty = None if np.isnan(rec["difficulty"]) else float(rec["difficulty"])
        series.add(tokens[starts[i] : starts[i + 1]], ids[i], int(rec["overlap"]), int(rec["window"]),
                   int(rec["n_windows"]), quality, difficulty)


@dataclass
class ShuffleResult:
    index: dict[str, Any]
    runs: int
    wall_s: float


# The difficulty histogram's bins: quantiles to 1/1000 nat, scores of 64 nats and more in the last bin.
DIFFICULTY_BIN, DIFFICULTY_BINS, DIFFICULTY_BATCH_ROWS = 1e-3, 64_000, 1 << 16


def bucket_difficulty(root: DataRoot, bucket: str) -> dict[str, Any]:
    """Count, mean and p10/p50/p90 of the difficulty of the final bucket's documents (one score per
    document: its first window's), streamed `DIFFICULTY_BATCH_ROWS` entries at a time into a histogram of
    fixed bins: memory does not grow with the bucket; a quantile is its bin's lower edge."""
    import pyarrow.parquet as pq

    counts = np.zeros(DIFFICULTY_BINS, dtype=np.int64)
    total, n = 0.0, 0
    table = pq.ParquetFile(root.local_path(bucket_entries_key(FINAL, bucket)))
    for batch in table.iter_batches(batch_size=DIFFICULTY_BATCH_ROWS, columns=["window", "difficulty"]):
        scores = batch.column("difficulty").to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN
        scores = scores[(batch.column("window").to_numpy(zero_copy_only=False) == 0) & ~np.isnan(scores)]
        total, n = total + float(scores.sum()), n + len(scores)
        counts += np.bincount(np.clip(scores / DIFFICULTY_BIN, 0, DIFFICULTY_BINS - 1).astype(np.int64), minlength=DIFFICULTY_BINS)
    if not n:
        return {"count": 0}
    cumulative = np.cumsum(counts)
    edges = [int(np.searchsorted(cumulative, q * n, side="left")) * DIFFICULTY_BIN for q in (0.1, 0.5, 0.9)]
    return {"count": n, "mean": round(total / n, 4), **{f"p{q}": round(e, 4) for q, e in zip((10, 50, 90), edges)}}


def load_source(root: DataRoot, bucket: str, part: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The tokenized series of input file `part`, checked to have been made with `fields`
    (`tokenize.series_fields`: the dtype, the tokenizer, the windowing)."""
    source = load_index(root, TOKENIZED, bucket, part)
    differ = [k for k in fields if source.get(k) != fields[k]]
    if differ:
        raise ShuffleError(
            f"{root.display(shard_index_key(TOKENIZED, bucket, part))}: tokenized with another "
            f"{', '.join(differ)} than the current tokenizer and config; materialize tokenized_shards for "
            f"input file {part!r} again"
        )
    return source


def shuffle_bucket(root: DataRoot, seed: int, bucket: str, parts: list[str], fields: dict[str, Any],
                   shard_tokens: int, buffer_mb: int) -> ShuffleResult:
    """Shuffle the tokenized series of `parts` (the bucket's input files, in input order, each made
    with `fields`) into `shards/final/<bucket>/` (see the module doc). A bucket without input files
    gets an empty final index. The series' indexes are read one at a time, twice (totals first,
    then the scatter), so memory does not grow with the bucket's file count."""
    t0 = time.perf_counter()
    dtype = np.dtype(fields["dtype"])
    entries = tokens = 0
    # The sha256 of the tokenized series' index.json hashes, in input order: what was shuffled.
    sources_digest = hashlib.sha256()
    for part in parts:
        source = load_source(root, bucket, part, fields)
        entries, tokens = entries + source["entries"], tokens + source["tokens"]
        sources_digest.update(root.sha256(shard_index_key(TOKENIZED, bucket, part)).encode())
    buffer_bytes = buffer_mb * 1024 * 1024
    runs = plan_runs(tokens, dtype.itemsize, buffer_bytes)
    extra = {
        "seed": seed,
        "runs": runs,
        "shuffle_buffer_mb": buffer_mb,
        "source_indexes_sha256": sources_digest.hexdigest(),
        "source_parts": len(parts),
        **{k: v for k, v in fields.items() if k != "dtype"},
    }
    work = staging_dir(root)
    try:
        scatter = _Scatter(work, runs, int(buffer_bytes * RUN_FRACTION), dtype)
        _scatter(root, (load_source(root, bucket, part, fields) for part in parts), seed, bucket, scatter, runs)
        with ShardSeries(root, FINAL, bucket, dtype, shard_tokens, extra) as series:
            for files in scatter.files:
                _gather(files, dtype, series)
                for path in (files.tokens, files.records, files.ids):
                    path.unlink(missing_ok=True)
            index = series.finish()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if (index["entries"], index["tokens"]) != (entries, tokens):
        raise ShuffleError(
            f"shuffle of {bucket!r} wrote {index['entries']} entries / {index['tokens']} tokens, "
            f"but the input has {entries} / {tokens}"
        )
    return ShuffleResult(index, runs, time.perf_counter() - t0)
