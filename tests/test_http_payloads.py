"""WARC payloads as a browser reads them (issue 26, item 2; refinery/stages/readers/http.py): each
case is its reject reason or its correct text, and every valid record around it comes out."""

import codecs
import gzip
import random
import zlib
from pathlib import Path

import brotli
import pytest

from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import InputShard
from refinery.stages.ingest import read_input_shard
from synthetic.warc import gzip_member, http_response, warc_record

PAGE = "<html><body><p>Grüße aus Köln, a page of text.</p></body></html>"


def response(url: str, body: bytes, head: str = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n",
             seed: int = 0) -> bytes:
    block = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    return warc_record("response", url, block, random.Random(seed), "application/http; msgtype=response")


def valid(i: int) -> bytes:
    rng = random.Random(i)
    return warc_record("response", f"https://ok.example/{i}", http_response(f"<p>ok {i}</p>".encode(),
                       "text/html; charset=utf-8", rng), rng, "application/http; msgtype=response")


def read(tmp_path: Path, records: list[bytes], compress: bool = False, **source):
    path = tmp_path / "in.warc"
    path.write_bytes(b"".join(gzip_member(r) if compress else r for r in records))
    src = SourceConfig(name="s", path="in/*", format="warc", bucket="web", **source)
    return read_input_shard(InputShard(key="s-f", source="s", bucket="web", path=str(path)), src,
                            ExtractConfig(max_record_bytes=1 << 20))


def around(tmp_path: Path, bad: bytes, **source):
    """Two valid records, the case, two valid records; the output and the case's row (document or
    reject), after checking that the four valid ones came out."""
    out = read(tmp_path, [valid(0), valid(1), bad, valid(2), valid(3)], **source)
    urls = out.documents["url"].to_list()
    assert [u for u in urls if u.startswith("https://ok.example/")] == [f"https://ok.example/{i}" for i in range(4)]
    return out


def text_of(out, url: str) -> str:
    return out.documents.filter(out.documents["url"] == url)["raw"].item()


def only_reject(out, rule: str, url: str) -> str:
    assert out.rejects.select("rule", "url").rows() == [(rule, url)]
    return out.rejects["detail"].item()


def test_chunked_body_is_dechunked(tmp_path):
    body = PAGE.encode()
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in (body[:10], body[10:33], body[33:])) + b"0\r\nX-Trailer: t\r\n\r\n"
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nTransfer-Encoding: chunked\r\n"
    out = around(tmp_path, response("https://c.example/", chunked, head))
    assert text_of(out, "https://c.example/") == PAGE
    assert out.rejects.height == 0


def test_chunked_header_over_an_unchunked_body_keeps_the_body(tmp_path):
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nTransfer-Encoding: chunked\r\n"
    out = around(tmp_path, response("https://c.example/", PAGE.encode(), head))
    assert text_of(out, "https://c.example/") == PAGE


def test_broken_chunk_framing_is_one_reject(tmp_path):
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nTransfer-Encoding: chunked\r\n"
    out = around(tmp_path, response("https://c.example/", b"5\r\nhello world\r\n0\r\n\r\n", head))
    assert "does not end after its 5 bytes" in only_reject(out, "ingest/bad_chunked_body", "https://c.example/")


@pytest.mark.parametrize("coding, encode", [
    ("gzip", lambda b: gzip.compress(b, mtime=0)),
    ("x-gzip", lambda b: gzip.compress(b, mtime=0)),
    ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as many servers send it
    ("br", brotli.compress),
])
def test_content_encoding_is_decoded(tmp_path, coding, encode):
    head = f"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Encoding: {coding}\r\n"
    out = around(tmp_path, response("https://z.example/", encode(PAGE.encode()), head))
    assert text_of(out, "https://z.example/") == PAGE
    assert out.rejects.height == 0


def test_gzip_inside_chunked_is_decoded(tmp_path):
    packed = gzip.compress(PAGE.encode(), mtime=0)
    head = ("HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Encoding: gzip\r\n"
            "Transfer-Encoding: chunked\r\n")
    out = around(tmp_path, response("https://z.example/", b"%x\r\n%s\r\n0\r\n\r\n" % (len(packed), packed), head))
    assert text_of(out, "https://z.example/") == PAGE


@pytest.mark.parametrize("coding, encode", [("gzip", lambda b: gzip.compress(b, mtime=0)), ("br", brotli.compress)])
def test_decompression_bomb_is_too_large(tmp_path, coding, encode):
    bomb = encode(b"<p>" + b"a" * (8 << 20))  # 8 MiB out of a few KB; the limit here is 1 MiB
    head = f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: {coding}\r\n"
    out = around(tmp_path, response("https://bomb.example/", bomb, head))
    assert "more than max_record_bytes 1048576" in only_reject(out, "ingest/too_large", "https://bomb.example/")


def test_undecodable_and_unknown_codings_are_rejects(tmp_path):
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: {}\r\n"
    out = read(tmp_path, [valid(0), response("https://a.example/", b"not gzip at all", head.format("gzip")),
                          response("https://b.example/", b"(compressed)", head.format("compress")), valid(1)])
    assert out.rejects.select("rule", "url").rows() == [("ingest/bad_encoding", "https://a.example/"),
                                                        ("ingest/unsupported_encoding", "https://b.example/")]
    assert out.documents["url"].to_list() == ["https://ok.example/0", "https://ok.example/1"]


