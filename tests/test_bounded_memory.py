"""Issue 26, memory bounded per record: raw_documents reads every format as a stream and hands its
rows on in batches bounded by `extract.batch_rows` and `extract.batch_bytes`, written as row groups.

The fast tests check the batching itself (and a per-file stage's peak on a file 8x another's, in a
child process): batches and row groups within their bounds, the same rows,
rejects and stats as one whole read (a lying WARC Content-Length found after its record was read
included), byte-identical outputs across reruns, tables read back by row group in bounded slices
(how per-document stages read their input), and the preflight's refusal of bad bounds. The slow
ones read decompression bombs (2 GB of gzip JSONL and WARC from a few MB, a 1 GB Parquet row group
from under a KB) through raw_documents in a subprocess and bound its peak memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from orchestration.cli import main
from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import REJECTS_SCHEMA, InputShard, make_doc_id
from refinery.stages.ingest import RAW_SCHEMA, read_input_shard, stream_input_shard
from refinery.stages.parquet_batches import ParquetBatchWriter, parquet_batches
from synthetic.warc import gzip_member, http_response, warc_record

from helpers.bombs import peak_rss_of_ingest, write_jsonl_bomb, write_parquet_bomb, write_warc_bomb
from helpers.configs import demo_config
from helpers.stage_memory import peak_of_signatures

# What a raw_documents worker may reach reading any bomb below with the default batch bounds
# (64 MiB, 10,000 rows; 8 MiB records): Python with polars, pyarrow and FastWARC loaded is about
# 140 MB, one batch of text with its frames and Parquet buffers a few times its size.
PEAK_RSS_BOUND = 1 << 30
GB = 1 << 30


def shard_of(path: Path, source: SourceConfig) -> InputShard:
    return InputShard("s-f", source.name, source.bucket, str(path))


def batched(path: Path, source: SourceConfig, **extract) -> tuple[list[pl.DataFrame], list[pl.DataFrame], object]:
    """The batches `stream_input_shard` hands on (documents and rejects) and its stats."""
    documents, rejects = [], []
    stats = stream_input_shard(shard_of(path, source), source, ExtractConfig(**extract), documents.append, rejects.append)
    return documents, rejects, stats


def assert_same_as_whole_read(path: Path, source: SourceConfig, **extract) -> list[pl.DataFrame]:
    """Batches of `path` put together equal one whole read's tables and stats; returns the batches."""
    whole = read_input_shard(shard_of(path, source), source, ExtractConfig())
    documents, rejects, stats = batched(path, source, **extract)
    assert pl.concat(documents).equals(whole.documents)
    assert pl.concat(rejects).equals(whole.rejects)
    mine, theirs = stats.to_dict(), whole.stats.to_dict()
    mine.pop("wall_s"), theirs.pop("wall_s")
    assert mine == theirs
    return documents


def jsonl_with_bad_lines(path: Path, lines: int) -> list[int]:
    """Gzip JSONL of `lines` lines, every 7th not JSON; returns the bad lines' indexes."""
    bad = [i for i in range(lines) if i % 7 == 3]
    rows = [b"{not json\n" if i in bad else (json.dumps({"url": f"https://j.example/{i}", "text": f"doc {i} " * 20}) + "\n").encode()
            for i in range(lines)]
    path.write_bytes(gzip.compress(b"".join(rows), mtime=0))
    return bad


