"""What every reader shares: the record as read (a row or a reject), the bounded buffer records
pass through, the record size limit, UTF-8 decoding that counts what it replaces, and opening a
file that may be gzip.

A reader adds one `RawRecord` per record to a `ReadResult`, with `raw` set (a document) or `drop`
set (a reject, `ingest/<reason>`). The result hands its records on in batches, bounded by a row
count and a byte budget (`extract.batch_rows`, `extract.batch_bytes`), to a sink:
refinery/stages/ingest.py, which turns each batch into rows of the `raw_documents` table and its
rejects. So a reader holds at most one batch and one record, whatever the file's size.
"""

from __future__ import annotations

import codecs
import gzip
import threading
from dataclasses import dataclass, field
from typing import IO, Callable

from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import EXCERPT_CHARS
from refinery.stages.stats import Drop

# Above this fraction of invalid bytes a payload is garbage or in another encoding; below it (a
# stray byte in a footer, one mis-encoded name) replacement characters cost a few words of a real
# document.
MAX_INVALID_UTF8_FRACTION = 0.01
GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------------------------------
# Records as read, before they become rows
# --------------------------------------------------------------------------------------------------


@dataclass
class RawRecord:
    index: int
    offset: int
    url: str | None
    fetch_time: str | None
    content_type: str | None
    # The document's text; or its bytes, already checked to be UTF-8, which the table takes as they
    # are (a Python str of them would only be encoded back), with `raw_chars` its length in characters.
    raw: str | bytes | None = None
    drop: Drop | None = None
    excerpt: str | None = None
    payload_bytes: int = 0
    raw_chars: int = 0

    def held_bytes(self) -> int:
        """About how much memory the record holds (its text, excerpt and URL, in characters)."""
        text = self.raw_chars if isinstance(self.raw, bytes) else len(self.raw or "")
        return text + len(self.excerpt or "") + len(self.url or "") + 200


# A batch of records as the sink receives them, in the order they were read.
RecordSink = Callable[[list[RawRecord]], None]


@dataclass
class ReadResult:
    """The records read and not yet handed on, and the file's counters. `add` hands every record
    but the last to `sink` once the records held pass `batch_rows` or `batch_bytes`: the last one
    stays, because a reader may still learn that it was bad (a WARC record whose Content-Length
    lies) and turn it into a reject. Without a sink every record stays in `records`."""

    records: list[RawRecord] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    sink: RecordSink | None = None
    batch_rows: int = 1 << 62
    batch_bytes: int = 1 << 62
    read: int = 0  # records added in all, handed on or not
    held_bytes: int = 0  # `RawRecord.held_bytes` of `records`
    max_file_bytes: int = 1 << 62  # `extract.max_file_bytes`
    inflated: int = 0  # decompressed bytes of the file read so far (`past_file_bound`)
    max_inflation_ratio: float | None = None  # `extract.max_inflation_ratio`
    inflation_floor: int = 1 << 62  # `extract.inflation_floor_bytes`
    window_inflated: int = 0  # `inflated` where the current window of `past_inflation_bound` starts
    window_consumed: int = 0  # and the compressed bytes read by then

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def add(self, rec: RawRecord) -> None:
        self.records.append(rec)
        self.read += 1
        self.held_bytes += rec.held_bytes()
        if self.sink is not None and (len(self.records) > self.batch_rows or self.held_bytes > self.batch_bytes):
            self.flush(keep_last=True)

    def past_file_bound(self, size: int, index: int, offset: int) -> bool:
        """Count `size` decompressed bytes of the record at `offset`, about to be read; once the
        file's count passes `max_file_bytes`, add the reject of the rest of the file (from this
        record on) and answer True: the reader stops there."""
        self.inflated += max(size, 0)
        if self.inflated <= self.max_file_bytes:
            return False
        self.add(RawRecord(index=index, offset=offset, url=None, fetch_time=None, content_type=None, drop=Drop(
            "ingest/file_too_large", float(self.inflated),
            f"the file decompresses past max_file_bytes {self.max_file_bytes}: the rest of it, from record "
            f"{index} at offset {offset}, is not read")))
        return True

    def past_inflation_bound(self, consumed: Callable[[], int], index: int, offset: int,
                             whole_file: bool = False) -> bool:
        """Whether the file has inflated more than `max_inflation_ratio` times over its last
        `inflation_floor` decompressed bytes (or more): their count against the compressed bytes
        `consumed()` read meanwhile. A window of real text that passes starts the next, so a bomb
        appended to real pages is caught within two windows of its start. With `whole_file`,
        `consumed()` is the file's whole size and the one window is the whole file so far. If the
        bound is passed, add the reject of the rest of the file (from the record `index` at
        `offset` on) and answer True: the reader stops there. `consumed` may count bytes read ahead,
        which only lowers a window's ratio."""
        inflated = self.inflated - self.window_inflated
        if self.max_inflation_ratio is None or inflated <= self.inflation_floor:
            return False
        position = consumed()
        compressed = max(1, position - self.window_consumed)
        if inflated <= self.max_inflation_ratio * compressed:
            if not whole_file:
                self.window_inflated, self.window_consumed = self.inflated, position
            return False
        self.add(RawRecord(index=index, offset=offset, url=None, fetch_time=None, content_type=None, drop=Drop(
            "ingest/file_too_large", float(self.inflated),
            f"{inflated} bytes decompressed from {compressed} compressed ({inflated / compressed:.0f}x), past "
            f"max_inflation_ratio {self.max_inflation_ratio:g}: the rest of the file, from record {index} at "
            f"offset {offset}, is not read")))
        return True

    def flush(self, keep_last: bool = False) -> None:
        """Hand the records held to the sink (all but the last one when `keep_last`)."""
        if self.sink is None:
            return
        handed = self.records[:-1] if keep_last else self.records
        if not handed:
            return
        self.records = self.records[len(handed):]
        self.held_bytes = sum(r.held_bytes() for r in self.records)
        self.sink(handed)


