"""The seeded, bucket-wide shuffle of entries (never tokens), as tasks that fan out, in bounded memory.

Every entry of the bucket gets a 64-bit key from a counter-based hash of (seed, bucket, entry
number in the bucket's input order), so the permutation needs no state and does not depend on how
the work is split. The final order is the entries sorted by key. The key space is cut into `runs`
equal ranges, `runs` planned from the bucket's token total so that a range's expected tokens fill
`RUN_FRACTION` of `shards.shuffle_buffer_mb`, and the work runs as independent tasks
(`refinery.tasks`: in this process, or fanned out over `partitions.workers` processes):

1. Scatter, one task per input file (`scatter_file`): read the file's tokenized series one shard at
   a time, check it against its index, key its entries and append them grouped by range to the
   file's fragment in the work folder (tokens, fixed-width records, doc ids, and each block's
   bounds). The fragment is written under a temporary name and renamed when whole.
2. Gather, one task per key range (`gather_range`): read that range's blocks of every file's
   fragment, sort them by key and pack them into the range's shards (about `shard_tokens` each; the
   range's last shard may be short) with their entry table, in a folder renamed when whole.
3. Publish, in the calling process (cheap: no token is read): number the shards range-major, which
   is key order, move them into `shards/final/<bucket>/`, merge the ranges' entry tables
   renumbered into `entries.parquet`, write `index.json`, delete what an earlier run left.

Nothing under `shards/final/<bucket>/` changes before every task has succeeded. The bytes are a
pure function of (seed, inputs, shard_tokens, buffer): the same on a rerun and whatever number of
workers ran the tasks. Peak memory: a scatter task holds one input shard; a gather task one range's
entries (expected `RUN_FRACTION` of the buffer) and one output shard's bookkeeping; the publish
step one range's entry table. bench/shuffle.py measures the shuffle.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from refinery.dropped import series_refusal
from refinery.hashing import splitmix64
from refinery.layout import bucket_entries_key, bucket_shards_prefix, shard_index_key, shard_key
from refinery.shard_format import SHARD_SUFFIXES, ShardFormatError, ShardReader, shard_files
from refinery.global_steps.tokenize import (ENTRY_ROW_GROUP, ENTRY_TABLE_SCHEMA, FINAL, INDEX_VERSION, TOKENIZED, ShardSeries,
                                      publish_file, staging_dir)
from refinery.storage import DataRoot, LocalDataRoot
from refinery.tasks import RunTasks, in_process

RECORD = np.dtype(
    [
        ("key", "<u8"),
        ("length", "<u4"),
        ("overlap", "<u4"),
        ("window", "<i4"),
        ("n_windows", "<i4"),
        ("quality", "<f8"),
        ("difficulty", "<f8"),
        ("language", "S8"),  # lid.176 codes are 2-3 ASCII letters; b"" for none
    ]
)
# A key range's expected size is this fraction of the buffer, so random variation in range sizes
# still leaves a gather task room for the largest range and one output shard.
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


def plan_runs(total_tokens: int, itemsize: int, buffer_bytes: int) -> int:
    """How many key ranges: enough that a range's expected tokens fill `RUN_FRACTION` of the buffer."""
    return max(1, math.ceil(total_tokens * itemsize / (buffer_bytes * RUN_FRACTION)))


def shard_entries(root: DataRoot, stage: str, bucket: str, shard: int, part: str | None = None) -> pl.DataFrame:
    """One shard's rows of the series' entry table (row groups of other shards are skipped)."""
    path = root.local_path(bucket_entries_key(stage, bucket, part))
    return pl.scan_parquet(path).filter(pl.col("shard") == shard).collect()


@dataclass(frozen=True)
class ScatterTask:
    """One input file's series to scatter: its key `part`, its number `file` in the bucket's input
    order and `first`, the bucket's entry number of its first entry."""

    work: str
    seed: int
    bucket: str
    part: str
    file: int
    first: int
    runs: int
    dtype: str


@dataclass(frozen=True)
class GatherTask:
    """Key range `range` of the bucket, gathered from the fragments of `files` input files."""

    work: str
    bucket: str
    range: int
    files: int
    runs: int
    dtype: str
    shard_tokens: int


@dataclass
class RangeResult:
    """A gathered range: its shards (prefixes local to the range's folder) and totals."""

    range: int
    shards: list[dict[str, Any]]
    entries: int
    tokens: int
    documents: int
    loaded_bytes: int  # tokens, records and doc ids of the range, as the task held them


