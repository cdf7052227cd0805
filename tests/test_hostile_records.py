"""Hostile records: each one is exactly one counted reject with its reason, every valid record
before and after it comes out, and a funnel partition over them ends within its time budget."""

import json
import random
import re
import time
from pathlib import Path

import polars as pl
import pytest

from refinery.stages.extract import Extractor
from refinery.stages.heuristic import HeuristicFilter, url_rules
from refinery.stages.ingest import read_input_shard
from refinery.config import ExtractConfig, HeuristicConfig, SourceConfig
from refinery.documents import InputShard, make_doc_id
from refinery.layout import rejects_key
from refinery.stages.attributes import read_stage_documents
from refinery.storage import LocalDataRoot
from synthetic.warc import gzip_member, http_response, warc_record

from helpers.configs import write_config
from helpers.texts import PROSE



def page(i: int) -> bytes:
    return f"<html><body><article><p>Page {i}. {PROSE}</p></article></body></html>".encode()


def deep_page(levels: int) -> bytes:
    return b"<html><body>" + b"<div>" * levels + b"deep" + b"</div>" * levels + b"</body></html>"


def record(url: str, body: bytes, seed: int, http_head: bytes | None = None) -> bytes:
    rng = random.Random(seed)
    block = http_response(body, "text/html; charset=utf-8", rng) if http_head is None else http_head + body
    return warc_record("response", url, block, rng, "application/http; msgtype=response")


def valid(i: int) -> bytes:
    return record(f"https://ok.example/{i}", page(i), i)


def huge_http_header(url: str) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Padding: " + b"a" * 3_000_000 + b"\r\n\r\n"
    return record(url, page(99), 99, head)


def lying_content_length(url: str, delta: int) -> bytes:
    rec = record(url, page(98), 98)
    m = re.search(rb"Content-Length: (\d+)\r\n\r\nHTTP", rec)
    return rec.replace(m.group(0), b"Content-Length: %d\r\n\r\nHTTP" % (int(m.group(1)) + delta))


def write_warc(path: Path, records: list[bytes], compress: bool) -> list[int]:
    """Write the records (one gzip member each when compressed); return each record's offset."""
    blobs = [gzip_member(r) if compress else r for r in records]
    path.write_bytes(b"".join(blobs))
    return [sum(map(len, blobs[:i])) for i in range(len(blobs))]


def read(path: Path, fmt: str = "warc", **extract):
    source = SourceConfig(name="s", path="in/*", format=fmt, bucket="web")
    shard = InputShard(key="s-f", source="s", bucket="web", path=str(path))
    return read_input_shard(shard, source, ExtractConfig(**extract))


def hostile_warc(path: Path, bad: bytes, compress: bool, before: int = 3, after: int = 17):
    """`before` valid records, the bad one, `after` valid ones; returns the valid urls and the bad
    record's offset and end."""
    records = [valid(i) for i in range(before)] + [bad] + [valid(i) for i in range(before, before + after)]
    offsets = write_warc(path, records, compress)
    return [f"https://ok.example/{i}" for i in range(before + after)], offsets[before], offsets[before + 1]


def assert_one_reject(out, rule: str, index: int, total: int, valid_urls: list[str]) -> None:
    assert out.rejects["rule"].to_list() == [rule]
    assert out.rejects["doc_id"].to_list() == [make_doc_id("s-f", index)]
    assert out.documents["url"].to_list() == valid_urls
    assert out.documents["doc_id"].to_list() == [make_doc_id("s-f", i) for i in range(total) if i != index]
    assert (out.stats.docs_in, out.stats.docs_out) == (total, total - 1)
    assert out.stats.dropped == {rule: 1}


