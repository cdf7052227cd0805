"""Reading one input shard (a WARC or JSONL file, gzip or not; a Parquet file; a Hugging Face
dataset saved to disk) into the `raw_documents` table.

One row per response/resource WARC record, JSONL line or table row, with the provenance columns of
`refinery.documents` and `raw`, the decoded payload (HTML for WARC responses, the text field for
JSONL and tables). Hostile input never stops the file: a bad record becomes one reject row
`ingest/<reason>` and reading goes on. Only a missing file, and a table without the source's
text (or id) column, raise.

- JSONL: every line is parsed on its own, so a bad line is one reject: `ingest/bad_json` (not
  JSON, not an object, or nested past the parser's recursion limit), `ingest/missing_text`,
  `ingest/lone_surrogate` (a `\ud800` escape, which no UTF-8 writer accepts), `ingest/bad_utf8`,
  `ingest/binary_payload`, `ingest/too_large`; a gzip stream cut short keeps every whole line
  before the cut and adds one `ingest/truncated_file` naming the offset.
- WARC: past a record FastWARC cannot read, reading resumes at the next `WARC/1.x` record start
  (plain files) or the next gzip member holding one (per-record gzip files). The bad stretch is
  one `ingest/bad_record` (a header that cannot be parsed, such as a 3 MB HTTP header),
  `ingest/bad_gzip_member` (a member that does not decompress) or `ingest/bad_content_length` (a
  record that does not end where its Content-Length says; what it read belongs to the records
  after it), and its detail names the byte range skipped. Damage with no record after it is one
  `ingest/truncated_file` with the range lost. A WARC compressed as one gzip member has no
  boundaries to resume at, so damage inside it ends reading there.
- Parquet and HF datasets (Arrow stream files listed in state.json; no `datasets` import): a row
  is a record, its fields read as a JSONL object's (`ingest/missing_text` for a null or non-string
  text; a binary column is decoded as UTF-8, `ingest/bad_utf8`). A row group that cannot be read
  is one `ingest/bad_rows` naming its rows, and the next is read; a file whose footer is gone, or
  an Arrow file cut short, is one `ingest/truncated_file` after the rows read before it.
- Handling one record (decoding, parsing) that raises or runs past `record_timeout_s` is that
  record's reject, `ingest/error` or `ingest/timeout` (refinery/stages/base.py).

Offsets: WARC `record_offset` is the record's byte offset in the file as stored (for a per-record
gzip WARC, the offset of its gzip member, so a reader can seek straight to it); JSONL
`record_offset` is the line's byte offset in the decompressed stream; a table's is the row's number
(across a dataset's Arrow files, a damaged file counting as one row).
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Iterator

import polars as pl

from refinery.stages.base import (
    DEFAULT_RECORD_TIMEOUT_S,
    ERROR_DETAIL_CHARS,
    Drop,
    StageOutput,
    StageStats,
    count_in_out,
    guarded,
    record_alarm,
    rejects_frame,
)
from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import EXCERPT_CHARS, PROVENANCE_SCHEMA, InputShard, make_doc_id

STAGE = "raw_documents"
RAW_SCHEMA: dict[str, pl.DataType] = {**PROVENANCE_SCHEMA, "raw": pl.String()}

# Above this fraction of invalid bytes a payload is garbage or in another encoding; below it (a
# stray byte in a footer, one mis-encoded name) replacement characters cost a few words of a real
# document.
MAX_INVALID_UTF8_FRACTION = 0.01
# Content types that are text even though they are not text/*.
_TEXTUAL_APPLICATION = re.compile(r"^application/([a-z0-9.+-]*\+)?(xml|json|javascript|ecmascript|x-javascript|xhtml\+xml)$")
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_CHARSET_SNIFF_BYTES = 4096
_JSONL_CHUNK = 1 << 20


# --------------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------------

_invalid_bytes = threading.local()


def _count_and_replace(err: UnicodeDecodeError) -> tuple[str, int]:
    _invalid_bytes.n += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("refinery_count_replace", _count_and_replace)


def decode_utf8(data: bytes) -> tuple[str, int]:
    """UTF-8 with each invalid sequence replaced by U+FFFD; also the number of invalid bytes."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        _invalid_bytes.n = 0
        text = data.decode("utf-8", errors="refinery_count_replace")
        return text, _invalid_bytes.n