def fragment_dir(work: str | Path, file: int) -> Path:
    return Path(work) / f"file-{file:05d}"


def range_dir(work: str | Path, number: int) -> Path:
    return Path(work) / f"range-{number:05d}"


def _fresh(folder: Path) -> Path:
    """A new, empty temporary folder beside `folder` (a retried task's leftovers removed)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _checked_entries(root: DataRoot, bucket: str, part: str, number: int, ref: dict[str, Any],
                     reader: ShardReader) -> pl.DataFrame:
    entries = shard_entries(root, TOKENIZED, bucket, number, part)
    if entries.height != len(reader) or not np.array_equal(entries["tokens"].to_numpy(), np.diff(reader.offsets)):
        raise ShuffleError(
            f"{root.display(bucket_entries_key(TOKENIZED, bucket, part))}: rows of shard {number} do not "
            f"match {ref['prefix']}.idx; rebuild tokenized_shards for input file {part!r}"
        )
    if any("\n" in d for d in entries["doc_id"]):
        raise ShuffleError(f"{ref['prefix']}: a doc_id contains a newline; doc ids must be single-line")
    return entries


def scatter_file(root: DataRoot, task: ScatterTask, cache: dict) -> dict[str, int]:
    """Pass 1 for one input file: its entries, keyed, appended to its fragment grouped by range,
    one input shard at a time. `blocks.npy` holds the cumulative (entries, tokens, id bytes) at
    the start of every (input shard, range) block, shard-major, and one row past the last."""
    source = load_index(root, TOKENIZED, task.bucket, task.part)
    folder = fragment_dir(task.work, task.file)
    tmp = _fresh(folder)
    blocks = [(0, 0, 0)]
    first = task.first
    with open(tmp / "tokens.bin", "wb") as tokens_out, open(tmp / "records.bin", "wb") as records_out, \
            open(tmp / "ids.txt", "wb") as ids_out:
        for number, ref in enumerate(source["shards"]):
            reader = open_verified(root, ref)
            entries = _checked_entries(root, task.bucket, task.part, number, ref, reader)
            n = len(reader)
            keys = shuffle_keys(task.seed, task.bucket, first, n)
            owner = run_of(keys, task.runs)
            records = np.empty(n, dtype=RECORD)
            records["key"] = keys
            records["length"] = entries["tokens"].to_numpy()
            records["overlap"] = reader.overlaps
            records["window"] = entries["window"].to_numpy()
            records["n_windows"] = entries["n_windows"].to_numpy()
            records["quality"] = entries["quality_score"].fill_null(np.nan).to_numpy()
            records["difficulty"] = entries["difficulty"].fill_null(np.nan).to_numpy()
            records["language"] = np.array(entries["language"].fill_null("").to_list(), dtype="S8")
            doc_ids = entries["doc_id"].to_list()
            offsets = reader.offsets
            order = np.argsort(owner, kind="stable")
            bounds = np.searchsorted(owner[order], np.arange(task.runs + 1))
            for r in range(task.runs):
                picked = order[bounds[r] : bounds[r + 1]]
                n_tokens = 0
                ids = b""
                if len(picked):
                    chunk = np.concatenate([reader.tokens[offsets[i] : offsets[i + 1]] for i in picked])
                    chunk.tofile(tokens_out)
                    records[picked].tofile(records_out)
                    ids = "".join(doc_ids[i] + "\n" for i in picked).encode()
                    ids_out.write(ids)
                    n_tokens = len(chunk)
                e, t, b = blocks[-1]
                blocks.append((e + len(picked), t + n_tokens, b + len(ids)))
            first += n
            del reader
    np.save(tmp / "blocks.npy", np.asarray(blocks, dtype=np.int64))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)  # the fragment appears whole or not at all
    return {"entries": blocks[-1][0], "tokens": blocks[-1][1]}


def _read_range(task: GatherTask) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Range `task.range`'s records, tokens and doc ids from every file's fragment, in file order."""
    dtype = np.dtype(task.dtype)
    records, tokens, ids = [], [], []
    for file in range(task.files):
        folder = fragment_dir(task.work, file)
        blocks = np.load(folder / "blocks.npy")
        with open(folder / "records.bin", "rb") as rec_in, open(folder / "tokens.bin", "rb") as tok_in, \
                open(folder / "ids.txt", "rb") as ids_in:
            for block in range(task.range, len(blocks) - 1, task.runs):
                (e0, t0, b0), (e1, t1, b1) = blocks[block], blocks[block + 1]
                if e1 == e0:
                    continue
                rec_in.seek(e0 * RECORD.itemsize)
                records.append(np.frombuffer(rec_in.read((e1 - e0) * RECORD.itemsize), dtype=RECORD))
                tok_in.seek(t0 * dtype.itemsize)
                tokens.append(np.frombuffer(tok_in.read((t1 - t0) * dtype.itemsize), dtype=dtype))
                ids_in.seek(b0)
                ids.extend(ids_in.read(b1 - b0).decode().split("\n")[:-1])
    if not records:
        return np.zeros(0, dtype=RECORD), np.zeros(0, dtype=dtype), []
    return np.concatenate(records), np.concatenate(tokens), ids