@pytest.mark.parametrize("status", [404, 500, 301])
def test_non_2xx_responses_are_http_status_rejects(tmp_path, status):
    head = f"HTTP/1.1 {status} Whatever\r\nContent-Type: text/html; charset=utf-8\r\n"
    out = around(tmp_path, response("https://e.example/", PAGE.encode(), head))
    assert only_reject(out, "ingest/http_status", "https://e.example/") == f"HTTP {status}; kept: 200-299"


def test_kept_statuses_are_configurable(tmp_path):
    head = "HTTP/1.1 404 Not Found\r\nContent-Type: text/html; charset=utf-8\r\n"
    out = around(tmp_path, response("https://e.example/", PAGE.encode(), head), http_status_kept=["200-299", 404])
    assert text_of(out, "https://e.example/") == PAGE


def test_a_bad_kept_status_setting_is_refused():
    with pytest.raises(ValueError, match="is not an HTTP status"):
        SourceConfig(name="s", path="in/*", format="warc", bucket="web", http_status_kept=["2xx"])


@pytest.mark.parametrize("compress", [False, True])
def test_lf_only_warc_headers_are_one_reject_and_the_next_record_comes_out(tmp_path, compress):
    bad = response("https://lf.example/", PAGE.encode()).replace(b"\r\n", b"\n")
    out = read(tmp_path, [valid(0), bad, valid(1), valid(2)], compress=compress)
    assert out.documents["url"].to_list() == ["https://ok.example/0", "https://ok.example/1", "https://ok.example/2"]
    assert "WARC header lines end in LF" in only_reject(out, "ingest/bad_record", "https://lf.example/")


def test_lf_only_warc_headers_before_a_crlf_block(tmp_path):
    rec = response("https://lf.example/", PAGE.encode())
    head, block = rec.split(b"\r\n\r\n", 1)
    out = read(tmp_path, [valid(0), head.replace(b"\r\n", b"\n") + b"\n\n" + block, valid(1)])
    assert out.documents["url"].to_list() == ["https://ok.example/0", "https://ok.example/1"]
    only_reject(out, "ingest/bad_record", "https://lf.example/")


def test_utf8_declared_as_latin1_reaches_the_corpus_as_utf8(tmp_path):
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=ISO-8859-1\r\n"
    out = around(tmp_path, response("https://u.example/", PAGE.encode("utf-8"), head))
    assert text_of(out, "https://u.example/") == PAGE
    assert out.stats.counters["ingest/charset_mismatch"] == 1


def test_a_true_latin1_page_keeps_its_declaration(tmp_path):
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=ISO-8859-1\r\n"
    out = around(tmp_path, response("https://l.example/", PAGE.encode("latin-1"), head))
    assert text_of(out, "https://l.example/") == PAGE
    assert "ingest/charset_mismatch" not in out.stats.counters


def test_utf8_bom_wins_over_meta_charset(tmp_path):
    page = PAGE.replace("<html>", '<html><head><meta charset="windows-1252"></head>')
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
    out = around(tmp_path, response("https://b.example/", b"\xef\xbb\xbf" + page.encode(), head))
    assert text_of(out, "https://b.example/") == page  # decoded as UTF-8, the BOM itself gone
    assert out.stats.counters["ingest/charset_mismatch"] == 1


def test_utf16_bom_page_is_decoded(tmp_path):
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
    out = around(tmp_path, response("https://b.example/", PAGE.encode("utf-16"), head))
    assert text_of(out, "https://b.example/") == PAGE


def test_a_declared_charset_the_bytes_do_not_fit_is_detected(tmp_path):
    text = "<html><body><p>" + "日本語のテキストです。これは検出されるべきページです。" * 20 + "</p></body></html>"
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=ascii\r\n"
    out = around(tmp_path, response("https://j.example/", text.encode("shift_jis"), head))
    assert text_of(out, "https://j.example/") == text
    assert out.stats.counters["ingest/charset_mismatch"] == 1


def test_plain_utf8_answers_only_for_text_that_needs_no_decoding_work():
    """The fast path's test: a length for UTF-8 text declared UTF-8 or not at all; None (so that
    `decode_payload` reads it) for a BOM, a NUL byte, another declared charset, or bytes not UTF-8."""
    from refinery.stages.readers.http import plain_utf8

    assert plain_utf8(PAGE.encode(), "utf-8") == len(PAGE)
    assert plain_utf8(PAGE.encode(), None) == len(PAGE)
    assert plain_utf8(b"ascii only", None) == 10
    assert plain_utf8(codecs.BOM_UTF8 + PAGE.encode(), "utf-8") is None
    assert plain_utf8(PAGE.encode() + b"\x00", "utf-8") is None
    assert plain_utf8(PAGE.encode(), "iso-8859-1") is None
    assert plain_utf8(b"<meta charset='windows-1252'>" + PAGE.encode(), None) is None
    assert plain_utf8(PAGE.encode("latin-1"), "utf-8") is None