def sniff_charset(payload: bytes, header_charset: str | None) -> str:
    """The payload's codec: the HTTP header's charset, else an HTML meta charset, else UTF-8.
    Unknown names fall back to UTF-8."""
    name = header_charset
    if not name:
        m = _META_CHARSET.search(payload, 0, _CHARSET_SNIFF_BYTES)
        name = m.group(1).decode("ascii") if m else None
    if not name:
        return "utf-8"
    try:
        info = codecs.lookup(name)
    except LookupError:
        return "utf-8"
    # bytes-to-bytes codecs (base64, zlib) are found by lookup but cannot decode to str
    return info.name if getattr(info, "_is_text_encoding", True) else "utf-8"


def is_textual(content_type: str, extract: ExtractConfig) -> bool:
    ct = content_type.lower()
    if ct.startswith("text/") or ct in extract.html_content_types:
        return True
    if any(ct.startswith(prefix) for prefix in extract.text_content_types):
        return True
    return bool(_TEXTUAL_APPLICATION.match(ct))


def _excerpt(payload: bytes) -> str:
    return payload[: EXCERPT_CHARS * 4].decode("utf-8", errors="replace")[:EXCERPT_CHARS]


# --------------------------------------------------------------------------------------------------
# Records as read, before they become rows
# --------------------------------------------------------------------------------------------------


@dataclass
class _Record:
    index: int
    offset: int
    url: str | None
    fetch_time: str | None
    content_type: str | None
    raw: str | None = None
    drop: Drop | None = None
    excerpt: str | None = None
    payload_bytes: int = 0


@dataclass
class _ReadResult:
    records: list[_Record] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n


def _text_or_drop(
    rec: _Record, payload: bytes, codec: str, result: _ReadResult, binary_reason: str | None
) -> _Record:
    """Decode `payload` into `rec.raw`, or set the drop that rejects it."""
    rec.payload_bytes = len(payload)
    if binary_reason is None and b"\x00" in payload:
        binary_reason = "NUL bytes in the payload"
    if binary_reason is not None:
        rec.drop = Drop("ingest/binary_payload", None, binary_reason)
        return rec
    if codec != "utf-8":
        rec.raw = payload.decode(codec, errors="replace")
        return rec
    rec.raw = _utf8_or_drop(rec, payload, result)
    return rec


def _utf8_or_drop(rec: _Record, data: bytes, result: _ReadResult) -> str | None:
    """`data` as UTF-8, with replacement below the invalid-byte limit; above it, None and the drop."""
    text, invalid = decode_utf8(data)
    if not invalid:
        return text
    fraction = invalid / len(data)
    if fraction > MAX_INVALID_UTF8_FRACTION:
        rec.drop = Drop("ingest/bad_utf8", fraction, f"{invalid} of {len(data)} bytes are not valid UTF-8")
        rec.excerpt = text[:EXCERPT_CHARS]
        return None
    result.count("utf8_replaced")
    return text


# --------------------------------------------------------------------------------------------------
# WARC
# --------------------------------------------------------------------------------------------------


_GZIP_MAGIC = b"\x1f\x8b"
# Small reads keep the copy of a finished member's unused input cheap on per-record gzip files.
_GZIP_CHECK_CHUNK = 64 * 1024