def test_jsonl_batches_hold_at_most_batch_rows_and_add_up_to_the_whole_read(tmp_path):
    path = tmp_path / "in.jsonl.gz"
    bad = jsonl_with_bad_lines(path, 1000)
    source = SourceConfig(name="s", path=str(path), format="jsonl", bucket="books")
    documents = assert_same_as_whole_read(path, source, batch_rows=64)
    assert len(documents) == -(-1000 // 64)
    assert [d.height for d in documents[:2]] == [64 - sum(1 for i in bad if i < 64), 64 - sum(1 for i in bad if 64 <= i < 128)]
    _, rejects, stats = batched(path, source, batch_rows=64)
    assert pl.concat(rejects)["doc_id"].to_list() == [make_doc_id("s-f", i) for i in bad]
    assert stats.docs_in == 1000 and stats.docs_out == 1000 - len(bad)
    assert dict(stats.dropped) == {"ingest/bad_json": len(bad)}


def test_batch_bytes_bounds_a_batch_of_large_records(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} " + "x" * 300_000}) + "\n" for i in range(40)))
    source = SourceConfig(name="s", path=str(path), format="jsonl", bucket="books")
    documents = assert_same_as_whole_read(path, source, batch_bytes=1 << 20)
    # 300 KB each: a batch holds what fits in 1 MiB, three records.
    assert [d.height for d in documents] == [3] * 13 + [1]


def lying_record(url: str, delta: int) -> bytes:
    rng = random.Random(98)
    body = f"<html><body><p>{'lies ' * 80}</p></body></html>".encode()
    rec = warc_record("response", url, http_response(body, "text/html; charset=utf-8", rng), rng,
                      "application/http; msgtype=response")
    m = re.search(rb"Content-Length: (\d+)\r\n\r\nHTTP", rec)
    return rec.replace(m.group(0), b"Content-Length: %d\r\n\r\nHTTP" % (int(m.group(1)) + delta))


def valid_record(i: int) -> bytes:
    rng = random.Random(i)
    body = f"<html><head><title>Page {i}</title></head><body><p>{f'word{i} ' * 60}</p></body></html>".encode()
    return warc_record("response", f"https://ok.example/{i}", http_response(body, "text/html; charset=utf-8", rng),
                       rng, "application/http; msgtype=response")


@pytest.mark.parametrize("compress", [True, False])
def test_warc_record_found_bad_after_it_was_read_is_a_reject_at_every_batch_size(tmp_path, compress):
    # The lying record is read as a row first; the reader learns it was bad only from what follows,
    # so the record a batch holds back must still be the one it turns into a reject.
    path = tmp_path / "in.warc.gz"
    records = [valid_record(i) for i in range(5)] + [lying_record("https://bad.example/lies", 500)] + [
        valid_record(i) for i in range(5, 12)]
    path.write_bytes(b"".join(gzip_member(r) if compress else r for r in records))
    source = SourceConfig(name="s", path=str(path), format="warc", bucket="web")
    for rows in (1, 2, 5, 6):
        assert_same_as_whole_read(path, source, batch_rows=rows)
    _, rejects, _ = batched(path, source, batch_rows=1)
    assert pl.concat(rejects)["rule"].to_list() == ["ingest/bad_content_length"]
    assert pl.concat(rejects)["url"].to_list() == ["https://bad.example/lies"]


def test_a_parquet_row_group_is_decoded_a_few_rows_at_a_time(tmp_path):
    path = tmp_path / "in.parquet"
    texts = [f"{i} " + "y" * 100_000 for i in range(60)]
    pq.write_table(pa.table({"text": texts, "url": [f"https://t.example/{i}" for i in range(60)]}), path,
                   row_group_size=60)
    source = SourceConfig(name="s", path=str(path), format="parquet", bucket="books")
    # 1 MiB of batch at 256 KiB records: four rows decoded at a time; the records batch by bytes.
    documents = assert_same_as_whole_read(path, source, batch_bytes=1 << 20, max_record_bytes=256 << 10)
    assert sum(d.height for d in documents) == 60 and max(d.height for d in documents) <= 10
    assert pl.concat(documents)["raw"].to_list() == texts


def ingest_to_files(path: Path, source: SourceConfig, out: Path, **extract) -> tuple[str, str]:
    out.mkdir()
    with ParquetBatchWriter(out / "documents.parquet", RAW_SCHEMA) as documents, \
         ParquetBatchWriter(out / "rejects.parquet", REJECTS_SCHEMA) as rejects:
        stream_input_shard(shard_of(path, source), source, ExtractConfig(**extract), documents.write, rejects.write)
    for f, writer in (("documents.parquet", documents), ("rejects.parquet", rejects)):
        assert writer.sha256 == hashlib.sha256((out / f).read_bytes()).hexdigest()
    return documents.sha256, rejects.sha256


def test_outputs_are_one_row_group_per_batch_and_identical_across_reruns(tmp_path):
    path = tmp_path / "in.jsonl.gz"
    jsonl_with_bad_lines(path, 500)
    source = SourceConfig(name="s", path=str(path), format="jsonl", bucket="books")
    first = ingest_to_files(path, source, tmp_path / "a", batch_rows=100)
    assert ingest_to_files(path, source, tmp_path / "b", batch_rows=100) == first
    meta = pq.ParquetFile(tmp_path / "a" / "documents.parquet").metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [
        sum(1 for i in range(lo, lo + 100) if i % 7 != 3) for lo in range(0, 500, 100)]
    assert pl.read_parquet(tmp_path / "a" / "rejects.parquet").height == sum(1 for i in range(500) if i % 7 == 3)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("batch_bytes", float("inf"), "stages.extract.batch_bytes: inf is not a finite number"),
    ("batch_bytes", 0, "stages.extract.batch_bytes: Input should be greater than or equal to 1048576"),
    ("batch_bytes", 1 << 40, "stages.extract.batch_bytes: Input should be less than or equal to 4294967296"),
    ("batch_rows", -1, "stages.extract.batch_rows: Input should be greater than or equal to 1"),
    ("batch_rows", 10**9, "stages.extract.batch_rows: Input should be less than or equal to 1000000"),
    ("max_file_bytes", 1000, "stages.extract.max_file_bytes: Input should be greater than or equal to 1048576"),
    ("max_inflation_ratio", 1.0, "stages.extract.max_inflation_ratio: Input should be greater than or equal to 2"),
    ("max_inflation_ratio", float("nan"), "stages.extract.max_inflation_ratio: nan is not a finite number"),
    ("inflation_floor_bytes", 4096,
     "stages.extract.inflation_floor_bytes: Input should be greater than or equal to 1048576"),
])
def test_preflight_refuses_batch_bounds_out_of_range(tmp_path, capsys, field, value, message):
    data = demo_config(tmp_path / "out")
    data["stages"].setdefault("extract", {})[field] = value
    config = tmp_path / "refinery.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["validate", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"  {message}" in err


