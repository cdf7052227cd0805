"""Parquet files read and written a record batch at a time, so a stage's input and output never
have to be whole in memory.

`ParquetBatchWriter` makes each non-empty batch one row group, in the order written, with the
compression and statistics of every other table of the data root (refinery/storage/base.py): the
same batches give the same bytes. It writes to the path it is given (a data root's temporary file,
which the root publishes atomically); its sha256 is known once it is closed. `parquet_batches`
reads a table back row group by row group, in slices of a bounded number of rows.
"""

from __future__ import annotations

from typing import Any, Iterator

import polars as pl
import pyarrow.parquet as pq

from refinery.storage.base import PARQUET_COMPRESSION, sha256_file

# Bytes of a column chunk read ahead at a time (pre-buffering would read whole column chunks).
READ_BUFFER_BYTES = 1 << 20


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


def parquet_batches(path: Any, rows: int, columns: list[str] | None = None) -> Iterator[pl.DataFrame]:
    """The table at `path` (or only `columns` of it), row group by row group, in frames of at most
    `rows` rows (a table without rows: one empty frame with its schema)."""
    pf = pq.ParquetFile(str(path), pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
    if pf.metadata.num_rows == 0:
        empty = pf.schema_arrow.empty_table()
        yield pl.from_arrow(empty if columns is None else empty.select(columns))
        return
    for group in range(pf.num_row_groups):
        for batch in pf.iter_batches(batch_size=rows, row_groups=[group], columns=columns, use_threads=False):
            yield pl.from_arrow(batch)
