"""One reader per input format, each adding the records of one file to a `ReadResult` (which
hands them on in bounded batches):
warc.py (WARC, gzip or not), jsonl.py (JSONL, gzip or not), tables.py (Parquet, and Hugging Face
datasets saved to disk), over records.py (the record as read, its reject, the size limit, UTF-8
decoding, opening a gzip file). formats.py registers each format once (its file names, its column
check, its field sampler and its reader), for ingest (refinery/stages/ingest.py, which builds the
`raw_documents` table), preflight and `refinery init`.
"""

from refinery.stages.readers.formats import FORMATS, InputFormat, format_of_path, input_format, known_format
from refinery.stages.readers.records import RawRecord, ReadResult
from refinery.stages.readers.tables import InputColumnError
from refinery.stages.readers.warc import gzip_damage_offset

__all__ = ["FORMATS", "InputColumnError", "InputFormat", "RawRecord", "ReadResult", "format_of_path",
           "gzip_damage_offset", "input_format", "known_format"]
