"""Inputs that are small on disk and huge once read, made on the fly, and a subprocess that reads
one through `raw_documents` and reports its peak memory.

- `write_jsonl_bomb`: gzip JSONL, one member of many identical lines compressed once and repeated:
  a few MB that decompress to gigabytes.
- `write_warc_bomb`: a per-record gzip WARC (CommonCrawl's layout) of one HTML response record
  compressed once and repeated.
- `write_parquet_bomb`: a Parquet file whose one row group holds a gigabyte of text, stored as a
  dictionary of a few distinct values (a few hundred KB on disk).
- `write_difficulty_model_bomb`: a difficulty reference model (.npz) of order 1 whose one count
  array is all zeros: a few hundred KB that decompress to `total_bytes`.
- `peak_rss_of_ingest`: `stream_input_shard` writing raw_documents batch by batch, as the asset
  does, in a fresh Python process; returns what it read and its peak RSS.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path


def _text(size: int, seed: int = 0) -> str:
    """`size` characters of one English-looking sentence repeated (`seed` picks where its words
    start): short enough a period for gzip to shrink it about 300 times."""
    words = "the quick brown fox jumps over a lazy dog while seven wise owls watch from old oak trees".split()
    sentence = " ".join(words[(seed + k) % len(words)] for k in range(12)) + ".\n"
    return (sentence * (size // len(sentence) + 1))[:size]


def write_jsonl_bomb(path: Path, total_bytes: int, line_bytes: int = 100_000,
                     member_bytes: int = 64 << 20) -> tuple[int, int]:
    """A gzip JSONL file that decompresses to at least `total_bytes`; returns its line count and
    the bytes of each line's text."""
    line = (json.dumps({"url": "https://bomb.example/doc", "text": _text(line_bytes)}) + "\n").encode()
    per_member = max(1, member_bytes // len(line))
    member = gzip.compress(line * per_member, compresslevel=6, mtime=0)
    members = -(-total_bytes // (per_member * len(line)))
    with open(path, "wb") as f:
        for _ in range(members):
            f.write(member)
    return members * per_member, line_bytes


def write_warc_bomb(path: Path, total_bytes: int, page_bytes: int = 400_000) -> tuple[int, int]:
    """A per-record gzip WARC of identical HTML responses decompressing to at least `total_bytes`;
    returns its record count and the bytes of each record's HTML."""
    body = f"<html><head><title>t</title></head><body><p>{_text(page_bytes)}</p></body></html>".encode()
    http = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    head = ("WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: https://bomb.example/page\r\n"
            "WARC-Date: 2024-01-01T00:00:00Z\r\nWARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-000000000000>\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n").encode()
    record = head + http + b"\r\n\r\n"
    member = gzip.compress(record, compresslevel=6, mtime=0)
    records = -(-total_bytes // len(record))
    with open(path, "wb") as f:
        for _ in range(records):
            f.write(member)
    return records, len(body)


def write_parquet_bomb(path: Path, total_bytes: int, value_bytes: int = 100_000, distinct: int = 5) -> tuple[int, int]:
    """A Parquet file of one row group holding at least `total_bytes` of text in a `text` column
    (dictionary-encoded, so the file is small); returns its row count and the bytes of each text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = -(-total_bytes // value_bytes)
    values = pa.array([_text(value_bytes, seed) for seed in range(distinct)], type=pa.large_string())
    indices = pa.array([i % distinct for i in range(rows)], type=pa.int32())
    table = pa.table({"text": pa.DictionaryArray.from_arrays(indices, values)})
    pq.write_table(table, path, row_group_size=rows, compression="zstd")
    return rows, value_bytes


_INGEST_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import polars as pl
    from refinery.config import ExtractConfig, SourceConfig
    from refinery.documents import REJECTS_SCHEMA, InputShard
    from refinery.stages.ingest import RAW_SCHEMA, stream_input_shard
    from refinery.stages.parquet_batches import ParquetBatchWriter

    path, fmt, out, extract = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    source = SourceConfig(name="bomb", path=path, format=fmt, bucket="web")
    shard = InputShard("bomb-x", "bomb", "web", path)
    with ParquetBatchWriter(os.path.join(out, "documents.parquet"), RAW_SCHEMA) as documents, \\
         ParquetBatchWriter(os.path.join(out, "rejects.parquet"), REJECTS_SCHEMA) as rejects:
        stats = stream_input_shard(shard, source, ExtractConfig(**extract), documents.write, rejects.write)
    # VmHWM, this process image's own peak: ru_maxrss keeps the forking parent's peak across exec
    # (a pytest worker's, past a gigabyte after a few hundred tests).
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"peak_rss_bytes": int(hwm.split()[1]) * 1024,
                      "docs_out": stats.docs_out, "bytes_out": stats.bytes_out, "dropped": dict(stats.dropped),
                      "documents_rows": documents.rows, "rejects_rows": rejects.rows}))
""")


def write_difficulty_model_bomb(path: Path, total_bytes: int) -> None:
    """A reference model file (refinery/models/difficulty.py's layout, order 1, 1,000 training
    tokens) whose `ngram_counts_1` member declares `total_bytes` of zeros; everything else fits."""
    import io
    import zipfile

    import numpy as np

    meta = {"format": 1, "order": 1, "vocab_size": 256, "discount": 0.75, "tokens": 1000, "tokenizer_sha256": ""}
    arrays = {"meta": np.array(json.dumps(meta)), "ngram_keys_1": np.arange(1, 11, dtype=np.uint64),
              "ngram_counts_1": np.zeros(total_bytes // 4, dtype=np.uint32),
              "context_keys_0": np.array([7], dtype=np.uint64), "context_totals_0": np.array([10], dtype=np.uint32),
              "context_followers_0": np.array([10], dtype=np.uint32)}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, array, allow_pickle=False)
            archive.writestr(f"{name}.npy", buffer.getvalue())


def peak_rss_of_ingest(path: Path, fmt: str, out: Path, extract: dict | None = None) -> dict:
    """Read `path` through raw_documents in a fresh process, writing its tables under `out`; its
    stats and peak resident memory (bytes)."""
    out.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _INGEST_SCRIPT, str(path), fmt, str(out), json.dumps(extract or {})],
                          capture_output=True, text=True, cwd=root, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
