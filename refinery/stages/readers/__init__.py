"""One reader per input format, each adding the records of one file to a `ReadResult` (which
hands them on in bounded batches):
warc.py (WARC, gzip or not), jsonl.py (JSONL, gzip or not), tables.py (Parquet, and Hugging Face
datasets saved to disk), over records.py (the record as read, its reject, the size limit, UTF-8
decoding, opening a gzip file). refinery/stages/ingest.py picks the reader by the source's format
and builds the `raw_documents` table.
"""

from refinery.stages.readers.jsonl import read_jsonl
from refinery.stages.readers.records import RawRecord, ReadResult
from refinery.stages.readers.tables import InputColumnError, read_table
from refinery.stages.readers.warc import gzip_damage_offset, read_warc

__all__ = ["InputColumnError", "RawRecord", "ReadResult", "gzip_damage_offset", "read_jsonl", "read_table", "read_warc"]
