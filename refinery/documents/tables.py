"""Document tables: where they live in the data root, their provenance columns, and the rejects
table.

A document table is one Parquet file per partition. Every stage carries the provenance columns
through unchanged and may add its own (language, scores, cluster ids); `doc_id` and `url` are
never dropped. Removed documents go to a rejects table of a fixed schema.
"""

from __future__ import annotations

import polars as pl

# Provenance columns, present in every document table from raw_documents on.
PROVENANCE_SCHEMA: dict[str, pl.DataType] = {
    "doc_id": pl.String(),
    "url": pl.String(),
    "source": pl.String(),
    "bucket": pl.String(),
    "file": pl.String(),
    "record_index": pl.Int64(),
    "record_offset": pl.Int64(),
    "fetch_time": pl.String(),
    "content_type": pl.String(),
}
PROVENANCE_COLUMNS = list(PROVENANCE_SCHEMA)

REJECTS_SCHEMA: dict[str, pl.DataType] = {
    "doc_id": pl.String(),
    "url": pl.String(),
    "source": pl.String(),
    "bucket": pl.String(),
    "stage": pl.String(),
    "rule": pl.String(),
    "value": pl.Float64(),
    "detail": pl.String(),
    "excerpt": pl.String(),
}
EXCERPT_CHARS = 500
# The last document stage of the funnel: what gets tokenized, and what lineage and scans read.
CLEAN_STAGE = "pii_redacted"


def empty_rejects() -> pl.DataFrame:
    return pl.DataFrame(schema=REJECTS_SCHEMA)


def make_doc_id(partition: str, record_index: int) -> str:
    """Stable, readable, and unique across the corpus: the input shard plus the record's index."""
    return f"{partition}/{record_index:07d}"
