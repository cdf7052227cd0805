"""Documents: the tables every stage reads and writes (tables.py: provenance columns, rejects) and the input files they come from (inputs.py: input discovery, input shards and
the batches of them that partition the per-document stages)."""

from refinery.documents import tables
from refinery.documents.inputs import (InputBatch, InputShard, batch_key, batch_shards, input_batches,
                                       input_file_state, input_files, input_key, input_shards)
from refinery.documents.tables import CLEAN_STAGE, EXCERPT_CHARS, PROVENANCE_COLUMNS, empty_rejects, make_doc_id

__all__ = [
    "CLEAN_STAGE", "EXCERPT_CHARS", "PROVENANCE_COLUMNS", "PROVENANCE_SCHEMA", "REJECTS_SCHEMA",
    "InputBatch", "InputShard", "batch_key", "batch_shards", "empty_rejects",
    "input_batches", "input_file_state", "input_files", "input_key", "input_shards", "make_doc_id",
]


def __getattr__(name: str):
    """`PROVENANCE_SCHEMA` and `REJECTS_SCHEMA`: tables.py's polars schemas, built on first use so that
    importing this package for its names and inputs does not import polars."""
    if name in tables.SCHEMA_TYPES:
        return tables.polars_schema(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
