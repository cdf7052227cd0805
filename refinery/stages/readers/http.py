"""HTTP payloads as a browser reads them: the status kept, the transfer framing and content codings
undone, and the text decoded with the charset its bytes are in.

- A response whose status the source does not keep (`http_status_kept`, 2xx by default) is
  `ingest/http_status`: an error page is not the document its URL names.
- `Transfer-Encoding: chunked` is de-chunked. A body whose first line is not a chunk size is taken as
  it is (the crawler removed the framing but kept the header; warcio reads such bodies the same
  way); a chunk size missing later, or a chunk that does not end where its size says, is
  `ingest/bad_chunked_body`. A body cut short keeps what arrived, as a browser shows it.
- `Content-Encoding` (and transfer codings) gzip, deflate and br are decoded, never past
  `extract.max_record_bytes` of output: a body that decodes to more is `ingest/too_large`, one that
  does not decode is `ingest/bad_encoding`, a coding we cannot decode `ingest/unsupported_encoding`.
- The charset comes from the bytes (`decode_payload`): a BOM first; then the declared charset (the
  HTTP header's, else an HTML meta charset) when the bytes decode under it and agree with it; else
  charset-normalizer's detection. A declaration the bytes overrule counts `ingest/charset_mismatch`.
"""

from __future__ import annotations

import codecs
import re
import zlib

import brotli

from refinery.stages.readers.records import RawRecord, ReadResult, utf8_or_drop
from refinery.stages.stats import Drop

CHARSET_MISMATCH = "ingest/charset_mismatch"
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_CHARSET_SNIFF_BYTES = 4096
# WHATWG's encoding sniffing: a byte order mark overrides every declaration.
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_CHUNK_SIZE = re.compile(rb"[ \t]*([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r?\n")


class Rejected(Exception):
    """A payload that cannot become text; carries its reject."""

    def __init__(self, drop: Drop):
        super().__init__(drop.detail)
        self.drop = drop


# --------------------------------------------------------------------------------------------------
# Framing and codings
# --------------------------------------------------------------------------------------------------


def dechunk(body: bytes) -> bytes:
    """The data of a `Transfer-Encoding: chunked` body (chunk extensions and trailers dropped)."""
    if _CHUNK_SIZE.match(body) is None:
        return body
    parts, pos = [], 0
    while pos < len(body):
        m = _CHUNK_SIZE.match(body, pos)
        if m is None:
            raise Rejected(Drop("ingest/bad_chunked_body", float(pos), f"no chunk size at byte {pos} of the body"))
        size, start = int(m.group(1), 16), m.end()
        if size == 0:
            break
        parts.append(body[start : start + size])
        pos = start + size
        if pos >= len(body):
            break
        if body.startswith(b"\r\n", pos):
            pos += 2
        elif body.startswith(b"\n", pos):
            pos += 1
        else:
            raise Rejected(Drop("ingest/bad_chunked_body", float(start),
                                f"the chunk at byte {start} of the body does not end after its {size} bytes"))
    return b"".join(parts)


def _too_large(coding: str, limit: int) -> Rejected:
    return Rejected(Drop("ingest/too_large", float(limit + 1),
                         f"{coding} body decodes to more than max_record_bytes {limit}"))


def _inflate(data: bytes, wbits: int, coding: str, limit: int) -> bytes:
    """zlib-family data (gzip members one after another, zlib or raw deflate), at most `limit` bytes."""
    out = bytearray()
    while data:
        d = zlib.decompressobj(wbits=wbits)
        out += d.decompress(data, limit + 1 - len(out))
        if len(out) > limit:
            raise _too_large(coding, limit)
        if d.unconsumed_tail:  # output stopped at the limit with input left: more than the limit
            raise _too_large(coding, limit)
        if not d.eof:
            break  # cut short: keep what decoded, as a browser does
        data = d.unused_data if wbits == 31 and d.unused_data[:2] == b"\x1f\x8b" else b""
    return bytes(out)


def _decode_coding(data: bytes, coding: str, limit: int) -> bytes:
    try:
        if coding in ("gzip", "x-gzip"):
            return _inflate(data, 31, coding, limit)
        if coding == "deflate":
            # Servers send raw deflate as often as the zlib stream the RFC names; browsers read both.
            wbits = 15 if len(data) >= 2 and (data[0] & 0x0F) == 8 and int.from_bytes(data[:2], "big") % 31 == 0 else -15
            return _inflate(data, wbits, coding, limit)
        if coding == "br":
            out = brotli.Decompressor().process(data, output_buffer_limit=limit + 1)
            if len(out) > limit:
                raise _too_large(coding, limit)
            return out
    except (zlib.error, brotli.error) as err:
        raise Rejected(Drop("ingest/bad_encoding", None, f"{coding} body does not decode: {err}"[:200])) from None
    raise Rejected(Drop("ingest/unsupported_encoding", None, f"coding {coding!r}"))


