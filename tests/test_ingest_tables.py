"""raw_documents from Parquet files and Hugging Face datasets saved to disk, and their bad inputs."""

from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from refinery.stages.ingest import read_input_shard
from refinery.stages.readers import InputColumnError
from refinery.config import ExtractConfig, SourceConfig, parse_config
from refinery.documents import InputShard, input_shards

ROWS = [
    {"content": "The first document, about rivers.", "link": "https://a.example/1", "uid": "r1"},
    {"content": None, "link": "https://a.example/2", "uid": "r2"},
    {"content": "Third, with no link.", "link": None, "uid": "r3"},
    {"content": "Fourth\x00binary.", "link": "https://a.example/4", "uid": "r4"},
    {"content": "Fifth and last.", "link": "", "uid": None},
]


def source(fmt: str, **kw) -> SourceConfig:
    fields = {"text_field": "content", "url_field": "link", "id_field": "uid", **kw}
    return SourceConfig(name="curated", path="in/*", format=fmt, bucket="books", **fields)


def read(path: Path, src: SourceConfig, key: str = "curated-x", **extract):
    shard = InputShard(key=key, source=src.name, bucket=src.bucket, path=str(path))
    return read_input_shard(shard, src, ExtractConfig(**extract))


def expect_rows(out, key: str) -> None:
    """ROWS read as documents: rows 0, 2 and 4 kept (row 2 named by its id, row 4 by nothing), row 1
    rejected for its null text, row 3 for its NUL."""
    docs = out.documents
    assert docs["doc_id"].to_list() == [f"{key}/0000000", f"{key}/0000002", f"{key}/0000004"]
    assert docs["raw"].to_list() == ["The first document, about rivers.", "Third, with no link.", "Fifth and last."]
    assert docs["url"].to_list() == ["https://a.example/1", "r3", None]
    assert docs["record_offset"].to_list() == [0, 2, 4]
    assert docs["record_index"].to_list() == [0, 2, 4]
    assert set(docs["bucket"]) == {"books"} and set(docs["content_type"]) == {"text/plain"}
    rejects = out.rejects
    assert rejects["doc_id"].to_list() == [f"{key}/0000001", f"{key}/0000003"]
    assert rejects["rule"].to_list() == ["ingest/missing_text", "ingest/binary_payload"]
    assert rejects["detail"][0] == "field 'content' is missing"
    assert rejects["url"].to_list() == ["https://a.example/2", "https://a.example/4"]
    assert out.stats.docs_out == 3 and dict(out.stats.dropped) == {"ingest/missing_text": 1, "ingest/binary_payload": 1}


def write_parquet(path: Path, rows: list[dict], **kw) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, **kw)
    return path


# --------------------------------------------------------------------------------------------------
# Parquet
# --------------------------------------------------------------------------------------------------


def test_parquet_rows_become_documents(tmp_path):
    path = write_parquet(tmp_path / "part-0.parquet", ROWS, row_group_size=2)
    expect_rows(read(path, source("parquet")), "curated-x")


def test_parquet_text_of_another_type_and_oversized_text_are_counted_rejects(tmp_path):
    rows = [{"body": 7}, {"body": "x" * 2000}, {"body": "kept"}]
    path = write_parquet(tmp_path / "t.parquet", [{"body": str(r["body"]) if i else None, "n": r["body"] if i == 0 else 0}
                                                  for i, r in enumerate(rows)])
    out = read(path, SourceConfig(name="s", path="*", format="parquet", bucket="web", text_field="n"))
    assert out.documents.height == 0 and out.rejects["rule"].to_list() == ["ingest/missing_text"] * 3
    assert out.rejects["detail"][0] == "field 'n' is a int"
    out = read(path, SourceConfig(name="s", path="*", format="parquet", bucket="web", text_field="body"),
               max_record_bytes=1000)
    assert out.rejects["rule"].to_list() == ["ingest/missing_text", "ingest/too_large"]
    assert out.rejects["value"][1] == 2000.0 and out.documents["raw"].to_list() == ["kept"]


def test_parquet_binary_column_is_read_as_utf8(tmp_path):
    table = pa.table({"text": pa.array(["héllo".encode(), b"\xff\xfe\xfd garbage", None], type=pa.binary())})
    pq.write_table(table, tmp_path / "b.parquet")
    out = read(tmp_path / "b.parquet", SourceConfig(name="s", path="*", format="parquet", bucket="web"))
    assert out.documents["raw"].to_list() == ["héllo"]
    assert out.rejects["rule"].to_list() == ["ingest/bad_utf8", "ingest/missing_text"]


def test_a_string_value_that_is_not_utf8_costs_its_own_row(tmp_path):
    """A writer that skipped validation can store invalid UTF-8 in a string column; pyarrow then
    refuses the whole batch. Here the bad text is one `ingest/bad_utf8`, a bad url takes
    replacement characters, and every other row comes out."""
    as_string = lambda values: pa.array(values, type=pa.binary()).view(pa.string())  # noqa: E731 - unvalidated
    table = pa.table({"text": as_string([b"first page", b"bad \xff\xfe text", b"third page", b"fourth page"]),
                      "url": as_string([b"https://a.example/1", b"https://a.example/2", b"https://a.example/\xff",
                                        b"https://a.example/4"])})
    pq.write_table(table, tmp_path / "s.parquet")
    out = read(tmp_path / "s.parquet", SourceConfig(name="s", path="*", format="parquet", bucket="web"))
    assert out.documents["raw"].to_list() == ["first page", "third page", "fourth page"]
    assert out.documents["url"].to_list() == ["https://a.example/1", "https://a.example/\ufffd", "https://a.example/4"]
    assert out.rejects["rule"].to_list() == ["ingest/bad_utf8"]


