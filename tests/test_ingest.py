"""raw_documents: reading WARC and JSONL input shards, and every kind of bad input."""

import gzip
import io
import json
import random
import tracemalloc
from pathlib import Path

import polars as pl
import pytest

from refinery.stages.ingest import RAW_SCHEMA, config_relative_file, read_input_shard
from refinery.stages.readers import gzip_damage_offset
from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import InputShard, make_doc_id
from synthetic.warc import gzip_member, http_request, http_response, warc_record

HTML = "<html><head><title>{t}</title></head><body><p>{t}: {body}</p></body></html>"


def page(i: int, words: int = 40) -> bytes:
    return HTML.format(t=f"Page {i}", body=" ".join(f"word{i}x{k}" for k in range(words))).encode()


def response(url: str, body: bytes, content_type: str = "text/html; charset=utf-8", seed: int = 0) -> bytes:
    rng = random.Random(seed)
    return warc_record("response", url, http_response(body, content_type, rng), rng, "application/http; msgtype=response")


def write_warc(path: Path, records: list[bytes], compress: bool = True) -> list[int]:
    """Write the records (one gzip member each when compressed); return each record's offset."""
    blobs = [gzip_member(r) for r in records] if compress else records
    offsets, pos = [], 0
    for b in blobs:
        offsets.append(pos)
        pos += len(b)
    path.write_bytes(b"".join(blobs))
    return offsets


def warc_source(pattern: str = "in/*.warc*") -> SourceConfig:
    return SourceConfig(name="web", path=pattern, format="warc", bucket="web")


def jsonl_source(**kw) -> SourceConfig:
    return SourceConfig(name="books", path="in/*.jsonl*", format="jsonl", bucket="books", **kw)


def read(path: Path, source: SourceConfig, **extract):
    shard = InputShard(key=f"{source.name}-{path.name.split('.')[0]}", source=source.name, bucket=source.bucket, path=str(path))
    return read_input_shard(shard, source, ExtractConfig(**extract))


def rules(out) -> list[str]:
    return out.rejects["rule"].to_list()


# --------------------------------------------------------------------------------------------------
# WARC
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
def test_warc_rows_provenance_and_skipped_record_types(tmp_path, compress):
    rng = random.Random(1)
    records = [
        warc_record("warcinfo", None, b"software: test\r\n", rng, "application/warc-fields"),
        warc_record("request", "https://a.example/1", http_request("https://a.example/1"), rng, "application/http; msgtype=request"),
        response("https://a.example/1", page(1)),
        response("https://a.example/2", page(2), seed=2),
        warc_record("metadata", "https://a.example/2", b"fetchTimeMs: 12\r\n", rng, "application/warc-fields"),
        warc_record("resource", "file:///notes.txt", b"plain resource text", rng, "text/plain"),
    ]
    path = tmp_path / ("a.warc.gz" if compress else "a.warc")
    offsets = write_warc(path, records, compress)
    out = read(path, warc_source())
    docs = out.documents
    assert docs.columns == list(RAW_SCHEMA)
    assert docs["url"].to_list() == ["https://a.example/1", "https://a.example/2", "file:///notes.txt"]
    assert docs["record_index"].to_list() == [2, 3, 5]
    assert docs["record_offset"].to_list() == [offsets[2], offsets[3], offsets[5]]
    assert docs["doc_id"].to_list() == [make_doc_id("web-a", i) for i in (2, 3, 5)]
    assert docs["content_type"].to_list() == ["text/html", "text/html", "text/plain"]
    assert docs["raw"][0] == page(1).decode()
    assert docs["raw"][2] == "plain resource text"
    assert all(t.startswith("2024-03-") and t.endswith("Z") for t in docs["fetch_time"])
    assert docs["file"].to_list() == [f"in/{path.name}"] * 3
    assert out.rejects.height == 0
    assert out.stats.counters == {"skipped_warcinfo": 1, "skipped_request": 1, "skipped_metadata": 1}
    assert (out.stats.docs_in, out.stats.docs_out) == (3, 3)
    assert out.stats.bytes_in == out.stats.bytes_out == sum(len(r.encode()) for r in docs["raw"])
    assert out.stats.by_bucket["web"].docs_out == 3