def gzip_damage_offset(path: str, start: int = 0, chunk: int = _GZIP_CHECK_CHUNK) -> int | None:
    """The byte offset of the first gzip member at or after `start` (a member boundary) that is cut
    short or corrupt, or None if every member is whole. FastWARC stops silently at a truncated
    member, so this is how we notice."""
    with open(path, "rb") as f:
        f.seek(start)
        member_start = start
        consumed = start  # compressed bytes fed to finished members and the current one
        d = zlib.decompressobj(wbits=31)
        pending = b""
        while True:
            data = pending or f.read(chunk)
            pending = b""
            if not data:
                break
            try:
                d.decompress(data)
            except zlib.error:
                return member_start
            if d.eof:
                used = len(data) - len(d.unused_data)
                consumed += used
                member_start = consumed
                pending = d.unused_data
                d = zlib.decompressobj(wbits=31)
            else:
                consumed += len(data)
        if consumed > member_start:
            return member_start  # a member started but never reached its end
    return None


def _is_gzip_member_start(path: str, offset: int) -> bool:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(2) == _GZIP_MAGIC


@dataclass
class _Segment:
    """What one pass of FastWARC over the file, from one offset, ended with."""

    start: int  # where this pass began
    index: int  # the last record index given out
    last_pos: int | None = None  # stream position and declared length of the last record read
    last_length: int = 0  # its WARC Content-Length
    last_row: int | None = None  # its place in result.records, when it became a row
    error: str | None = None  # why reading stopped before the end of the file
    cut_at: int | None = None  # a record whose payload ends early starts here


def _warc_segment(path: str, start: int, gzipped: bool, index: int, extract: ExtractConfig,
                  result: _ReadResult, budget: float | None) -> _Segment:
    """Read records from byte `start` (a record or gzip member start) until the end of the file or
    the first record FastWARC cannot parse."""
    from fastwarc.stream_io import GzipReader
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    wanted = WarcRecordType.response | WarcRecordType.resource
    seg = _Segment(start=start, index=index)
    # Given a bare path, FastWARC picks the codec by suffix and fails on a plain WARC named .gz, so
    # the codec is chosen here by content. A resumed pass reads through a Python file object (slower,
    # but only after damage), whose positions FastWARC reports as absolute file offsets.
    raw = open(path, "rb") if start else None
    if raw is not None:
        raw.seek(start)
    stream = GzipReader(raw or path, fsspec_args=False) if gzipped else (raw or path)
    try:
        with record_alarm(budget) as armed:
            for record in ArchiveIterator(stream, parse_http=True, stream_detect=False, fsspec_args=False):
                seg.index += 1
                seg.last_pos, seg.last_row = record.stream_pos, None
                seg.last_length = _warc_content_length(record)
                if not record.record_type & wanted:
                    result.count(f"skipped_{record.record_type}")
                    continue
                rec = guarded("ingest", budget, armed, _warc_row, record, seg.index, extract, result)
                if isinstance(rec, Drop):  # this record's own handling failed: a reject of its own
                    headers = record.headers
                    rec = _Record(seg.index, record.stream_pos, headers.get("WARC-Target-URI"),
                                  headers.get("WARC-Date"), None, drop=rec)
                if rec is None:
                    seg.cut_at = record.stream_pos
                    break
                seg.last_row = len(result.records)
                result.records.append(rec)
    except OSError as err:  # FastWARC's error for an unparsable record or a broken stream
        seg.error = str(err) or type(err).__name__
    finally:
        if gzipped:
            stream.close()
        if raw is not None:
            raw.close()
    return seg


def _warc_content_length(record) -> int:
    """The record's declared block length (its WARC Content-Length; FastWARC's `content_length`
    is what is left after the HTTP headers it parsed)."""
    try:
        return int(record.headers.get("Content-Length") or -1)
    except ValueError:
        return -1


def _warc_row(record, index: int, extract: ExtractConfig, result: _ReadResult) -> _Record | None:
    """The row of one response/resource record, or None when its payload ends before its
    declared length (the file is cut short there)."""
    headers = record.headers
    content_type = record.http_content_type if record.is_http else headers.get("Content-Type")
    content_type = (content_type or "application/octet-stream").split(";")[0].strip().lower()
    rec = _Record(
        index=index,
        offset=record.stream_pos,
        url=headers.get("WARC-Target-URI"),
        fetch_time=headers.get("WARC-Date"),
        content_type=content_type,
    )
    declared, limit = record.content_length, extract.max_record_bytes
    if declared > limit:
        rec.payload_bytes = declared
        rec.excerpt = _excerpt(record.reader.read(EXCERPT_CHARS))
        rec.drop = Drop("ingest/too_large", float(declared), f"{declared} bytes > max_record_bytes {limit}")
        return rec
    payload = record.reader.read(declared + 1)
    if len(payload) < declared:
        return None
    binary = None if is_textual(content_type, extract) else f"content type {content_type}"
    codec = sniff_charset(payload, record.http_charset if record.is_http else None)
    return _text_or_drop(rec, payload, codec, result, binary)


