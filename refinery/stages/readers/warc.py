"""The WARC reader: one row per response or resource record.

`raw` is the record's payload as a browser reads it (refinery/stages/readers/http.py: only the
statuses the source keeps, `ingest/http_status`; de-chunked; gzip, deflate and br decoded; decoded
with the charset its bytes are in); a payload that is not text by its content type, or holds NUL
bytes, is `ingest/binary_payload`. A record whose WARC header lines end in LF alone (FastWARC reads
it as one header line and runs into the next record) is one `ingest/bad_record` with its own URL,
and reading resumes at the next record. Past a record FastWARC cannot read, reading resumes at the next
`WARC/1.x` record start (plain files) or the next gzip member holding one (per-record gzip files).
The bad stretch is one `ingest/bad_record` (a header that cannot be parsed, such as a 3 MB HTTP
header), `ingest/bad_gzip_member` (a member that does not decompress) or
`ingest/bad_content_length` (a record that does not end where its Content-Length says; what it
read belongs to the records after it), and its detail names the byte range skipped. Damage with no
record after it is one `ingest/truncated_file` with the range lost. A WARC compressed as one gzip
member has no boundaries to resume at, so damage inside it ends reading there. Once the records'
blocks add up past `extract.max_file_bytes`, or a gzip WARC's past `extract.max_inflation_ratio`
times the compressed bytes read (`ReadResult.past_inflation_bound`), the rest of the file is one
`ingest/file_too_large`.

The HTTP status, content type and charset are FastWARC's own parsing of the HTTP headers. A
payload that is UTF-8 as it came (no codings, no BOM, declared UTF-8 or not at all) is checked and
kept as its bytes, which the table takes as they are (`RawRecord.raw`); only a payload that needs
decoding work goes through `decode_payload`, under the record's time budget.

`record_offset` is the record's byte offset in the file as stored (for a per-record gzip WARC, the
offset of its gzip member, so a reader can seek straight to it).
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass

from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import EXCERPT_CHARS
from refinery.stages.isolation import ERROR_DETAIL_CHARS, error_drop, guarded, record_alarm
from refinery.stages.readers.http import Rejected, decode_payload, http_body, plain_utf8
from refinery.stages.readers.records import (
    GZIP_MAGIC,
    RawRecord,
    ReadResult,
    add_truncation,
    excerpt_of,
    is_gzip_member_start,
    too_large,
)
from refinery.stages.stats import Drop

# Content types that are text even though they are not text/*.
_TEXTUAL_APPLICATION = re.compile(r"^application/([a-z0-9.+-]*\+)?(xml|json|javascript|ecmascript|x-javascript|xhtml\+xml)$")
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


@dataclass
class _Segment:
    """What one pass of FastWARC over the file, from one offset, ended with."""

    start: int  # where this pass began
    index: int  # the last record index given out
    last_pos: int | None = None  # stream position and declared length of the last record read
    last_length: int = 0  # its WARC Content-Length
    last_row: RawRecord | None = None  # its row, when it became one (still held by `result`: the last added)
    error: str | None = None  # why reading stopped before the end of the file
    cut_at: int | None = None  # a record whose payload ends early, or whose header lines end in LF, starts here
    cut_why: str = "the record's payload ends before its Content-Length"
    past_bound: bool = False  # the file decompressed past `extract.max_file_bytes`: reading ends


def _warc_segment(path: str, start: int, gzipped: bool, index: int, source: SourceConfig,
                  extract: ExtractConfig, result: ReadResult, budget: float | None) -> _Segment:
    """Read records from byte `start` (a record or gzip member start) until the end of the file or
    the first record FastWARC cannot parse."""
    from fastwarc.stream_io import GzipReader
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    wanted = WarcRecordType.response | WarcRecordType.resource
    seg = _Segment(start=start, index=index)
    checks = _FileChecks(source, extract)
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
                headers = header_fields(record.headers)
                seg.last_length = _warc_content_length(headers)
                if "\n" in "".join(headers.values()):
                    # LF-only header lines: FastWARC read them as one line and may have run on into
                    # the next record's headers and block, so nothing it says past here is trusted.
                    seg.cut_at, seg.cut_why = record.stream_pos, "WARC header lines end in LF, not CRLF"
                    break
                # The ratio is of the records before this one (whose compressed bytes are read):
                # a large first record of a real file is not taken for a bomb.
                if (gzipped and result.past_inflation_bound(stream.inner_tell, seg.index, record.stream_pos)) \
                        or result.past_file_bound(seg.last_length, seg.index, record.stream_pos):
                    seg.past_bound = True
                    break
                if not record.record_type & wanted:
                    result.count(f"skipped_{record.record_type}")
                    continue
                try:
                    rec = _warc_row(record, headers, seg.index, checks, result, budget, armed)
                except Exception as err:  # noqa: BLE001 - any failure of one record is that record's reject
                    rec = error_drop("ingest", err)
                if isinstance(rec, Drop):  # this record's own handling failed: a reject of its own
                    rec = RawRecord(seg.index, record.stream_pos, headers.get("warc-target-uri"),
                                    headers.get("warc-date"), None, drop=rec)
                if rec is None:
                    seg.cut_at = record.stream_pos
                    break
                seg.last_row = rec
                result.add(rec)
    except OSError as err:  # FastWARC's error for an unparsable record or a broken stream
        seg.error = str(err) or type(err).__name__
    finally:
        if gzipped:
            stream.close()
        if raw is not None:
            raw.close()
    return seg


def header_fields(header_map) -> dict[str, str]:
    """A FastWARC header map as a dict by lower-case name, the first of repeated names winning (as
    its `get` answers); one `astuples` costs less than one of its `get` calls."""
    return {name.lower(): value for name, value in reversed(header_map.astuples())}


class _FileChecks:
    """The source's and extract config's answers for one file, memoized: which HTTP statuses are
    kept (the 500 there are), and which content types are text (at most `_CONTENT_TYPES_HELD`
    remembered, so a file of made-up types costs its checks, not memory)."""

    def __init__(self, source: SourceConfig, extract: ExtractConfig):
        self.source, self.extract = source, extract
        self._statuses: dict[int, bool] = {}
        self._textual: dict[str, bool] = {}

    def keeps_status(self, status: int) -> bool:
        kept = self._statuses.get(status)
        if kept is None:
            kept = self.source.keeps_http_status(status)
            if 100 <= status <= 599:
                self._statuses[status] = kept
        return kept

    def is_textual(self, content_type: str) -> bool:
        textual = self._textual.get(content_type)
        if textual is None:
            textual = is_textual(content_type, self.extract)
            if len(self._textual) < _CONTENT_TYPES_HELD:
                self._textual[content_type] = textual
        return textual


_CONTENT_TYPES_HELD = 256


def _warc_content_length(headers: dict[str, str]) -> int:
    """The record's declared block length (its WARC Content-Length; FastWARC's `content_length`
    is what is left after the HTTP headers it parsed)."""
    try:
        return int(headers.get("content-length") or -1)
    except ValueError:
        return -1


def _warc_row(record, headers: dict[str, str], index: int, checks: _FileChecks, result: ReadResult,
              budget: float | None, armed: bool) -> RawRecord | Drop | None:
    """The row of one response/resource record (`headers`: its WARC headers, `header_fields`), or
    None when its payload ends before its declared length (the file is cut short there). A payload
    that needs decoding work (content or transfer codings, a BOM, a charset other than UTF-8, bytes
    that are not UTF-8) is decoded under the record's time budget, and an overrun or failure there is
    the Drop returned; UTF-8 text as it came is taken without one (a bounded decode in C, which an
    alarm could not interrupt anyway)."""
    is_http = record.is_http
    content_type = record.http_content_type if is_http else headers.get("content-type")
    content_type = (content_type or "application/octet-stream").split(";")[0].strip().lower()
    rec = RawRecord(index, record.stream_pos, headers.get("warc-target-uri"), headers.get("warc-date"), content_type)
    declared, limit = record.content_length, checks.extract.max_record_bytes
    rec.payload_bytes = declared
    if declared > limit:
        rec.excerpt = excerpt_of(record.reader.read(EXCERPT_CHARS))
        rec.drop = too_large(declared, limit)
        return rec
    payload = record.reader.read(declared + 1)
    if len(payload) < declared:
        return None
    if is_http:
        http = record.http_headers
        status = http.status_code
        if status is None or not checks.keeps_status(status):
            rec.excerpt = excerpt_of(payload)
            rec.drop = Drop("ingest/http_status", None if status is None else float(status),
                            f"HTTP {status or 'status unreadable'}; kept: "
                            f"{', '.join(map(str, checks.source.http_status_kept))}")
            return rec
    if not checks.is_textual(content_type):
        rec.drop = Drop("ingest/binary_payload", None, f"content type {content_type}")
        return rec
    codings = charset = None
    if is_http:
        charset = record.http_charset
        fields = header_fields(http)
        codings = (fields.get("transfer-encoding"), fields.get("content-encoding"))
        if not any(codings):
            codings = None
    chars = plain_utf8(payload, charset) if codings is None else None
    if chars is not None:
        rec.raw, rec.raw_chars = payload, chars
        return rec
    text = guarded("ingest", budget, armed, _decoded, rec, payload, codings, charset, limit, result)
    if isinstance(text, Drop):
        return text
    rec.raw = text
    return rec


def _decoded(rec: RawRecord, payload: bytes, codings: tuple[str | None, str | None] | None, charset: str | None,
             limit: int, result: ReadResult) -> str | None:
    """The payload's text after its codings are undone and its charset worked out (`rec.drop` set
    and None when it cannot be text)."""
    if codings is not None:
        try:
            payload = http_body(payload, codings[0], codings[1], limit)
        except Rejected as err:
            rec.drop, rec.excerpt = err.drop, excerpt_of(payload)
            return None
    return decode_payload(rec, payload, charset, result)


def read_warc(path: str, source: SourceConfig, extract: ExtractConfig, result: ReadResult,
              budget: float | None) -> None:
    """Every record FastWARC can read; past a record it cannot, reading resumes at the next record
    start (plain WARC) or the next gzip member that holds one (per-record gzip WARC), and the bytes
    in between become one reject that names their range."""
    gzipped = is_gzip_member_start(path, 0)
    start: int | None = 0
    index = -1
    while start is not None:
        seg = _warc_segment(path, start, gzipped, index, source, extract, result, budget)
        index = seg.index
        if seg.past_bound:
            return
        start, index = _resynchronise(path, gzipped, seg, result)
    if index < 0 and not result.read:
        result.count("empty_file")


def _resynchronise(path: str, gzipped: bool, seg: _Segment, result: ReadResult) -> tuple[int | None, int]:
    """Where reading goes on after `seg` (None: the file is done) and the last record index used;
    adds the reject for what was skipped."""
    rule = "ingest/bad_record"
    if seg.cut_at is not None:
        bad, why = seg.cut_at, seg.cut_why
        seg.index -= 1  # the cut record's index goes to its reject
    elif seg.error is None:
        if not gzipped:
            return None, seg.index
        # FastWARC ends quietly at a cut-short or corrupt gzip member. Members before the last record
        # read are whole, so on a per-record gzip WARC only the tail is checked; a single-member
        # file (positions inside it are not boundaries) is checked whole.
        tail = seg.last_pos if seg.last_pos is not None and is_gzip_member_start(path, seg.last_pos) else 0
        bad = gzip_damage_offset(path, tail)
        if bad is None:
            return None, seg.index
        rule, why = "ingest/bad_gzip_member", "gzip member cut short or corrupt"
    else:
        why = seg.error
        last = seg.last_pos if seg.last_pos is not None else seg.start
        if gzipped and not is_gzip_member_start(path, last):
            # One gzip member for the whole file: no record boundary inside it can be reached.
            add_truncation(result, seg.index + 1, last, f"{why} (inside the file's one gzip member, whose records "
                            "cannot be reached past it)", os.path.getsize(path))
            return None, seg.index + 1
        end = _record_end(path, seg.last_pos, seg.last_length, gzipped) if seg.last_pos is not None else None
        if end is None and seg.last_row is not None:
            # The last record read does not end where its Content-Length says: it is the bad one,
            # and what it read as its payload belongs to the records after it.
            resume = _next_record_start(path, last + 1, gzipped)
            rec = seg.last_row
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
        add_truncation(result, index, bad, why, os.path.getsize(path))
        return None, index
    head = _record_head(path, bad, gzipped)
    url = _TARGET_URI.search(head)
    result.add(
        RawRecord(
            index=index,
            offset=bad,
            url=url.group(1).decode("utf-8", "replace") if url else None,
            fetch_time=None,
            content_type=None,
            drop=Drop(rule, float(resume - bad), f"bytes {bad}..{resume} unreadable: {why}"[:ERROR_DETAIL_CHARS]),
            excerpt=excerpt_of(head),
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
                at = chunk.find(GZIP_MAGIC + b"\x08", back)
                while at >= 0:
                    if _member_starts_warc(path, pos - back + at):
                        return pos - back + at
                    at = chunk.find(GZIP_MAGIC + b"\x08", at + 1)
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


# --------------------------------------------------------------------------------------------------
# Payloads
# --------------------------------------------------------------------------------------------------


def is_textual(content_type: str, extract: ExtractConfig) -> bool:
    ct = content_type.lower()
    if ct.startswith("text/") or ct in extract.html_content_types:
        return True
    if any(ct.startswith(prefix) for prefix in extract.text_content_types):
        return True
    return bool(_TEXTUAL_APPLICATION.match(ct))