# --------------------------------------------------------------------------------------------------
# WARC
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
def test_three_megabyte_http_header_is_one_reject_and_reading_resumes(tmp_path, compress):
    path = tmp_path / "big.warc"
    urls, bad_start, bad_end = hostile_warc(path, huge_http_header("https://bad.example/header"), compress)
    out = read(path)
    assert_one_reject(out, "ingest/bad_record", 3, 21, urls)
    reject = out.rejects.row(0, named=True)
    assert reject["url"] == "https://bad.example/header"
    assert f"bytes {bad_start}..{bad_end} unreadable" in reject["detail"]
    assert reject["value"] == bad_end - bad_start
    assert out.documents["record_offset"][3] == bad_end  # the next valid record starts where the skip ends
    assert "Maximum header length" in reject["detail"]


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("delta", [500, -300])
def test_lying_content_length_is_one_reject_and_reading_resumes(tmp_path, compress, delta):
    path = tmp_path / "lie.warc"
    urls, bad_start, bad_end = hostile_warc(path, lying_content_length("https://bad.example/lies", delta), compress)
    out = read(path)
    assert_one_reject(out, "ingest/bad_content_length", 3, 21, urls)
    reject = out.rejects.row(0, named=True)
    assert reject["url"] == "https://bad.example/lies"
    assert reject["excerpt"] is None  # what it read as payload belongs to the next records
    assert f"bytes {bad_start}..{bad_end} skipped" in reject["detail"]


def test_corrupt_gzip_member_is_one_reject_and_reading_resumes(tmp_path):
    path = tmp_path / "corrupt.warc.gz"
    members = [gzip_member(valid(i)) for i in range(6)]
    broken = bytearray(members[2])
    broken[20:60] = b"\xff" * 40  # the deflate stream no longer decodes
    members[2] = bytes(broken)
    path.write_bytes(b"".join(members))
    out = read(path)
    assert out.rejects["rule"].to_list() == ["ingest/bad_gzip_member"]
    assert out.documents["url"].to_list() == [f"https://ok.example/{i}" for i in (0, 1, 3, 4, 5)]
    start = len(members[0]) + len(members[1])
    assert f"bytes {start}..{start + len(members[2])} unreadable" in out.rejects["detail"][0]


def test_several_bad_records_in_one_file_each_count_once(tmp_path):
    path = tmp_path / "many.warc"
    records = [valid(0), huge_http_header("https://bad.example/1"), valid(1),
               lying_content_length("https://bad.example/2", 400), valid(2), valid(3)]
    write_warc(path, records, compress=False)
    out = read(path)
    assert out.rejects["rule"].to_list() == ["ingest/bad_record", "ingest/bad_content_length"]
    assert out.documents["url"].to_list() == [f"https://ok.example/{i}" for i in range(4)]


# --------------------------------------------------------------------------------------------------
# JSONL
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad,rule",
    [
        (b'{"text": "x", "nested": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "ingest/bad_json"),
        (b"[" * 100_000, "ingest/bad_json"),
        (b'{"text": "a lone surrogate \\ud800 here", "url": "https://bad.example/s"}', "ingest/lone_surrogate"),
        (b'{"text": "fine", "url": "https://bad.example/\\udfff"}', "ingest/lone_surrogate"),
        (b'{"url": "https://bad.example/no-text"}', "ingest/missing_text"),
        (b'{"text": "unterminated', "ingest/bad_json"),
    ],
)
def test_one_bad_jsonl_line_is_one_reject_and_the_rest_comes_out(tmp_path, bad, rule):
    lines = [json.dumps({"text": f"document {i}", "url": f"https://ok.example/{i}"}).encode() for i in range(1000)]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines[:500] + [bad] + lines[500:]) + b"\n")
    out = read(path, "jsonl")
    assert_one_reject(out, rule, 500, 1001, [f"https://ok.example/{i}" for i in range(1000)])
    # Every kept row can be written: a lone surrogate would fail the Parquet write.
    out.documents.write_parquet(tmp_path / "docs.parquet")
    out.rejects.write_parquet(tmp_path / "rejects.parquet")


# --------------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------------


def raw_table(pages: list[bytes]) -> pl.DataFrame:
    n = len(pages)
    return pl.DataFrame(
        {
            "doc_id": [f"s-f/{i:07d}" for i in range(n)], "url": [f"https://ok.example/{i}" for i in range(n)],
            "source": ["s"] * n, "bucket": ["web"] * n, "file": ["f"] * n, "record_index": list(range(n)),
            "record_offset": [0] * n, "fetch_time": [None] * n, "content_type": ["text/html"] * n,
            "raw": [p.decode() for p in pages],
        },
        schema_overrides={"fetch_time": pl.String},
    )


def test_deeply_nested_page_is_rejected_before_parsing(tmp_path):
    docs = raw_table([page(0), deep_page(40_000), page(1)])
    start = time.perf_counter()
    out = Extractor(ExtractConfig()).run(docs)
    assert time.perf_counter() - start < 10
    assert out.rejects["rule"].to_list() == ["extract/too_deep"]
    assert out.rejects["doc_id"].to_list() == ["s-f/0000001"]
    assert out.rejects["value"][0] == 40_000  # the measured depth
    assert out.documents["doc_id"].to_list() == ["s-f/0000000", "s-f/0000002"]


