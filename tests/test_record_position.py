"""`refinery lineage` and `why` name a record's place in its input file as what the number is: a
Parquet or Hugging Face dataset row, a JSONL record with its line's byte offset, a WARC record's byte."""

from refinery.documents.tables import record_position
from refinery.lineage import format_lineage


def lineage_answer(file: str, index: int, offset: int) -> dict:
    return {"shard": "web/shard-00000", "offset": 5, "token_id": 17, "in_overlap_prefix": False,
            "text": {"error": "no tokenizer here"}, "entry": 0, "bucket_entry": 0, "bucket": "web", "entry_start": 0,
            "entry_end": 9, "window": 0, "n_windows": 1, "doc_id": "web-00/0000308", "url": "https://a.example/x",
            "source": "pages", "file": file, "record_index": index, "record_offset": offset, "fetch_time": None,
            "content_type": None, "text_bytes": 40, "funnel": {}}


def test_lineage_on_a_parquet_source_says_row():
    out = format_lineage(lineage_answer("pages/part-0.parquet", 308, 308))
    assert "source    pages: pages/part-0.parquet row 308\n" in out and "at byte" not in out


def test_each_format_is_labelled_as_what_its_number_is():
    assert record_position("ds/train", 4, 4) == "row 4"  # a Hugging Face dataset folder
    assert record_position("crawl/a.warc.gz", 3, 10_240) == "record 3 at byte 10240"
    assert record_position("man/b.jsonl.gz", 7, 900) == "line record 7, at byte 900 of the decompressed text"
