"""The JSONL reader: one row per line, `raw` the line's text field (`source.text_field`).

Every line is parsed on its own, so a bad line is one reject: `ingest/bad_json` (not JSON, not an
object, or nested past the parser's recursion limit), `ingest/missing_text`,
`ingest/lone_surrogate` (a `\\ud800` escape, which no UTF-8 writer accepts), `ingest/bad_utf8`,
`ingest/binary_payload`, `ingest/too_large`; a gzip stream cut short keeps every whole line before
the cut and adds one `ingest/truncated_file` naming the offset.
A UTF-8 byte order mark before the first line is dropped, and an integer longer than Python's
int conversion limit stays a string of its digits, so neither costs a valid record.

`record_offset` is the line's byte offset in the decompressed stream.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from typing import IO, Iterator

from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import EXCERPT_CHARS
from refinery.stages.isolation import guarded, record_alarm
from refinery.stages.readers.records import (
    RawRecord,
    ReadResult,
    add_truncation,
    compressed_position,
    excerpt_of,
    open_decompressed,
    take_fields,
    too_large,
    utf8_or_drop,
)
from refinery.stages.stats import Drop

_JSONL_CHUNK = 1 << 20


def _lines(f: IO[bytes], limit: int, stop_after: int) -> Iterator[tuple[int, bytes, int]]:
    """(offset, line, length) per line; a line longer than `limit` comes back as its first
    `limit + 1` bytes with its full length, and the rest is skipped without being kept (and
    without being read past byte `stop_after` of the stream: its length is then what was read)."""
    offset = 0
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        length = len(line)
        if len(line) > limit and not line.endswith(b"\n"):
            while True:
                rest = f.readline(_JSONL_CHUNK)
                length += len(rest)
                if not rest or rest.endswith(b"\n") or offset + length > stop_after:
                    break
        yield offset, line, length
        offset += length


def read_jsonl(
    path: str, source: SourceConfig, extract: ExtractConfig, result: ReadResult, budget: float | None
) -> None:
    limit = extract.max_record_bytes
    index = -1
    reached = 0  # decompressed bytes read through the last whole line
    with open_decompressed(path) as f, record_alarm(budget) as armed:
        try:
            for offset, line, length in _lines(f, limit, result.max_file_bytes):
                if result.past_file_bound(length, index + 1, offset) or result.past_inflation_bound(
                        lambda: compressed_position(f), index + 1, offset):
                    return
                reached = offset + length
                if offset == 0 and line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8) :]  # a byte order mark is no part of the first record
                if not line.strip():
                    result.count("blank_lines")
                    continue
                index += 1
                rec = RawRecord(index=index, offset=offset, url=None, fetch_time=None, content_type="text/plain")
                rec.payload_bytes = length
                if length > limit:
                    rec.excerpt = excerpt_of(line)
                    rec.drop = too_large(length, limit)
                else:
                    failed = guarded("ingest", budget, armed, _parse_json_line, rec, line, source, result)
                    if failed is not None:
                        rec.raw, rec.drop, rec.excerpt = None, failed, excerpt_of(line)
                result.add(rec)
        except (EOFError, OSError, zlib.error) as err:  # truncated or corrupt gzip
            add_truncation(result, index + 1, reached, f"decompressed stream: {err}")
            return
    if index < 0:
        result.count("empty_file")


def _digits_beyond_int_limit(digits: str) -> int | str:
    """An integer field, or its digits as a string past Python's int conversion limit (4300 digits
    by default, sys.get_int_max_str_digits()): such a number in a field we never read costs
    nothing, and an id field keeps its exact digits."""
    try:
        return int(digits)
    except ValueError:
        return digits


def _json_object(text: str):
    """`json.loads`, except that an integer too long for Python's int conversion is no error; the
    slower hook runs only on a line that failed."""
    try:
        return json.loads(text)
    except ValueError as err:
        try:
            return json.loads(text, parse_int=_digits_beyond_int_limit)
        except ValueError:
            raise err from None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _parse_json_line(rec: RawRecord, line: bytes, source: SourceConfig, result: ReadResult) -> None:
    text = utf8_or_drop(rec, line, result)
    if text is None:
        return
    try:
        obj = _json_object(text)
    except ValueError as err:
        rec.drop = Drop("ingest/bad_json", None, str(err)[:200])
        rec.excerpt = text[:EXCERPT_CHARS]
        return
    except RecursionError:
        rec.drop = Drop("ingest/bad_json", None, "arrays or objects nested deeper than the parser's recursion limit")
        rec.excerpt = text[:EXCERPT_CHARS]
        return
    if not isinstance(obj, dict):
        rec.drop = Drop("ingest/bad_json", None, f"a JSON {type(obj).__name__}, not an object")
        rec.excerpt = text[:EXCERPT_CHARS]
        return
    if not take_fields(rec, obj, source, extract=None, result=result, excerpt=text):
        return
    # A JSON escape such as "\ud800" gives a lone surrogate, which no UTF-8 writer (Parquet's) accepts.
    if _SURROGATE_ESCAPE.search(text):
        for field_name, value in ((source.text_field, rec.raw), (source.url_field, rec.url)):
            try:
                (value or "").encode("utf-8")
            except UnicodeEncodeError as err:
                rec.url, rec.raw = None, None
                rec.drop = Drop("ingest/lone_surrogate", float(err.start), f"field {field_name!r}: {err.reason} at {err.start}")
                rec.excerpt = text[:EXCERPT_CHARS]
                return


def sample_jsonl(path: str, records: int) -> tuple[list[str], list[dict]]:
    """The keys seen in the first `records` objects of a JSONL file (gzip or not), and those objects;
    a line that is no JSON object is passed over."""
    with open(path, "rb") as f:
        opener = gzip.open if f.read(2) == b"\x1f\x8b" else open
    objects = []
    with opener(path, "rb") as f:
        for line in f:
            if len(objects) >= records:
                break
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                objects.append(obj)
    return sorted({k for r in objects for k in r}), objects