def _read_warc(path: str, extract: ExtractConfig, result: _ReadResult, budget: float | None) -> None:
    """Every record FastWARC can read; past a record it cannot, reading resumes at the next record
    start (plain WARC) or the next gzip member that holds one (per-record gzip WARC), and the bytes
    in between become one reject that names their range."""
    gzipped = _is_gzip_member_start(path, 0)
    start: int | None = 0
    index = -1
    while start is not None:
        seg = _warc_segment(path, start, gzipped, index, extract, result, budget)
        index = seg.index
        start, index = _resynchronise(path, gzipped, seg, result)
    if index < 0 and not result.records:
        result.count("empty_file")


def _resynchronise(path: str, gzipped: bool, seg: _Segment, result: _ReadResult) -> tuple[int | None, int]:
    """Where reading goes on after `seg` (None: the file is done) and the last record index used;
    adds the reject for what was skipped."""
    rule = "ingest/bad_record"
    if seg.cut_at is not None:
        bad, why = seg.cut_at, "the record's payload ends before its Content-Length"
        seg.index -= 1  # the cut record's index goes to its reject
    elif seg.error is None:
        if not gzipped:
            return None, seg.index
        # FastWARC ends quietly at a cut-short or corrupt gzip member. Members before the last record
        # read are whole, so on a per-record gzip WARC only the tail is checked; a single-member
        # file (positions inside it are not boundaries) is checked whole.
        tail = seg.last_pos if seg.last_pos is not None and _is_gzip_member_start(path, seg.last_pos) else 0
        bad = gzip_damage_offset(path, tail)
        if bad is None:
            return None, seg.index
        rule, why = "ingest/bad_gzip_member", "gzip member cut short or corrupt"
    else:
        why = seg.error
        last = seg.last_pos if seg.last_pos is not None else seg.start
        if gzipped and not _is_gzip_member_start(path, last):
            # One gzip member for the whole file: no record boundary inside it can be reached.
            _add_truncation(result, seg.index + 1, last, f"{why} (inside the file's one gzip member, whose records "
                            "cannot be reached past it)", os.path.getsize(path))
            return None, seg.index + 1
        end = _record_end(path, seg.last_pos, seg.last_length, gzipped) if seg.last_pos is not None else None
        if end is None and seg.last_row is not None:
            # The last record read does not end where its Content-Length says: it is the bad one,
            # and what it read as its payload belongs to the records after it.
            resume = _next_record_start(path, last + 1, gzipped)
            rec = result.records[seg.last_row]
            stop = resume if resume is not None else os.path.getsize(path)
            rec.raw, rec.drop = None, Drop(
                "ingest/bad_content_length", float(seg.last_length),
                f"Content-Length {seg.last_length} does not end the record; bytes {last}..{stop} skipped "
                f"to the next record",
            )
            return resume, seg.index
        bad = end if end is not None else last
        if gzipped and gzip_damage_offset(path, bad) == bad:
            rule, why = "ingest/bad_gzip_member", f"corrupt gzip member ({why})"
    resume = _next_record_start(path, bad + 1, gzipped)
    index = seg.index + 1
    if resume is None:
        _add_truncation(result, index, bad, why, os.path.getsize(path))
        return None, index
    head = _record_head(path, bad, gzipped)
    url = _TARGET_URI.search(head)
    result.records.append(
        _Record(
            index=index,
            offset=bad,
            url=url.group(1).decode("utf-8", "replace") if url else None,
            fetch_time=None,
            content_type=None,
            drop=Drop(rule, float(resume - bad), f"bytes {bad}..{resume} unreadable: {why}"[:ERROR_DETAIL_CHARS]),
            excerpt=_excerpt(head),
            payload_bytes=resume - bad,
        )
    )
    return resume, index