def test_warc_offset_seeks_to_the_record(tmp_path):
    from fastwarc.warc import ArchiveIterator

    path = tmp_path / "seek.warc.gz"
    write_warc(path, [response(f"https://s.example/{i}", page(i), seed=i) for i in range(6)])
    out = read(path, warc_source())
    with open(path, "rb") as f:
        for url, offset in out.documents.select("url", "record_offset").iter_rows():
            f.seek(offset)
            record = next(iter(ArchiveIterator(f, parse_http=False)))
            assert record.headers["WARC-Target-URI"] == url


def test_warc_charsets_from_header_and_meta(tmp_path):
    german = "Grüße aus Köln – schöne Straße"
    latin = HTML.format(t="de", body=german).encode("iso-8859-1", errors="xmlcharrefreplace")
    meta = f'<html><head><meta charset="windows-1252"></head><body><p>{german}</p></body></html>'.encode("cp1252")
    path = tmp_path / "cs.warc.gz"
    write_warc(path, [response("https://d.example/1", latin, "text/html; charset=ISO-8859-1"), response("https://d.example/2", meta, "text/html")])
    out = read(path, warc_source())
    assert "Grüße aus Köln &#8211; schöne Straße" in out.documents["raw"][0]
    assert german in out.documents["raw"][1]
    assert out.rejects.height == 0


def test_unknown_or_non_text_charset_falls_back_to_utf8(tmp_path):
    body = HTML.format(t="cs", body="naïve café").encode()
    path = tmp_path / "odd.warc"
    write_warc(path, [response("https://c.example/1", body, "text/html; charset=base64"), response("https://c.example/2", body, "text/html; charset=no-such-codec")], compress=False)
    out = read(path, warc_source())
    assert out.documents["raw"].to_list() == [body.decode()] * 2


def test_compression_is_read_from_content_not_suffix(tmp_path):
    plain_warc = tmp_path / "plain-named.warc.gz"
    write_warc(plain_warc, [response("https://n.example/1", page(1))], compress=False)
    gzip_warc = tmp_path / "gzip-named.warc"
    write_warc(gzip_warc, [response("https://n.example/2", page(2))])
    plain_jsonl = tmp_path / "plain-named.jsonl.gz"
    plain_jsonl.write_bytes(b'{"text": "plain", "url": "https://n.example/3"}\n')
    gzip_jsonl = tmp_path / "gzip-named.jsonl"
    gzip_jsonl.write_bytes(gzip.compress(b'{"text": "zipped", "url": "https://n.example/4"}\n', mtime=0))
    for path, source, url in (
        (plain_warc, warc_source(), "https://n.example/1"),
        (gzip_warc, warc_source(), "https://n.example/2"),
        (plain_jsonl, jsonl_source(), "https://n.example/3"),
        (gzip_jsonl, jsonl_source(), "https://n.example/4"),
    ):
        out = read(path, source)
        assert out.documents["url"].to_list() == [url], path.name
        assert out.rejects.height == 0, path.name