def gather_range(root: DataRoot, task: GatherTask, cache: dict) -> RangeResult:
    """Pass 2 for one key range: its entries sorted by key, packed into shards of about
    `shard_tokens` tokens (a `ShardSeries` over the range's own folder), renamed into place whole."""
    records, tokens, ids = _read_range(task)
    loaded = records.nbytes + tokens.nbytes + sum(len(i) + 1 for i in ids)
    starts = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(records["length"], dtype=np.int64, out=starts[1:])  # uint32 lengths: sum in int64 whatever the platform default
    folder = range_dir(task.work, task.range)
    tmp = _fresh(folder)
    with ShardSeries(LocalDataRoot(tmp), FINAL, task.bucket, np.dtype(task.dtype), task.shard_tokens) as series:
        for i in np.argsort(records["key"], kind="stable"):
            rec = records[i]
            quality = None if np.isnan(rec["quality"]) else float(rec["quality"])
            difficulty = None if np.isnan(rec["difficulty"]) else float(rec["difficulty"])
            series.add(tokens[starts[i] : starts[i + 1]], ids[i], int(rec["overlap"]), int(rec["window"]),
                       int(rec["n_windows"]), quality, difficulty, rec["language"].decode() or None)
        index = series.finish()
    shutil.rmtree(tmp / ".staging", ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return RangeResult(task.range, index["shards"], index["entries"], index["tokens"], index["documents"], loaded)


def _publish(root: DataRoot, work: Path, bucket: str, dtype: np.dtype, ranges: list[RangeResult],
             extra: dict[str, Any]) -> dict[str, Any]:
    """Number the ranges' shards range-major (key order), move them into `shards/final/<bucket>/`,
    merge the ranges' entry tables renumbered, write index.json and delete stale files; returns
    the index, laid out as `ShardSeries.finish` lays out one series'."""
    import pyarrow.parquet as pq

    arrow_schema = pl.DataFrame(schema=ENTRY_TABLE_SCHEMA).to_arrow().schema
    table_path = work / "entries.parquet"
    table_writer = None
    shards: list[dict[str, Any]] = []
    staged: list[tuple[Path, str]] = []
    entries = 0
    for result in ranges:
        if not result.shards:
            continue
        local = LocalDataRoot(range_dir(work, result.range))
        table = pl.read_parquet(local.local_path(bucket_entries_key(FINAL, bucket)))
        first = entries  # the range's entry numbers count from 0
        for k, ref in enumerate(result.shards):
            number = len(shards)
            rows = table.filter(pl.col("shard") == k).with_columns(
                pl.col("entry") + first, pl.lit(number, dtype=pl.Int32).alias("shard"))
            if table_writer is None:
                table_writer = pq.ParquetWriter(table_path, arrow_schema, compression="zstd")
            table_writer.write_table(rows.to_arrow(), row_group_size=ENTRY_ROW_GROUP)
            key = shard_key(FINAL, bucket, number)
            staged.append((local.local_path(ref["prefix"] + ".idx").with_suffix(""), key))
            shards.append({**ref, "prefix": key})
            entries += ref["entries"]
    if table_writer is None:
        pq.write_table(arrow_schema.empty_table(), table_path, compression="zstd")
    else:
        table_writer.close()
    for prefix, key in staged:
        files = shard_files(prefix)
        for suffix in (".bin", ".entries.parquet", ".idx"):  # .idx last: it marks the shard complete
            publish_file(root, files[suffix], key + suffix)
    table_key = bucket_entries_key(FINAL, bucket)
    table_sha = hashlib.sha256(table_path.read_bytes()).hexdigest()
    publish_file(root, table_path, table_key)
    index = {
        "version": INDEX_VERSION,
        "stage": FINAL,
        "bucket": bucket,
        "dtype": str(dtype),
        "tokens": sum(r.tokens for r in ranges),
        "entries": entries,
        "documents": sum(r.documents for r in ranges),
        "shards": shards,
        "entries_table": {"key": table_key, "sha256": table_sha},
        **extra,
    }
    key = shard_index_key(FINAL, bucket)
    root.write_json(key, index)
    keep = {key, table_key} | {s["prefix"] + suffix for s in shards for suffix in SHARD_SUFFIXES}
    for stale in root.list(bucket_shards_prefix(FINAL, bucket)):
        if stale not in keep:
            root.delete(stale)
    return index


@dataclass
class ShuffleResult:
    index: dict[str, Any]
    runs: int
    wall_s: float
    tasks: int  # scatter tasks (one per input file) plus gather tasks (one per key range)
    largest_range_bytes: int  # the most a gather task held: one range's tokens, records and doc ids


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
    (`tokenize.series_fields`: the dtype, the tokenizer, the windowing), and still held: a series
    dropped once an earlier shuffle published (refinery/dropped.py) is refused in one line."""
    source = load_index(root, TOKENIZED, bucket, part)
    gone = series_refusal(root, bucket, part, f"shuffled_shards[{bucket}]")
    if gone:
        raise ShuffleError(gone)
    differ = [k for k in fields if source.get(k) != fields[k]]
    if differ:
        raise ShuffleError(
            f"{root.display(shard_index_key(TOKENIZED, bucket, part))}: tokenized with another "
            f"{', '.join(differ)} than the current tokenizer and config; materialize tokenized_shards for "
            f"input file {part!r} again"
        )
    return source


def shuffle_bucket(root: DataRoot, seed: int, bucket: str, parts: list[str], fields: dict[str, Any],
                   shard_tokens: int, buffer_mb: int, run_tasks: RunTasks | None = None) -> ShuffleResult:
    """Shuffle the tokenized series of `parts` (the bucket's input files, in input order, each made
    with `fields`) into `shards/final/<bucket>/` (see the module doc): a scatter task per file, a
    gather task per key range, both run by `run_tasks` (default: in this process), then the publish
    step here. A bucket without input files gets an empty final index. The series' indexes are read
    one at a time, so memory here does not grow with the bucket's file count beyond one small task
    description per file and range."""
    t0 = time.perf_counter()
    run_tasks = run_tasks or in_process(root)
    dtype = np.dtype(fields["dtype"])
    entries = tokens = 0
    firsts = []
    # The sha256 of the tokenized series' index.json hashes, in input order: what was shuffled.
    sources_digest = hashlib.sha256()
    for part in parts:
        source = load_source(root, bucket, part, fields)
        firsts.append(entries)
        entries, tokens = entries + source["entries"], tokens + source["tokens"]
        sources_digest.update(root.sha256(shard_index_key(TOKENIZED, bucket, part)).encode())
    runs = plan_runs(tokens, dtype.itemsize, buffer_mb * 1024 * 1024)
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
        scattered = run_tasks(scatter_file, [ScatterTask(str(work), seed, bucket, part, file, first, runs, str(dtype))
                                             for file, (part, first) in enumerate(zip(parts, firsts))])
        ranges = run_tasks(gather_range, [GatherTask(str(work), bucket, r, len(parts), runs, str(dtype), shard_tokens)
                                          for r in range(runs)])
        moved = (sum(s["entries"] for s in scattered), sum(s["tokens"] for s in scattered))
        gathered = (sum(r.entries for r in ranges), sum(r.tokens for r in ranges))
        if not moved == gathered == (entries, tokens):
            raise ShuffleError(
                f"shuffle of {bucket!r}: the input has {entries} entries / {tokens} tokens, the scatter moved "
                f"{moved[0]} / {moved[1]} and the gather wrote {gathered[0]} / {gathered[1]}; the tokenized "
                f"series changed during the shuffle? materialize shuffled_shards[{bucket}] again"
            )
        index = _publish(root, work, bucket, dtype, ranges, extra)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ShuffleResult(index, runs, time.perf_counter() - t0, len(parts) + runs,
                         max((r.loaded_bytes for r in ranges), default=0))