# ---- decompression bombs, in a subprocess -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "write", "size"), [
    ("jsonl", write_jsonl_bomb, 2 * GB),
    ("warc", write_warc_bomb, 2 * GB),
    ("parquet", write_parquet_bomb, 1 * GB),
])
def test_bomb_is_read_whole_in_bounded_memory(tmp_path, fmt, write, size):
    path = tmp_path / f"bomb.{fmt}"
    records, text_bytes = write(path, size)
    assert path.stat().st_size < 12 << 20  # a few MB on disk
    assert records * text_bytes > 0.99 * size  # the text alone; the file decompresses to more
    # Memory is what is measured here: the bound on the inflation ratio would stop the bomb early.
    report = peak_rss_of_ingest(path, fmt, tmp_path / "out", {"max_inflation_ratio": None})
    assert report["docs_out"] == report["documents_rows"] == records
    assert report["bytes_out"] == records * text_bytes
    assert report["dropped"] == {} and report["rejects_rows"] == 0
    assert report["peak_rss_bytes"] < PEAK_RSS_BOUND, report


def test_parquet_batches_follow_row_groups_and_keep_an_empty_tables_schema(tmp_path):
    frame = pl.DataFrame({"doc_id": [f"d{i}" for i in range(25)], "n": list(range(25))})
    path = tmp_path / "t.parquet"
    with ParquetBatchWriter(path) as writer:  # the first frame sets the schema
        for start in (0, 10, 20):
            writer.write(frame.slice(start, 10))
    assert [b.height for b in parquet_batches(path, rows=4)] == [4, 4, 2, 4, 4, 2, 4, 1]
    assert pl.concat(parquet_batches(path, rows=4)).equals(frame)
    empty = tmp_path / "empty.parquet"
    with ParquetBatchWriter(empty) as writer:
        writer.write(frame.head(0))
    assert [(b.height, b.schema) for b in parquet_batches(empty, rows=4)] == [(0, frame.schema)]


# ---- a per-file stage's memory follows its batches, not its file ----------------------------------


