"""Document tables: where they live in the data root, their provenance columns, and the rejects
table.

A document table is one Parquet file per partition. Every stage carries the provenance columns
through unchanged and may add its own (language, scores, cluster ids); `doc_id` and `url` are
never dropped. Removed documents go to a rejects table of a fixed schema.

The schemas are written as polars type names (a list of one type for a list column, a dict for a
struct) and built into `PROVENANCE_SCHEMA` and
`REJECTS_SCHEMA` on first use (the module's `__getattr__`), so a reader of the column names alone (a
`refinery lineage` query) does not import polars.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

# Provenance columns, present in every document table from raw_documents on.
PROVENANCE_TYPES = {
    "doc_id": "String",
    "url": "String",
    "source": "String",
    "bucket": "String",
    "file": "String",
    "record_index": "Int64",
    "record_offset": "Int64",
    "fetch_time": "String",
    "content_type": "String",
}
PROVENANCE_COLUMNS = list(PROVENANCE_TYPES)

REJECTS_TYPES = {
    "doc_id": "String",
    "url": "String",
    "source": "String",
    "bucket": "String",
    "stage": "String",
    "rule": "String",
    "value": "Float64",
    "detail": "String",
    "excerpt": "String",
    # Every rule the document failed at its stage, in the order they run, the first being `rule`:
    # the heuristic stage measures a dropped document against every rule, so a rule that takes over
    # from another when a threshold moves is counted (`refinery compare`). A list of one elsewhere.
    "failures": [{"rule": "String", "value": "Float64"}],
}
# The polars schemas this module provides, by name, and the column types each is built from.
SCHEMA_TYPES = {"PROVENANCE_SCHEMA": PROVENANCE_TYPES, "REJECTS_SCHEMA": REJECTS_TYPES}
EXCERPT_CHARS = 500
# The last document stage of the funnel: what gets tokenized, and what lineage and scans read.
CLEAN_STAGE = "pii_redacted"


@functools.cache
def polars_schema(name: str) -> dict[str, pl.DataType]:
    """The schema `name` of SCHEMA_TYPES as polars types; one dict per name, as a constant would be."""
    import polars as pl

    return {column: _polars_type(dtype) for column, dtype in SCHEMA_TYPES[name].items()}


def _polars_type(spec: str | list | dict) -> pl.DataType:
    """A type name, `[item type]` (a list) or `{field: type}` (a struct) as a polars type."""
    import polars as pl

    if isinstance(spec, list):
        return pl.List(_polars_type(spec[0]))
    if isinstance(spec, dict):
        return pl.Struct({name: _polars_type(t) for name, t in spec.items()})
    return getattr(pl, spec)()


def __getattr__(name: str) -> dict[str, pl.DataType]:
    """`PROVENANCE_SCHEMA` and `REJECTS_SCHEMA`, built on first use."""
    if name in SCHEMA_TYPES:
        return polars_schema(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def empty_rejects() -> pl.DataFrame:
    import polars as pl

    return pl.DataFrame(schema=polars_schema("REJECTS_SCHEMA"))


# Input files whose records are rows of a table: their `record_offset` is the row's number, not a byte.
TABLE_SUFFIXES = (".parquet", ".arrow")
LINE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")


def record_position(file: str | None, record_index: int | None, record_offset: int | None) -> str:
    """Where a record sits in its input file, labelled as what the number is: a table's row (a
    Parquet file, a Hugging Face dataset folder), a JSONL record with its line's byte offset in the
    decompressed text, a WARC record at its byte offset."""
    name = (file or "").lower().rstrip("/")
    if name.endswith(TABLE_SUFFIXES) or "." not in name.rsplit("/", 1)[-1]:
        return f"row {record_offset}"
    if name.endswith(LINE_SUFFIXES):
        return f"line record {record_index}, at byte {record_offset} of the decompressed text"
    return f"record {record_index} at byte {record_offset}"


def make_doc_id(partition: str, record_index: int) -> str:
    """Stable, readable, and unique across the corpus: the input shard plus the record's index."""
    return f"{partition}/{record_index:07d}"