def test_warc_binary_payloads_rejected_and_text_kept(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    nul = page(3).replace(b"<p>", b"<p>\x00", 1)
    path = tmp_path / "bin.warc.gz"
    write_warc(
        path,
        [
            response("https://b.example/ok1", page(1)),
            response("https://b.example/logo.png", png, "image/png"),
            response("https://b.example/blob", b"just bytes", "application/octet-stream"),
            response("https://b.example/nul", nul),
            response("https://b.example/ok2", page(2)),
            response("https://b.example/api", b'{"a": 1}', "application/json"),
        ],
    )
    out = read(path, warc_source())
    assert out.documents["url"].to_list() == ["https://b.example/ok1", "https://b.example/ok2", "https://b.example/api"]
    assert rules(out) == ["ingest/binary_payload"] * 3
    assert out.rejects["url"].to_list() == ["https://b.example/logo.png", "https://b.example/blob", "https://b.example/nul"]
    assert out.rejects["detail"].to_list() == ["content type image/png", "content type application/octet-stream", "NUL bytes in the payload"]
    assert out.rejects["doc_id"].to_list() == [make_doc_id("web-bin", i) for i in (1, 2, 3)]
    assert out.stats.dropped == {"ingest/binary_payload": 3}
    assert (out.stats.docs_in, out.stats.docs_out) == (6, 3)


def test_bad_utf8_rejected_above_the_fraction_and_replaced_below(tmp_path):
    body = bytearray(page(1, words=200))
    garbled = bytearray(body)
    for k in range(0, len(garbled), 5):
        garbled[k] = 0xFF
    light = bytes(body).replace(b"</title>", b"\xfe</title>", 1)
    path = tmp_path / "utf.warc.gz"
    write_warc(path, [response("https://u.example/garbled", bytes(garbled)), response("https://u.example/light", light)])
    out = read(path, warc_source())
    assert out.documents["url"].to_list() == ["https://u.example/light"]
    assert "\ufffd</title>" in out.documents["raw"][0]
    assert out.stats.counters["utf8_replaced"] == 1
    assert rules(out) == ["ingest/bad_utf8"]
    assert out.rejects["value"][0] == pytest.approx(len(range(0, len(garbled), 5)) / len(garbled))
    assert "\ufffd" in out.rejects["excerpt"][0]


def test_warc_record_over_the_limit_is_rejected_unread(tmp_path):
    big = HTML.format(t="big", body="x" * 5000).encode()
    path = tmp_path / "big.warc.gz"
    write_warc(path, [response("https://l.example/big", big), response("https://l.example/small", page(1))])
    out = read(path, warc_source(), max_record_bytes=2000)
    assert out.documents["url"].to_list() == ["https://l.example/small"]
    assert rules(out) == ["ingest/too_large"]
    assert out.rejects["value"][0] == len(big)
    assert out.stats.bytes_in == len(big) + len(page(1))


def test_truncated_gzip_warc_keeps_records_before_the_damage(tmp_path):
    records = [response(f"https://t.example/{i}", page(i), seed=i) for i in range(4)]
    path = tmp_path / "cut.warc.gz"
    offsets = write_warc(path, records)
    data = path.read_bytes()
    path.write_bytes(data[: offsets[3] + (len(data) - offsets[3]) // 2])
    out = read(path, warc_source())
    assert out.documents["url"].to_list() == [f"https://t.example/{i}" for i in range(3)]
    assert rules(out) == ["ingest/truncated_file"]
    assert out.rejects["value"][0] == offsets[3]
    assert f"byte offset {offsets[3]}" in out.rejects["detail"][0]
    assert out.rejects["doc_id"][0] == make_doc_id("web-cut", 3)
    assert (out.stats.docs_in, out.stats.docs_out) == (4, 3)


def test_truncated_plain_warc_keeps_records_before_the_damage(tmp_path):
    records = [response(f"https://p.example/{i}", page(i), seed=i) for i in range(3)]
    path = tmp_path / "cut.warc"
    offsets = write_warc(path, records, compress=False)
    path.write_bytes(path.read_bytes()[:-200])
    out = read(path, warc_source())
    assert out.documents["url"].to_list() == ["https://p.example/0", "https://p.example/1"]
    assert rules(out) == ["ingest/truncated_file"]
    assert out.rejects["value"][0] == offsets[2]


def test_garbage_after_records_is_a_truncated_file(tmp_path):
    path = tmp_path / "junk.warc"
    write_warc(path, [response("https://j.example/0", page(0))], compress=False)
    path.write_bytes(path.read_bytes() + b"this is not a WARC record\r\n\r\n" * 3)
    out = read(path, warc_source())
    assert out.documents["url"].to_list() == ["https://j.example/0"]
    assert rules(out) == ["ingest/truncated_file"]


def test_gzip_damage_offset(tmp_path):
    whole = tmp_path / "whole.gz"
    whole.write_bytes(gzip_member(b"a" * 1000) + gzip_member(b"b" * 1000))
    assert gzip_damage_offset(str(whole)) is None
    first = len(gzip_member(b"a" * 1000))
    cut = tmp_path / "cut.gz"
    cut.write_bytes(whole.read_bytes()[:-5])
    assert gzip_damage_offset(str(cut)) == first
    corrupt = tmp_path / "corrupt.gz"
    corrupt.write_bytes(gzip_member(b"a" * 1000) + b"\x1f\x8b\x08\x00garbage-not-deflate")
    assert gzip_damage_offset(str(corrupt)) == first


# --------------------------------------------------------------------------------------------------
# JSONL
# --------------------------------------------------------------------------------------------------


def jsonl(rows: list) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def test_jsonl_bad_lines_are_counted_and_the_rest_kept(tmp_path):
    rows = [
        {"text": "first document", "url": "https://j.example/1"},
        b'{"text": "unterminated',
        {"url": "https://j.example/no-text"},
        {"text": 42, "url": "https://j.example/number"},
        b"[1, 2]",
        {"text": "no url here"},
        {"text": "bad " + "\u00e9" * 3, "url": 7},
        b'{"text": "' + "Gr\u00fc\u00dfe ".encode("latin-1") * 10 + b'"}',
        {"text": "nul\u0000inside"},
        b"   ",
        {"text": "last document", "url": "https://j.example/last"},
    ]
    path = tmp_path / "mixed.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl(rows), mtime=0))
    out = read(path, jsonl_source())
    docs = out.documents
    assert docs["raw"].to_list() == ["first document", "no url here", "bad \u00e9\u00e9\u00e9", "last document"]
    assert docs["url"].to_list() == ["https://j.example/1", None, None, "https://j.example/last"]
    assert docs["record_index"].to_list() == [0, 5, 6, 9]
    assert docs["content_type"].unique().to_list() == ["text/plain"]
    assert rules(out) == [
        "ingest/bad_json",
        "ingest/missing_text",
        "ingest/missing_text",
        "ingest/bad_json",
        "ingest/bad_utf8",
        "ingest/binary_payload",
    ]
    assert out.rejects["doc_id"].to_list() == [make_doc_id("books-mixed", i) for i in (1, 2, 3, 4, 7, 8)]
    assert out.rejects["url"].to_list()[1:3] == ["https://j.example/no-text", "https://j.example/number"]
    assert out.stats.counters == {"blank_lines": 1}
    assert (out.stats.docs_in, out.stats.docs_out) == (10, 4)


def test_jsonl_stray_invalid_byte_is_replaced_and_kept(tmp_path):
    line = b'{"text": "' + b"a long and otherwise fine line of text " * 10 + b'\xff end"}'
    path = tmp_path / "stray.jsonl"
    path.write_bytes(jsonl([line]))
    out = read(path, jsonl_source())
    assert out.documents["raw"][0].endswith("text \ufffd end")
    assert out.stats.counters == {"utf8_replaced": 1}
    assert out.rejects.height == 0


@pytest.mark.parametrize("compress", [False, True])
def test_jsonl_utf8_bom_costs_no_record(tmp_path, compress):
    data = b"\xef\xbb\xbf" + jsonl([{"text": f"doc {i}", "url": f"https://b.example/{i}"} for i in range(3)])
    path = tmp_path / ("bom.jsonl.gz" if compress else "bom.jsonl")
    path.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    out = read(path, jsonl_source())
    assert out.documents.select("url", "raw").rows() == [(f"https://b.example/{i}", f"doc {i}") for i in range(3)]
    assert out.rejects.height == 0


def test_jsonl_integer_past_the_int_limit_costs_no_record(tmp_path):
    huge = b"9" * 5000
    lines = [b'{"text": "doc 0", "views": ' + huge + b"}", b'{"text": "doc 1", "id": ' + huge + b"}",
             b'{"text": "doc 2"}']
    path = tmp_path / "ints.jsonl"
    path.write_bytes(jsonl(lines))
    out = read(path, jsonl_source(id_field="id"))
    assert out.documents["raw"].to_list() == ["doc 0", "doc 1", "doc 2"]
    assert out.documents["url"].to_list() == [None, huge.decode(), None]  # the id keeps its exact digits
    assert out.rejects.height == 0


def test_jsonl_offsets_point_into_the_decompressed_stream(tmp_path):
    rows = [{"text": f"doc {i} " + "é" * i, "url": f"https://o.example/{i}"} for i in range(20)]
    data = jsonl(rows)
    path = tmp_path / "off.jsonl.gz"
    path.write_bytes(gzip.compress(data, mtime=0))
    out = read(path, jsonl_source())
    for offset, raw in out.documents.select("record_offset", "raw").iter_rows():
        line = io.BytesIO(data[offset:]).readline()
        assert json.loads(line)["text"] == raw


def test_jsonl_custom_fields(tmp_path):
    path = tmp_path / "fields.jsonl"
    path.write_bytes(jsonl([{"content": "body text", "link": "https://f.example/"}, {"text": "wrong field"}]))
    out = read(path, jsonl_source(text_field="content", url_field="link"))
    assert out.documents.select("raw", "url").rows() == [("body text", "https://f.example/")]
    assert rules(out) == ["ingest/missing_text"]


def test_truncated_gzip_jsonl_keeps_whole_lines(tmp_path):
    rng = random.Random(3)
    rows = [{"text": " ".join(str(rng.random()) for _ in range(300)), "url": f"https://g.example/{i}"} for i in range(10)]
    data = jsonl(rows)
    full = gzip.compress(data, mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(full[: len(full) * 2 // 3])
    out = read(path, jsonl_source())
    kept = out.documents.height
    assert 0 < kept < 10
    assert out.documents["url"].to_list() == [f"https://g.example/{i}" for i in range(kept)]
    assert rules(out) == ["ingest/truncated_file"]
    offset = sum(len(json.dumps(r)) + 1 for r in rows[:kept])
    assert out.rejects["value"][0] == offset
    assert out.rejects["doc_id"][0] == make_doc_id("books-cut", kept)


def test_fifty_megabyte_line_is_rejected_without_loading_it(tmp_path):
    line = b'{"url": "https://h.example/huge", "text": "' + b"all work and no play " * (50 * 1024 * 1024 // 21) + b'"}\n'
    path = tmp_path / "huge.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(line)
        f.write(jsonl([{"text": "small after huge", "url": "https://h.example/small"}]))
    del line
    tracemalloc.start()
    out = read(path, jsonl_source(), max_record_bytes=1 << 20)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rules(out) == ["ingest/too_large"]
    assert out.rejects["value"][0] > 50_000_000
    assert out.documents["raw"].to_list() == ["small after huge"]
    assert out.documents["record_offset"][0] == out.rejects["value"][0]
    assert peak < 16 * 1024 * 1024  # a few times the 1 MiB limit, never the 50 MB line


# --------------------------------------------------------------------------------------------------
# Whole files
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,content,source",
    [
        ("empty.warc.gz", b"", warc_source()),
        ("empty.warc", b"", warc_source()),
        ("empty.jsonl", b"", jsonl_source()),
        ("empty.jsonl.gz", gzip.compress(b"", mtime=0), jsonl_source()),
    ],
)
def test_empty_file_gives_zero_rows_and_a_counter(tmp_path, name, content, source):
    path = tmp_path / name
    path.write_bytes(content)
    out = read(path, source)
    assert out.documents.height == 0 and out.rejects.height == 0
    assert out.documents.schema == pl.Schema(RAW_SCHEMA)
    assert out.stats.counters == {"empty_file": 1}
    assert out.stats.docs_in == 0


def test_missing_file_names_path_and_source(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"gone\.warc\.gz.*source 'web'"):
        read(tmp_path / "gone.warc.gz", warc_source())


def test_reads_are_deterministic(tmp_path):
    path = tmp_path / "det.warc.gz"
    write_warc(path, [response(f"https://x.example/{i}", page(i), seed=i) for i in range(5)] + [response("https://x.example/bin", b"\x00\x01", "image/gif")])
    a, b = read(path, warc_source()), read(path, warc_source())
    assert a.documents.equals(b.documents)
    assert a.rejects.equals(b.rejects)
    assert {**a.stats.to_dict(), "wall_s": 0} == {**b.stats.to_dict(), "wall_s": 0}


def test_config_relative_file():
    assert config_relative_file("/abs/data/sample/web/web-00.warc.gz", "../data/sample/web/*.warc*") == "../data/sample/web/web-00.warc.gz"
    assert config_relative_file("/abs/data/web/2024/a.jsonl", "data/web/*/*.jsonl") == "data/web/2024/a.jsonl"
    assert config_relative_file("/abs/x/a.jsonl", "/abs/x/*.jsonl") == "/abs/x/a.jsonl"