def test_parquet_missing_text_or_id_column_names_the_field_and_the_columns(tmp_path):
    path = write_parquet(tmp_path / "p.parquet", [{"body": "a", "uid": "1"}])
    with pytest.raises(InputColumnError) as err:
        read(path, source("parquet", id_field=None))
    assert "has no column 'content' (the source's text_field); its columns are ['body', 'uid']" in str(err.value)
    with pytest.raises(InputColumnError, match="no column 'key' \\(the source's id_field\\)"):
        read(path, source("parquet", text_field="body", id_field="key"))
    # url_field is optional: a table without it has no URLs
    out = read(path, source("parquet", text_field="body", url_field="nope", id_field=None))
    assert out.documents["url"].to_list() == [None]


def test_parquet_corrupt_row_group_is_one_reject_and_the_others_are_read(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", [{"text": f"document number {i} " * 20} for i in range(100)],
                         row_group_size=50, compression="snappy")
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + 30 : start + chunk.total_compressed_size - 5] = b"\xab" * (chunk.total_compressed_size - 35)
    path.write_bytes(bytes(data))
    out = read(path, SourceConfig(name="s", path="*", format="parquet", bucket="web"))
    assert out.rejects["rule"].to_list() == ["ingest/bad_rows"]
    assert out.rejects["detail"][0].startswith("rows 0..50 unreadable: row group 0 unreadable")
    assert out.documents["raw"].to_list() == [f"document number {i} " * 20 for i in range(50, 100)]
    assert out.documents["record_offset"].to_list() == list(range(50, 100))


def test_parquet_file_cut_short_is_one_truncated_file_reject(tmp_path):
    path = write_parquet(tmp_path / "cut.parquet", ROWS)
    path.write_bytes(path.read_bytes()[:-40])
    out = read(path, source("parquet"))
    assert out.documents.height == 0 and out.rejects["rule"].to_list() == ["ingest/truncated_file"]
    assert "not a readable Parquet file" in out.rejects["detail"][0]


# --------------------------------------------------------------------------------------------------
# Hugging Face datasets saved to disk
# --------------------------------------------------------------------------------------------------


def test_hf_dataset_rows_become_documents(tmp_path):
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=2)  # two Arrow files: rows keep counting across them
    expect_rows(read(tmp_path / "ds", source("hf_dataset")), "curated-x")


def test_hf_dataset_dict_splits_are_inputs_of_their_own(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:3]), "test": datasets.Dataset.from_list(ROWS[3:])})
    dd.save_to_disk(str(tmp_path / "corpus"))
    cfg = parse_config({"data_root": "out", "buckets": ["books"], "sources": [
        {"name": "curated", "path": "corpus", "format": "hf_dataset", "bucket": "books", "text_field": "content"}]},
        base_dir=str(tmp_path))
    shards = input_shards(cfg)
    assert [(s.key, Path(s.path).name) for s in shards] == [("curated-corpus~train", "train"), ("curated-corpus~test", "test")]
    out = read(Path(shards[1].path), source("hf_dataset"), key=shards[1].key)
    assert out.documents["raw"].to_list() == ["Fifth and last."]
    assert out.rejects["rule"].to_list() == ["ingest/binary_payload"]


def test_hf_dataset_bad_inputs(tmp_path):
    datasets.Dataset.from_list([{"body": "a"}]).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(InputColumnError, match=r"no column 'content' \(the source's text_field\); its columns are \['body'\]"):
        read(tmp_path / "ds", source("hf_dataset", id_field=None))
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputColumnError, match="not a Hugging Face dataset saved with save_to_disk"):
        read(tmp_path / "plain", source("hf_dataset"))


def test_hf_dataset_arrow_file_cut_short_keeps_the_rows_before_the_cut(tmp_path):
    rows = [{"text": f"row {i} " + "word " * 50} for i in range(3000)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    arrow = next((tmp_path / "ds").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    out = read(tmp_path / "ds", SourceConfig(name="s", path="*", format="hf_dataset", bucket="web"))
    kept = out.documents.height
    assert 0 < kept < 3000 and out.documents["raw"].to_list() == [r["text"] for r in rows[:kept]]
    assert out.rejects["rule"].to_list() == ["ingest/truncated_file"]
    assert out.rejects["detail"][0].startswith(f"rows from {kept} unreadable")


def test_jsonl_record_without_url_is_named_by_its_id_field(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('{"content": "one", "link": "https://a.example/1", "uid": "r1"}\n'
                    '{"content": "two", "uid": 42}\n{"content": "three", "uid": true}\n')
    out = read(path, SourceConfig(name="curated", path="*", format="jsonl", bucket="books",
                                  text_field="content", url_field="link", id_field="uid"))
    assert out.documents["url"].to_list() == ["https://a.example/1", "42", None]  # a boolean is no id