def test_a_per_file_stage_on_a_file_8x_larger_peaks_within_1_2x(tmp_path):
    # dedup_signatures' file task, read and written a record batch at a time (1 MiB of text): 300
    # and 2,400 documents of about 12 KB, 3.4 and 27.3 MiB of text. Read whole, as before, the larger
    # file's task peaked at 1.5x the smaller's (238 -> 359 MiB at 400 and 3,200 documents).
    small = peak_of_signatures(tmp_path / "small", 300)
    large = peak_of_signatures(tmp_path / "large", 2400)
    assert (small["docs"], large["docs"]) == (300, 2400)
    assert large["peak_rss_bytes"] <= 1.2 * small["peak_rss_bytes"], (small, large)


def test_parquet_batches_cut_by_bytes_within_a_row_group(tmp_path):
    sizes = [300, 300, 300, 2000, 10, 10, 10, 10, 10, 700]
    frame = pl.DataFrame({"doc_id": [f"d{i}" for i in range(len(sizes))], "text": ["x" * n for n in sizes]})
    path = tmp_path / "t.parquet"
    with ParquetBatchWriter(path) as writer:
        writer.write(frame)  # one row group
    batches = list(parquet_batches(path, rows=4, max_bytes=1000))
    # At most 4 rows and 1,000 bytes of strings (doc_id included), a larger row alone.
    assert [b["doc_id"].to_list() for b in batches] == [
        ["d0", "d1", "d2"], ["d3"], ["d4", "d5", "d6", "d7"], ["d8", "d9"]]
    assert pl.concat(batches).equals(frame)
    # Without a byte bound the cuts are every 4 rows, as by rows alone.
    assert [b.height for b in parquet_batches(path, rows=4)] == [4, 4, 2]


def test_quality_scores_are_the_same_bytes_whatever_the_batch_bounds():
    import numpy as np
    import torch

    from refinery.models import quality as q
    from refinery.models import quality_features as qf

    generator = torch.Generator().manual_seed(0)
    model = q.QualityModel(weight=torch.randn((1 << 12) + qf.SHAPE_ROWS, generator=generator), bias=torch.tensor(0.25),
                           num_features=1 << 12, ngram=2, max_chars=2000)
    rng = random.Random(5)
    words = ["river", "stone", "casino", "bonus", "harvest", "letters", "cheap", "council"]
    texts = pl.Series([" ".join(rng.choice(words) for _ in range(rng.randint(0, 900))) for _ in range(300)] + [None])
    whole = model.score(texts)
    # The byte bound cuts the featurization only: the same bytes at any bound.
    for max_bytes in (1 << 30, 5000, 1):
        assert model.score(texts, batch_bytes=max_bytes).tobytes() == whole.tobytes()
    assert np.isfinite(whole).all()
    # Batches of other document counts may differ in the last bit (torch's vectorized sigmoid and
    # its scalar tail), which is why the scorer keeps its document count.
    assert np.abs(model.score(texts, batch_docs=7) - whole).max() <= 2.0 ** -23


# ---- a per-file decompressed-size bound: CPU bounded as well ------------------------------------

MB = 1 << 20


@pytest.mark.parametrize(("fmt", "write", "tail"), [
    ("jsonl", write_jsonl_bomb, b"{broken\n"),  # read on, this line would be an ingest/bad_json
    ("warc", write_warc_bomb, b"\x1f\x8b\x08\x00broken"),  # and this a bad gzip member
    ("parquet", write_parquet_bomb, None),
])
def test_a_file_inflating_past_max_file_bytes_is_one_reject_and_read_no_further(tmp_path, fmt, write, tail):
    path = tmp_path / f"bomb.{fmt}"
    kwargs = {"member_bytes": 2 * MB} if fmt == "jsonl" else {}
    records, text_bytes = write(path, 24 * MB, **kwargs)
    if tail is not None:
        with open(path, "ab") as f:
            f.write(tail)
    source = SourceConfig(name="bomb", path=str(path), format=fmt, bucket="web")
    documents, rejects, stats = batched(path, source, max_file_bytes=4 * MB)
    kept = sum(d.height for d in documents)
    assert 0 < kept < records
    assert kept * text_bytes <= 4 * MB
    assert dict(stats.dropped) == {"ingest/file_too_large": 1}, "one reject, and nothing read after it"
    [reject] = pl.concat(rejects).to_dicts()
    assert reject["rule"] == "ingest/file_too_large" and "max_file_bytes 4194304" in reject["detail"]
    # The whole file, without the bound: every record, and the damaged tail counted.
    documents, _, stats = batched(path, source)
    assert sum(d.height for d in documents) == records
    assert sum(stats.dropped.values()) == (tail is not None)