def test_a_page_that_runs_past_the_budget_is_killed_and_the_batch_goes_on(tmp_path):
    # With the depth check out of the way, the hard budget is what stops the page: the worker
    # parsing it is killed after 1 s and a fresh one extracts the pages after it.
    docs = raw_table([page(0), deep_page(40_000), page(1), page(2)])
    stage = Extractor(ExtractConfig(max_tag_depth=10**9))
    stage.record_timeout_s = 1.0
    start = time.perf_counter()
    out = stage.run(docs)
    assert time.perf_counter() - start < 20
    assert out.rejects["rule"].to_list() == ["extract/timeout"]
    assert out.rejects["doc_id"].to_list() == ["s-f/0000001"]
    assert out.rejects["value"][0] >= 1.0
    assert out.documents["doc_id"].to_list() == ["s-f/0000000", "s-f/0000002", "s-f/0000003"]
    assert out.stats.counters["extract/worker_restarts"] == 1
    assert "Page 2." in out.documents["text"][2]


# --------------------------------------------------------------------------------------------------
# URL rule
# --------------------------------------------------------------------------------------------------


def test_malformed_url_is_a_counted_reject_not_an_exception():
    drop = url_rules("http://[bad/x", frozenset({"spam.example"}), frozenset())
    assert drop.rule == "url/malformed"
    assert "Invalid IPv6 URL" in drop.detail
    assert url_rules("http://[bad/x", frozenset(), frozenset()) is None  # no blocklist: nothing to check
    docs = pl.DataFrame({
        "doc_id": ["a", "b", "c"], "url": ["https://ok.example/1", "http://[bad/x", "https://ok.example/2"],
        "source": ["s"] * 3, "bucket": ["web"] * 3, "text": [PROSE] * 3,
    })
    out = HeuristicFilter(HeuristicConfig(url_blocklist=["spam.example"])).run(docs)
    assert out.rejects["rule"].to_list() == ["url/malformed"]
    assert out.documents["doc_id"].to_list() == ["a", "c"]


# --------------------------------------------------------------------------------------------------
# A funnel partition through Dagster
# --------------------------------------------------------------------------------------------------


