"""One input file's kept documents and rejects of a per-document stage, written a record batch at a
time: each batch one row group, published atomically when the file is done, its first rows kept as
the sample its asset shows.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import polars as pl

from refinery.documents import REJECTS_SCHEMA
from refinery.layout import ATTRIBUTE_STAGES, kept_documents_key, rejects_key
from refinery.stages.attributes import attribute_rows
from refinery.stages.parquet_batches import ParquetBatchWriter
from refinery.storage import DataRoot

# Documents an asset shows as its sample rows.
SAMPLE_ROWS = 3


class StageTables:
    """One file's kept documents and rejects of one stage, being written a batch at a time (each
    batch one row group), and its first SAMPLE_ROWS documents as the sample. The kept documents of a
    stage of `ATTRIBUTE_STAGES` are written as its attribute table (refinery/stages/attributes.py),
    the rest as a documents table."""

    def __init__(self, stage: str, partition: str, documents: ParquetBatchWriter, rejects: ParquetBatchWriter):
        self.stage = stage
        self.keys = (kept_documents_key(stage, partition), rejects_key(stage, partition))
        self.documents, self.rejects = documents, rejects
        self.sample: Optional[pl.DataFrame] = None

    def write_documents(self, batch: pl.DataFrame, upstream: Optional[pl.DataFrame] = None) -> None:
        """Write the kept documents `batch`; an attribute stage also passes the `upstream` batch
        they were kept from."""
        if self.sample is None:
            self.sample = batch.head(SAMPLE_ROWS)
        elif self.sample.height < SAMPLE_ROWS:
            self.sample = pl.concat([self.sample, batch.head(SAMPLE_ROWS - self.sample.height)])
        self.documents.write(attribute_rows(self.stage, upstream, batch) if self.stage in ATTRIBUTE_STAGES else batch)

    def write_rejects(self, batch: pl.DataFrame) -> None:
        self.rejects.write(batch)

    def hashes(self) -> dict[str, str]:
        """The sha256 of each table, once both are written whole."""
        return {self.keys[0]: self.documents.sha256, self.keys[1]: self.rejects.sha256}


@contextmanager
def stage_tables(root: DataRoot, stage: str, partition: str,
                 documents_schema: Optional[dict[str, pl.DataType]] = None) -> Iterator[StageTables]:
    """`StageTables` for one file, each table published atomically when the block ends cleanly
    (without `documents_schema`, the first documents batch sets it)."""
    with (root.writer(kept_documents_key(stage, partition)) as documents_path,
          root.writer(rejects_key(stage, partition)) as rejects_path,
          ParquetBatchWriter(documents_path, documents_schema) as documents,
          ParquetBatchWriter(rejects_path, REJECTS_SCHEMA) as rejects):
        yield StageTables(stage, partition, documents, rejects)