def _codings(value: str | None) -> list[str]:
    return [c.strip().lower() for c in (value or "").split(",") if c.strip() and c.strip().lower() != "identity"]


def http_body(body: bytes, transfer_encoding: str | None, content_encoding: str | None, limit: int) -> bytes:
    """The body as the page's bytes: transfer codings undone (chunked, and any compression), then
    content codings, last applied first. Raises `Rejected`."""
    for coding in reversed(_codings(transfer_encoding)):
        body = dechunk(body) if coding == "chunked" else _decode_coding(body, coding, limit)
    for coding in reversed(_codings(content_encoding)):
        body = _decode_coding(body, coding, limit)
    return body


# --------------------------------------------------------------------------------------------------
# Charset
# --------------------------------------------------------------------------------------------------


def _codec(name: str | None) -> str | None:
    """Python's name for a charset label; None for an unknown label or a bytes-to-bytes codec."""
    if not name:
        return None
    try:
        info = codecs.lookup(name)
    except LookupError:
        return None
    # bytes-to-bytes codecs (base64, zlib) are found by lookup but cannot decode to str
    return info.name if getattr(info, "_is_text_encoding", True) else None


def declared_charset(payload: bytes, header_charset: str | None) -> str | None:
    """The charset the response declares: the HTTP header's, else an HTML meta charset."""
    name = header_charset
    if not name:
        m = _META_CHARSET.search(payload, 0, _CHARSET_SNIFF_BYTES)
        name = m.group(1).decode("ascii") if m else None
    return _codec(name)


def _strict(payload: bytes, codec: str) -> str | None:
    try:
        return payload.decode(codec)
    except UnicodeDecodeError:
        return None


def _detected(payload: bytes) -> tuple[str, str] | None:
    """charset-normalizer's best reading of the bytes, (codec, text), or None when it finds none."""
    from charset_normalizer import from_bytes

    best = from_bytes(payload).best()
    return None if best is None else (best.encoding, str(best))


_BOM_STARTS = tuple(bom for bom, _ in _BOMS)


def plain_utf8(payload: bytes, header_charset: str | None) -> int | None:
    """The payload's length in characters when it is text that needs no decoding work: no BOM, no
    NUL byte, declared UTF-8 or nothing, and valid UTF-8 (so `decode_payload` would answer its
    UTF-8 decoding, with no other effect). None for every other payload, which `decode_payload` reads."""
    if payload.startswith(_BOM_STARTS) or b"\x00" in payload:
        return None
    declared = declared_charset(payload, header_charset)
    if declared is not None and declared != "utf-8":
        return None
    if payload.isascii():
        return len(payload)
    text = _strict(payload, "utf-8")
    return None if text is None else len(text)


def decode_payload(rec: RawRecord, payload: bytes, header_charset: str | None, result: ReadResult) -> str | None:
    """The payload's text, or None with `rec.drop` set. Declared UTF-8 is trusted over detection:
    a detector reading damaged UTF-8 names some single-byte codec (charset-normalizer names cp775
    for a page with two stray bytes), so damaged UTF-8 is replaced or rejected as `utf8_or_drop`
    says."""
    for bom, codec in _BOMS:
        if payload.startswith(bom):
            declared = declared_charset(payload, header_charset)
            if declared is not None and declared != _codec(codec):
                result.count(CHARSET_MISMATCH)
            body = payload[len(bom) :]
            text = utf8_or_drop(rec, body, result) if codec == "utf-8" else body.decode(codec, errors="replace")
            if text is not None and "\x00" in text:
                rec.drop = Drop("ingest/binary_payload", None, "NUL characters in the payload")
                return None
            return text
    if b"\x00" in payload:
        rec.drop = Drop("ingest/binary_payload", None, "NUL bytes in the payload")
        return None
    declared = declared_charset(payload, header_charset)
    if declared is None or declared == "utf-8":
        if declared is None and _strict(payload, "utf-8") is None:
            detected = _detected(payload)
            if detected is not None:
                return detected[1]
        return utf8_or_drop(rec, payload, result)
    utf8 = _strict(payload, "utf-8")
    if utf8 is not None and not payload.isascii():
        # Legacy-encoded text is valid UTF-8 with multi-byte sequences only by accident (Dürst,
        # "The Properties and Promises of UTF-8", 1997): the bytes are UTF-8, the label is wrong.
        result.count(CHARSET_MISMATCH)
        return utf8
    text = _strict(payload, declared)
    if text is not None:
        return text
    detected = _detected(payload)
    if detected is None:
        return payload.decode(declared, errors="replace")
    result.count(CHARSET_MISMATCH)
    return detected[1]