def _real_pages(fmt: str, count: int) -> tuple[bytes, list[str]]:
    """`count` pages of random words (which gzip shrinks about 2-3x, as real text), as gzip members of
    `fmt` (jsonl or warc), and their URLs."""
    rng = random.Random(3)
    words = [f"w{rng.randrange(10**6)}" for _ in range(5000)]
    urls = [f"https://real.example/{i}" for i in range(count)]
    texts = [" ".join(rng.choice(words) for _ in range(2000)) for _ in urls]
    if fmt == "jsonl":
        return gzip_member("".join(json.dumps({"url": u, "text": t}) + "\n" for u, t in zip(urls, texts)).encode()), urls
    html = [f"<html><body><p>{t}</p></body></html>".encode() for t in texts]
    return b"".join(gzip_member(warc_record("response", u, http_response(h, "text/html; charset=utf-8", rng), rng,
                                            "application/http; msgtype=response")) for u, h in zip(urls, html)), urls


@pytest.mark.parametrize(("fmt", "write"), [("jsonl", write_jsonl_bomb), ("warc", write_warc_bomb),
                                            ("parquet", write_parquet_bomb)])
def test_a_file_inflating_past_the_ratio_bound_is_one_reject_after_its_real_pages(tmp_path, fmt, write):
    # Real pages first, then a bomb (about 300x) of 40 MB: with stretches of 4 MB and the default
    # ratio (100x), reading stops within two stretches of the bomb's start, and the real pages
    # before it are kept.
    path = tmp_path / f"bomb.{fmt}"
    records, text_bytes = write(path, 40 * MB)
    real_urls: list[str] = []
    if fmt != "parquet":
        bomb = path.read_bytes()
        real, real_urls = _real_pages(fmt, 20)
        path.write_bytes(real + bomb)
    assert ExtractConfig().max_inflation_ratio == 100
    source = SourceConfig(name="bomb", path=str(path), format=fmt, bucket="web")
    documents, rejects, stats = batched(path, source, inflation_floor_bytes=4 * MB)
    kept = pl.concat(documents)
    assert kept["url"].head(len(real_urls)).to_list() == real_urls
    bomb_kept = kept.height - len(real_urls)
    assert 0 < bomb_kept < records
    assert bomb_kept * text_bytes <= 9 * MB, "reading stopped within two stretches"
    assert dict(stats.dropped) == {"ingest/file_too_large": 1}, "one reject, and nothing read after it"
    [reject] = pl.concat(rejects).to_dicts()
    assert "past max_inflation_ratio 100" in reject["detail"] and reject["value"] <= 10 * MB
    # Without the ratio bound the file is read to its end.
    documents, _, stats = batched(path, source, inflation_floor_bytes=4 * MB, max_inflation_ratio=None)
    assert sum(d.height for d in documents) == records + len(real_urls) and not stats.dropped


def test_the_default_inflation_bound_refuses_no_real_file_of_the_repository():
    # Every input of the demo and the multilingual pages, read with the defaults: none is refused.
    # (books-91-huge, one 50 MB line of a repeated paragraph, inflates 130x: its line is one
    # ingest/too_large, read no further, and the file is under the default stretch.)
    repo = Path(__file__).resolve().parents[1]
    files = [f for f in sorted((repo / "data").rglob("*")) if f.is_file() and f.name.endswith(
        (".warc", ".warc.gz", ".jsonl", ".jsonl.gz", ".parquet"))]
    assert len(files) >= 10
    for f in files:
        fmt = "warc" if ".warc" in f.name else "parquet" if f.suffix == ".parquet" else "jsonl"
        source = SourceConfig(name="real", path=str(f), format=fmt, bucket="web")
        _, _, stats = batched(f, source)
        assert "ingest/file_too_large" not in stats.dropped, f