_WARC_START = re.compile(rb"(?:^|\n)(WARC/1\.[01]\r?\n)")
_TARGET_URI = re.compile(rb"\nWARC-Target-URI:[ \t]*(\S{1,2000})")
_SCAN_CHUNK = 1 << 20
_HEAD_BYTES = 64 * 1024


def _next_record_start(path: str, after: int, gzipped: bool) -> int | None:
    """The offset of the first record start at or after `after`: a `WARC/1.x` line at the start of
    a line, or for a gzip WARC a gzip member whose content begins with one."""
    with open(path, "rb") as f:
        pos = after
        while True:
            # Look back a little so a marker that straddles two chunks is still found.
            back = min(pos, 16)
            f.seek(pos - back)
            chunk = f.read(_SCAN_CHUNK + back)
            if len(chunk) <= back:
                return None
            if gzipped:
                at = chunk.find(_GZIP_MAGIC + b"\x08", back)
                while at >= 0:
                    if _member_starts_warc(path, pos - back + at):
                        return pos - back + at
                    at = chunk.find(_GZIP_MAGIC + b"\x08", at + 1)
            else:
                for m in _WARC_START.finditer(chunk):
                    if m.start(1) >= back:
                        return pos - back + m.start(1)
            pos += len(chunk) - back


def _member_starts_warc(path: str, offset: int) -> bool:
    try:
        return _record_head(path, offset, True, 16).startswith(b"WARC/")
    except zlib.error:
        return False


def _record_head(path: str, offset: int, gzipped: bool, size: int = _HEAD_BYTES) -> bytes:
    """Up to `size` bytes of the record at `offset`, decompressed when the file is gzip."""
    with open(path, "rb") as f:
        f.seek(offset)
        if not gzipped:
            return f.read(size)
        try:
            return zlib.decompressobj(wbits=31).decompress(f.read(_HEAD_BYTES), size)
        except zlib.error:
            return b""


def _record_end(path: str, offset: int, length: int, gzipped: bool) -> int | None:
    """Where the record at `offset` ends when it ends where its Content-Length says (the block, then
    CRLF CRLF, and in a gzip WARC nothing else in its member); None when it does not."""
    with open(path, "rb") as f:
        f.seek(offset)
        if gzipped:
            d = zlib.decompressobj(wbits=31)
            data = b""
            while not d.eof:
                chunk = f.read(_SCAN_CHUNK)
                if not chunk:
                    return None
                try:
                    data += d.decompress(chunk)
                except zlib.error:
                    return None
                if len(data) > length + _SCAN_CHUNK:
                    return None  # far longer than one record: not a per-record member
            head_end = data.find(b"\r\n\r\n")
            rest = data[head_end + 4 + length :]
            if head_end < 0 or length < 0 or len(rest) < 4 or rest.strip(b"\r\n"):
                return None
            return f.tell() - len(d.unused_data)
        head = f.read(_HEAD_BYTES)
        head_end = head.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        end = offset + head_end + 4 + length
        f.seek(end)
        # The block must be followed by the CRLF CRLF that closes a record: a Content-Length that
        # lies ends inside other bytes (a payload, the next record's headers).
        return end + 4 if f.read(4) == b"\r\n\r\n" else None


def _add_truncation(result: _ReadResult, index: int, offset: int, detail: str, end: int | None = None) -> None:
    """The reject for a file whose tail, from `offset` (to `end`, the file's size, when known), cannot
    be read."""
    if end is not None:
        detail = f"{detail}; bytes {offset}..{end} unreadable"
    result.records.append(
        _Record(
            index=index,
            offset=offset,
            url=None,
            fetch_time=None,
            content_type=None,
            drop=Drop("ingest/truncated_file", float(offset), f"damaged at byte offset {offset}: {detail}"),
        )
    )