def too_large(size: int, limit: int) -> Drop:
    """The reject of a record over `extract.max_record_bytes`."""
    return Drop("ingest/too_large", float(size), f"{size} bytes > max_record_bytes {limit}")


def excerpt_of(payload: bytes) -> str:
    return payload[: EXCERPT_CHARS * 4].decode("utf-8", errors="replace")[:EXCERPT_CHARS]


def add_truncation(result: ReadResult, index: int, offset: int, detail: str, end: int | None = None) -> None:
    """The reject for a file whose tail, from `offset` (to `end`, the file's size, when known), cannot
    be read."""
    if end is not None:
        detail = f"{detail}; bytes {offset}..{end} unreadable"
    result.add(
        RawRecord(
            index=index,
            offset=offset,
            url=None,
            fetch_time=None,
            content_type=None,
            drop=Drop("ingest/truncated_file", float(offset), f"damaged at byte offset {offset}: {detail}"),
        )
    )


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


def utf8_or_drop(rec: RawRecord, data: bytes, result: ReadResult) -> str | None:
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
# Fields: a JSON object's or a table row's
# --------------------------------------------------------------------------------------------------


def take_fields(rec: RawRecord, obj: dict, source: SourceConfig, extract: ExtractConfig | None,
                result: ReadResult, excerpt: str) -> bool:
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
        body = utf8_or_drop(rec, body, result)
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
            rec.drop = too_large(size, extract.max_record_bytes)
            rec.excerpt = body[:EXCERPT_CHARS]
            return False
    if "\x00" in body:
        rec.drop = Drop("ingest/binary_payload", None, "NUL characters in the text field")
        return False
    rec.raw = body
    return True


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------


def is_gzip_member_start(path: str, offset: int) -> bool:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(2) == GZIP_MAGIC


def open_decompressed(path: str) -> IO[bytes]:
    """The file's bytes, gunzipped when it is gzip (whatever its name says)."""
    return gzip.open(path, "rb") if is_gzip_member_start(path, 0) else open(path, "rb")


def compressed_position(f: IO[bytes]) -> int:
    """Bytes of the file under `f` (from `open_decompressed`) read so far, read-ahead included."""
    return f.fileobj.tell() if isinstance(f, gzip.GzipFile) else f.tell()