def test_funnel_partition_over_hostile_records_finishes_within_its_budget(tmp_path):
    from assets import funnel
    from helpers.materialize import materialize, module_assets

    (tmp_path / "web").mkdir()
    records = (
        [valid(i) for i in range(3)]
        + [record("https://bad.example/deep", deep_page(40_000), 50), huge_http_header("https://bad.example/header")]
        + [valid(i) for i in range(3, 6)]
        + [record("http://[bad/x", page(60), 60), lying_content_length("https://bad.example/lies", 300)]
        + [valid(i) for i in range(6, 9)]
    )
    write_warc(tmp_path / "web" / "crawl-0.warc.gz", records, compress=True)
    config = {
        "seed": 1, "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "web/*.warc.gz", "format": "warc", "bucket": "web"}],
        "stages": {"record_timeout_s": 2, "heuristic": {"url_blocklist": ["spam.example"]},
                   # Deep pages reach the parser, so the time budget is what stops them.
                   "extract": {"max_tag_depth": 1_000_000}},
    }
    config_path = write_config(tmp_path, config)
    assets = list(module_assets(funnel, config_path).values())
    start = time.perf_counter()
    result = materialize(assets, config_path, partition_key="web-crawl-0")
    assert time.perf_counter() - start < 30
    assert result.success
    md = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert md["raw_documents"]["removed_by_rule"].data == {"ingest/bad_record": 1, "ingest/bad_content_length": 1}
    assert md["extracted_text"]["removed_by_rule"].data == {"extract/timeout": 1}
    assert md["heuristic_filtered"]["removed_by_rule"].data == {"url/malformed": 1}
    assert md["heuristic_filtered"]["docs_out"].value == 9

    out = tmp_path / "out"
    rejects = pl.concat([pl.read_parquet(out / f"{rejects_key(n, 'web-crawl-0')}") for n in
                         ("raw_documents", "extracted_text", "heuristic_filtered")])
    assert dict(zip(rejects["url"], rejects["rule"])) == {
        "https://bad.example/header": "ingest/bad_record",
        "https://bad.example/lies": "ingest/bad_content_length",
        "https://bad.example/deep": "extract/timeout",
        "http://[bad/x": "url/malformed",
    }
    kept = read_stage_documents(LocalDataRoot(out), "heuristic_filtered", "web-crawl-0")
    assert sorted(kept["url"].to_list()) == sorted(f"https://ok.example/{i}" for i in range(9))


# --------------------------------------------------------------------------------------------------
# Isolation inside ingest: a record whose handling raises or overruns
# --------------------------------------------------------------------------------------------------


def test_jsonl_line_whose_handling_raises_or_overruns_is_one_reject(tmp_path, monkeypatch):
    from refinery.stages.readers import jsonl as ingest

    parse = ingest._parse_json_line

    def hostile_parse(rec, line, source, result):
        if b"explode" in line:
            raise MemoryError("the parser ran out of memory")
        if b"spin" in line:
            deadline = time.perf_counter() + 30
            while time.perf_counter() < deadline:
                pass
        return parse(rec, line, source, result)

    monkeypatch.setattr(ingest, "_parse_json_line", hostile_parse)
    lines = [json.dumps({"text": t}).encode() for t in ("a", "explode", "b", "spin", "c")]
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    source = SourceConfig(name="s", path="in/*", format="jsonl", bucket="web")
    start = time.perf_counter()
    out = read_input_shard(InputShard("s-f", "s", "web", str(path)), source, ExtractConfig(), record_timeout_s=0.5)
    assert time.perf_counter() - start < 10
    assert out.documents["raw"].to_list() == ["a", "b", "c"]
    assert out.rejects.select("doc_id", "rule").rows() == [
        (make_doc_id("s-f", 1), "ingest/error"), (make_doc_id("s-f", 3), "ingest/timeout")
    ]
    assert out.rejects["detail"][0] == "MemoryError: the parser ran out of memory"


def test_warc_record_whose_handling_raises_is_one_reject(tmp_path, monkeypatch):
    from refinery.stages.readers import warc as ingest

    row = ingest._warc_row

    def hostile_row(record, index, *args):
        if record.headers.get("WARC-Target-URI") == "https://ok.example/2":
            raise RuntimeError("charset sniffing fell over")
        return row(record, index, *args)

    monkeypatch.setattr(ingest, "_warc_row", hostile_row)
    path = tmp_path / "odd.warc"
    write_warc(path, [valid(i) for i in range(5)], compress=True)
    out = read(path)
    assert out.documents["url"].to_list() == [f"https://ok.example/{i}" for i in (0, 1, 3, 4)]
    assert out.rejects.select("doc_id", "url", "rule", "detail").rows() == [
        (make_doc_id("s-f", 2), "https://ok.example/2", "ingest/error", "RuntimeError: charset sniffing fell over")
    ]


def test_warc_payload_whose_decoding_overruns_is_one_timeout(tmp_path, monkeypatch):
    """UTF-8 text as it came is taken without a timer; a payload that needs decoding work (here a
    Latin-1 page) is decoded under the record's budget, and an overrun there is its reject."""
    from refinery.stages.readers import warc as ingest

    decode = ingest.decode_payload

    def slow_decode(rec, payload, charset, result):
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            pass
        return decode(rec, payload, charset, result)

    monkeypatch.setattr(ingest, "decode_payload", slow_decode)
    latin = http_response("<p>Grüße aus Köln</p>".encode("latin-1"), "text/html; charset=iso-8859-1", random.Random(9))
    records = [valid(0), warc_record("response", "https://latin.example/", latin, random.Random(9),
                                     "application/http; msgtype=response"), valid(2)]
    path = tmp_path / "odd.warc"
    write_warc(path, records, compress=True)
    start = time.perf_counter()
    out = read_input_shard(InputShard("s-f", "s", "web", str(path)),
                           SourceConfig(name="s", path="in/*", format="warc", bucket="web"), ExtractConfig(),
                           record_timeout_s=0.5)
    assert time.perf_counter() - start < 10
    assert out.documents["url"].to_list() == ["https://ok.example/0", "https://ok.example/2"]
    assert out.rejects.select("doc_id", "url", "rule").rows() == [
        (make_doc_id("s-f", 1), "https://latin.example/", "ingest/timeout")
    ]