# --------------------------------------------------------------------------------------------------
# JSONL
# --------------------------------------------------------------------------------------------------


def _open_jsonl(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if _is_gzip_member_start(path, 0) else open(path, "rb")


def _lines(f: IO[bytes], limit: int) -> Iterator[tuple[int, bytes, int]]:
    """(offset, line, length) per line; a line longer than `limit` comes back as its first
    `limit + 1` bytes with its full length, and the rest is skipped without being kept."""
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
                if not rest or rest.endswith(b"\n"):
                    break
        yield offset, line, length
        offset += length


def _read_jsonl(
    path: str, source: SourceConfig, extract: ExtractConfig, result: _ReadResult, budget: float | None
) -> None:
    limit = extract.max_record_bytes
    index = -1
    reached = 0  # decompressed bytes read through the last whole line
    with _open_jsonl(path) as f, record_alarm(budget) as armed:
        try:
            for offset, line, length in _lines(f, limit):
                reached = offset + length
                if not line.strip():
                    result.count("blank_lines")
                    continue
                index += 1
                rec = _Record(index=index, offset=offset, url=None, fetch_time=None, content_type="text/plain")
                rec.payload_bytes = length
                result.records.append(rec)
                if length > limit:
                    rec.excerpt = _excerpt(line)
                    rec.drop = Drop("ingest/too_large", float(length), f"{length} bytes > max_record_bytes {limit}")
                else:
                    failed = guarded("ingest", budget, armed, _parse_json_line, rec, line, source, result)
                    if failed is not None:
                        rec.raw, rec.drop, rec.excerpt = None, failed, _excerpt(line)
        except (EOFError, OSError, zlib.error) as err:  # truncated or corrupt gzip
            _add_truncation(result, index + 1, reached, f"decompressed stream: {err}")
            return
    if index < 0:
        result.count("empty_file")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _parse_json_line(rec: _Record, line: bytes, source: SourceConfig, result: _ReadResult) -> None:
    text = _utf8_or_drop(rec, line, result)
    if text is None:
        return
    try:
        obj = json.loads(text)
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
    if not _take_fields(rec, obj, source, extract=None, result=result, excerpt=text):
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


def _take_fields(rec: _Record, obj: dict, source: SourceConfig, extract: ExtractConfig | None,
                 result: _ReadResult, excerpt: str) -> bool:
    """A record's url and text from its fields (a JSON object, a table row) into `rec`; False with
    the drop set when the text cannot be a document. `extract` bounds the text's size where nothing
    bounded the record before (a row of a table)."""
    url = obj.get(source.url_field)
    rec.url = url if isinstance(url, str) and url else None
    if rec.url is None and source.id_field is not None:
        ident = obj.get(source.id_field)
        # A record without a URL is named by its own id, so rejects and lineage can point at it.
        rec.url = str(ident) if isinstance(ident, (str, int)) and not isinstance(ident, bool) and ident != "" else None
    body = obj.get(source.text_field)
    if isinstance(body, bytes):  # a binary column: its bytes are meant to be UTF-8 text
        rec.payload_bytes = len(body)
        body = _utf8_or_drop(rec, body, result)
        if body is None:
            return False
    if not isinstance(body, str):
        kind = "missing" if body is None else f"a {type(body).__name__}"
        rec.drop = Drop("ingest/missing_text", None, f"field {source.text_field!r} is {kind}")
        rec.excerpt = excerpt[:EXCERPT_CHARS]
        return False
    if extract is not None:
        size = len(body.encode("utf-8", "surrogatepass")) if len(body) * 4 > extract.max_record_bytes else len(body)
        rec.payload_bytes = size
        if size > extract.max_record_bytes:
            rec.drop = Drop("ingest/too_large", float(size), f"{size} bytes > max_record_bytes {extract.max_record_bytes}")
            rec.excerpt = body[:EXCERPT_CHARS]
            return False
    if "\x00" in body:
        rec.drop = Drop("ingest/binary_payload", None, "NUL characters in the text field")
        return False
    rec.raw = body
    return True


# --------------------------------------------------------------------------------------------------
# Tables: Parquet files and Hugging Face datasets saved to disk
# --------------------------------------------------------------------------------------------------

_TABLE_BATCH_ROWS = 1024


class InputColumnError(ValueError):
    """A Parquet or Arrow input without a column its source names: no row of it can be read."""


def _table_columns(names: list[str], source: SourceConfig, path: str) -> list[str]:
    """The columns to read from a table with columns `names`; raises naming the missing field."""
    required = [("text_field", source.text_field)]
    if source.id_field is not None:
        required.append(("id_field", source.id_field))
    for field_name, column in required:
        if column not in names:
            raise InputColumnError(
                f"source {source.name!r}: {path} has no column {column!r} (the source's {field_name}); "
                f"its columns are {names}; set {field_name} to one of them"
            )
    wanted = [source.text_field, source.url_field, source.id_field]
    return [c for c in dict.fromkeys(wanted) if c is not None and c in names]


@dataclass
class _TableDamage:
    """Rows of a table that cannot be read, from where reading got to: `rows` of them (None: the
    rest of the file)."""

    rows: int | None
    detail: str


def _parquet_batches(path: str, source: SourceConfig) -> Iterator[Any]:
    """Record batches of the source's columns, row group by row group; a row group that cannot be
    read is one `_TableDamage` and reading goes on with the next."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a broken footer
        yield _TableDamage(None, f"not a readable Parquet file: {err}")
        return
    columns = _table_columns(pf.schema_arrow.names, source, path)
    for group in range(pf.num_row_groups):
        rows = pf.metadata.row_group(group).num_rows
        try:
            batches = list(pf.iter_batches(batch_size=_TABLE_BATCH_ROWS, row_groups=[group], columns=columns))
        except Exception as err:  # noqa: BLE001 - a corrupt page or column chunk
            yield _TableDamage(rows, f"row group {group} unreadable: {err}")
        else:
            yield from batches


def _hf_dataset_batches(path: str, source: SourceConfig) -> Iterator[Any]:
    """Record batches of a `save_to_disk` directory's Arrow stream files, in the order its
    state.json lists them; a file cut short or corrupt ends that file with one `_TableDamage`."""
    import pyarrow as pa

    state = os.path.join(path, "state.json")
    if not os.path.isfile(state):
        raise InputColumnError(f"source {source.name!r}: {path} is not a Hugging Face dataset saved with "
                               f"save_to_disk (no state.json); point the source's path at such a directory")
    with open(state) as f:
        files = [entry["filename"] for entry in json.load(f).get("_data_files", [])]
    for name in files:
        try:
            with pa.memory_map(os.path.join(path, name)) as source_file:
                reader = pa.ipc.open_stream(source_file)
                columns = _table_columns(reader.schema.names, source, f"{path}/{name}")
                for batch in reader:
                    yield batch.select(columns)
        except InputColumnError:
            raise
        except Exception as err:  # noqa: BLE001 - a missing, cut-short or corrupt Arrow stream
            yield _TableDamage(None, f"{name}: {err}")


def _read_table(path: str, source: SourceConfig, extract: ExtractConfig, result: _ReadResult,
                budget: float | None) -> None:
    """One row per record: the text column as the document, url and id columns as for JSONL;
    `record_offset` is the row's number in the file (in the dataset, for a Hugging Face dataset)."""
    batches = _parquet_batches(path, source) if source.format == "parquet" else _hf_dataset_batches(path, source)
    row = 0  # the next row's number; a damaged stretch is one reject numbered by its first row
    with record_alarm(budget) as armed:
        for batch in batches:
            if isinstance(batch, _TableDamage):
                span = f"rows {row}..{row + batch.rows}" if batch.rows is not None else f"rows from {row}"
                result.records.append(_Record(row, row, None, None, None, drop=Drop(
                    "ingest/bad_rows" if batch.rows is not None else "ingest/truncated_file", float(row),
                    f"{span} unreadable: {batch.detail}"[:ERROR_DETAIL_CHARS])))
                row += batch.rows or 1
                continue
            for obj in batch.to_pylist():
                rec = _Record(index=row, offset=row, url=None, fetch_time=None, content_type="text/plain")
                row += 1
                result.records.append(rec)
                failed = guarded("ingest", budget, armed, _take_row, rec, obj, source, extract, result)
                if failed is not None:
                    rec.raw, rec.drop = None, failed
    if not result.records:
        result.count("empty_file")


def _take_row(rec: _Record, obj: dict, source: SourceConfig, extract: ExtractConfig, result: _ReadResult) -> None:
    _take_fields(rec, obj, source, extract, result, excerpt=str(obj))


# --------------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------------


def config_relative_file(path: str, pattern: str) -> str:
    """The file named as the config names it (e.g. `../data/sample/web/web-00.warc.gz`), so the
    `file` column does not depend on where the checkout lives."""
    if os.path.isabs(pattern) or "://" in pattern:
        return path
    parts = pattern.split("/")
    fixed = 0
    while fixed < len(parts) - 1 and not any(c in parts[fixed] for c in "*?["):
        fixed += 1
    tail = len(parts) - fixed
    if "**" in parts[fixed:]:
        return path
    return "/".join(parts[:fixed] + path.split(os.sep)[-tail:])


def read_input_shard(
    shard: InputShard, source: SourceConfig, extract: ExtractConfig,
    record_timeout_s: float | None = DEFAULT_RECORD_TIMEOUT_S,
) -> StageOutput:
    """The `raw_documents` table for one input file, with its rejects and stats. Handling one
    record (decoding, parsing its JSON) that raises or runs past `record_timeout_s` is that
    record's reject, `ingest/error` or `ingest/timeout`."""
    start = time.perf_counter()
    exists = os.path.isdir if source.format == "hf_dataset" else os.path.isfile
    if not exists(shard.path):
        raise FileNotFoundError(
            f"input {shard.path} of source {source.name!r} (path {source.path!r}) does not exist; "
            f"fix the source's path or restore the file"
        )
    result = _ReadResult()
    if source.format == "warc":
        _read_warc(shard.path, extract, result, record_timeout_s)
    elif source.format == "jsonl":
        _read_jsonl(shard.path, source, extract, result, record_timeout_s)
    else:
        _read_table(shard.path, source, extract, result, record_timeout_s)

    records = result.records
    file_label = config_relative_file(shard.path, source.path)
    table = pl.DataFrame(
        {
            "doc_id": [make_doc_id(shard.key, r.index) for r in records],
            "url": [r.url for r in records],
            "source": [shard.source] * len(records),
            "bucket": [shard.bucket] * len(records),
            "file": [file_label] * len(records),
            "record_index": [r.index for r in records],
            "record_offset": [r.offset for r in records],
            "fetch_time": [r.fetch_time for r in records],
            "content_type": [r.content_type for r in records],
            "raw": [r.raw for r in records],
            "_excerpt": [r.excerpt for r in records],
        },
        schema={**RAW_SCHEMA, "_excerpt": pl.String()},
    )
    drops = {i: r.drop for i, r in enumerate(records) if r.drop is not None}
    rejects = rejects_frame(table, STAGE, drops, text_column="_excerpt")
    documents = table.filter(pl.Series([r.drop is None for r in records], dtype=pl.Boolean)).drop("_excerpt")

    stats = StageStats(stage=STAGE)
    count_in_out(stats, table, documents, column="raw")
    for i in drops:
        # rejected records have no `raw`; count the bytes they occupied in the input
        stats.bytes_in += records[i].payload_bytes
        stats.by_bucket[shard.bucket].bytes_in += records[i].payload_bytes
    for rule in (d.rule for d in drops.values()):
        stats.dropped[rule] += 1
    stats.counters.update(result.counters)
    stats.wall_s = time.perf_counter() - start
    return StageOutput(documents, rejects, stats)
