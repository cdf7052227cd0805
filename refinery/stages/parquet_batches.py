"""Parquet files read and written a record batch at a time, so a stage's input and output never
have to be whole in memory.

`ParquetBatchWriter` makes each non-empty batch one row group, in the order written, with the
compression and statistics of every other table of the data root (refinery/storage/base.py): the
same batches give the same bytes. It writes to the path it is given (a data root's temporary file,
which the root publishes atomically); its sha256 is known once it is closed. `parquet_batches`
reads a table back row group by row group, in frames of a bounded number of rows and, when asked,
of bytes (the string and binary values a frame holds: `row_bytes`). `bounded_batches` cuts a frame
already in memory the same way, for a stage's inner loop. `matching_rows` reads only the rows where a
column equals a value (a query about one document: `refinery why`), a batch at a time, and skips the
row groups whose statistics rule the value out.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from refinery.storage.base import PARQUET_COMPRESSION, sha256_file

# Bytes of a column chunk read ahead at a time (pre-buffering would read whole column chunks).
READ_BUFFER_BYTES = 1 << 20
# A byte-bounded read decodes a row group in pieces of about this share of the bound, by its rows'
# mean size, so a frame is put together from a few pieces instead of `rows` rows decoded at once.
PIECES_PER_BATCH = 4


class ParquetBatchWriter:
    """Write DataFrames of one schema to `path` as row groups; use as a context manager. Without a
    `schema`, the first frame written (empty or not) sets it; later frames are cast to it."""

    def __init__(self, path: Any, schema: dict[str, pl.DataType] | None = None):
        self.path = path
        self.schema = schema
        self.rows = 0
        self.sha256: str | None = None  # set when the file is closed whole
        self._writer: pq.ParquetWriter | None = None

    def __enter__(self) -> "ParquetBatchWriter":
        if self.schema is not None:
            self._open(pl.DataFrame(schema=self.schema))
        return self

    def _open(self, first: pl.DataFrame) -> None:
        self.schema = dict(first.schema)
        self._writer = pq.ParquetWriter(str(self.path), first.head(0).to_arrow().schema,
                                        compression=PARQUET_COMPRESSION, write_statistics=True)

    def write(self, df: pl.DataFrame) -> None:
        if self._writer is None:
            self._open(df)
        if df.height == 0:
            return
        self._writer.write_table(df.select(list(self.schema)).cast(self.schema).to_arrow(), row_group_size=df.height)
        self.rows += df.height

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._writer is None:
            if exc_type is None:
                raise ValueError(f"nothing was written to {self.path}, and no schema was given to write it with")
            return
        self._writer.close()
        if exc_type is None:
            self.sha256 = sha256_file(self.path)


def row_bytes(frame: pl.DataFrame) -> np.ndarray:
    """Bytes of each row's string and binary values (a null counts 0), as int64: what a batch's
    byte bound counts. Other columns are left out: their size follows the rows, bounded apart."""
    sizes = [pl.col(c).str.len_bytes() if dtype == pl.String else pl.col(c).bin.size()
             for c, dtype in frame.schema.items() if dtype in (pl.String, pl.Binary)]
    if not sizes or frame.height == 0:
        return np.zeros(frame.height, dtype=np.int64)
    total = pl.sum_horizontal([size.fill_null(0).cast(pl.Int64) for size in sizes])
    return frame.select(total).to_series().to_numpy().astype(np.int64, copy=False)


def bounded_slices(sizes: np.ndarray, rows: int, max_bytes: int | None, held_rows: int = 0,
                   held_bytes: int = 0) -> Iterator[tuple[int, int, bool]]:
    """How to cut rows of the given `sizes` into batches of at most `rows` rows and `max_bytes`
    bytes (None: rows alone): consecutive `(offset, length, ends)` slices, where `ends` says the
    batch is full after this slice. The first slice adds to a batch that already holds `held_rows`
    rows and `held_bytes` bytes (carried over from the rows before `sizes`); a slice of length 0
    ends that batch. A row over `max_bytes` is a batch of its own."""
    cumulative = np.cumsum(sizes, dtype=np.int64)
    n, pos = len(sizes), 0
    while pos < n:
        base = int(cumulative[pos - 1]) if pos else 0
        take = min(rows - held_rows, n - pos)
        if max_bytes is not None:
            take = min(take, int(np.searchsorted(cumulative, base + max_bytes - held_bytes, side="right")) - pos)
        if take <= 0 and held_rows:
            yield pos, 0, True
            held_rows = held_bytes = 0
            continue
        take = max(take, 1)
        held_rows, held_bytes, pos = held_rows + take, held_bytes + int(cumulative[pos + take - 1]) - base, pos + take
        ends = held_rows >= rows or (max_bytes is not None and pos < n and held_bytes + int(sizes[pos]) > max_bytes)
        yield pos - take, take, ends
        if ends:
            held_rows = held_bytes = 0


def batch_spans(sizes: np.ndarray, rows: int, max_bytes: int | None) -> Iterator[tuple[int, int]]:
    """`(start, length)` of consecutive batches of rows of the given `sizes`: at most `rows` rows
    and `max_bytes` bytes each (None: rows alone), a row over the bound alone."""
    if max_bytes is None:
        for start in range(0, len(sizes), rows):
            yield start, min(rows, len(sizes) - start)
        return
    start = length = 0
    for _, count, ends in bounded_slices(sizes, rows, max_bytes):
        length += count
        if ends and length:
            yield start, length
            start, length = start + length, 0
    if length:
        yield start, length


def bounded_batches(frame: pl.DataFrame, rows: int, max_bytes: int | None) -> Iterator[pl.DataFrame]:
    """`frame` in consecutive slices of at most `rows` rows and `max_bytes` bytes (`row_bytes`; a
    row over the bound alone): a stage's inner batches, bounded whatever its documents' sizes."""
    sizes = row_bytes(frame) if max_bytes is not None else np.zeros(frame.height, dtype=np.int64)
    for start, length in batch_spans(sizes, rows, max_bytes):
        yield frame.slice(start, length)


def _piece_rows(pf: pq.ParquetFile, group: int, rows: int, max_bytes: int | None) -> int:
    """Rows decoded at a time from row group `group`: `rows`, or fewer when the group's mean row
    would fill a byte-bounded batch in fewer (`PIECES_PER_BATCH` pieces a batch)."""
    meta = pf.metadata.row_group(group)
    if max_bytes is None or meta.num_rows == 0:
        return rows
    mean = max(1, meta.total_byte_size // meta.num_rows)
    return max(1, min(rows, max_bytes // (PIECES_PER_BATCH * mean)))


def parquet_batches(path: Any, rows: int, columns: list[str] | None = None,
                    max_bytes: int | None = None) -> Iterator[pl.DataFrame]:
    """The table at `path` (or only `columns` of it), row group by row group, in frames of at most
    `rows` rows and, with `max_bytes`, at most that many bytes of string and binary values
    (`row_bytes`; a row over the bound is a frame of its own). A row group is decoded a piece at a
    time, so memory is a frame's and a piece's, whatever the row group's size. A frame never spans
    two row groups. A table without rows: one empty frame with its schema."""
    pf = pq.ParquetFile(str(path), pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
    if pf.metadata.num_rows == 0:
        empty = pf.schema_arrow.empty_table()
        yield pl.from_arrow(empty if columns is None else empty.select(columns))
        return
    for group in range(pf.num_row_groups):
        held: list[pl.DataFrame] = []
        held_rows = held_bytes = 0
        pieces = pf.iter_batches(batch_size=_piece_rows(pf, group, rows, max_bytes), row_groups=[group],
                                 columns=columns, use_threads=False)
        for piece in map(pl.from_arrow, pieces):
            sizes = row_bytes(piece) if max_bytes is not None else np.zeros(piece.height, dtype=np.int64)
            for offset, length, ends in bounded_slices(sizes, rows, max_bytes, held_rows, held_bytes):
                if length:
                    held.append(piece.slice(offset, length))
                    held_rows, held_bytes = held_rows + length, held_bytes + int(sizes[offset:offset + length].sum())
                if ends:
                    yield held[0] if len(held) == 1 else pl.concat(held, rechunk=True)
                    held, held_rows, held_bytes = [], 0, 0
        if held:
            yield held[0] if len(held) == 1 else pl.concat(held, rechunk=True)


def _may_hold(group: Any, names: list[str], where: dict[str, Any]) -> bool:
    """Whether a row group's min/max statistics leave room for a row matching `where` (no
    statistics, or values the statistics cannot be compared with: it may; no rows: it cannot)."""
    if group.num_rows == 0:
        return False
    for column, value in where.items():
        stats = group.column(names.index(column)).statistics
        if stats is None or not stats.has_min_max:
            return True
        try:
            if stats.min <= value <= stats.max:
                return True
        except TypeError:
            return True
    return False


def matching_rows(path: Any, where: dict[str, Any], columns: list[str] | None = None,
                  rows: int = 10_000) -> pl.DataFrame:
    """The rows of the table at `path` where any column named in `where` equals its value, in table
    order (only `columns` of them, in that order): each row group read in batches of at most `rows`
    rows, each batch cut to its matching rows, and every row group whose min/max statistics rule all
    the values out skipped unread. Memory is one batch and the matching rows, never the file; a table
    sorted by a column (doc ids in record order) is read only where the value can be."""
    pf = pq.ParquetFile(str(path), pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
    names = pf.schema_arrow.names
    shown = list(names) if columns is None else list(columns)
    read = list(dict.fromkeys([*shown, *where]))
    matches = pl.any_horizontal([pl.col(c) == v for c, v in where.items()])
    found = [pl.from_arrow(pa.Table.from_batches([], pf.schema_arrow).select(read))]  # (empty_table imports pandas)
    for group in range(pf.num_row_groups):
        if not _may_hold(pf.metadata.row_group(group), names, where):
            continue
        for batch in pf.iter_batches(batch_size=rows, row_groups=[group], columns=read, use_threads=False):
            found.append(pl.from_arrow(batch).filter(matches))
    return pl.concat(found).select(shown)
