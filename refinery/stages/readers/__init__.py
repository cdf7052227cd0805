"""One reader per input format, each adding the records of one file to a `ReadResult` (which
hands them on in bounded batches):
warc.py (WARC, gzip or not), jsonl.py (JSONL, gzip or not), tables.py (Parquet, and Hugging Face
datasets saved to disk), over records.py (the record as read, its reject, the size limit, UTF-8
decoding, opening a gzip file). formats.py registers each format once (its file names, its column
check, its field sampler and its reader), for ingest (refinery/stages/ingest.py, which builds the
`raw_documents` table), preflight and `refinery init`.
"""

from importlib import import_module

from refinery.stages.readers.formats import FORMATS, InputFormat, format_of_path, input_format, known_format

# The records and the readers, imported when first named (PEP 562): the format registry above is
# what preflight and a lineage query need, and it must not bring polars, pyarrow or FastWARC in.
_LAZY = {"RawRecord": "records", "ReadResult": "records", "InputColumnError": "tables", "gzip_damage_offset": "warc"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = ["FORMATS", "InputFormat", "format_of_path", "input_format", "known_format", *_LAZY]
