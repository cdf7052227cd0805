"""Throughput of `read_input_shard` (raw_documents) next to the bare library loop, in one process.

- WARC: a per-record-gzip WARC of HTML pages written by `refinery.testing.crawl.write_corpus`. Baseline:
  FastWARC's `ArchiveIterator` with HTTP parsing, reading each payload and decoding it as UTF-8
  into a list of (url, text) — the least any reader must do.
- JSONL: the same documents as gzip JSONL. Baseline: `gzip.open`, `json.loads` per line.

Ours does the same plus the checks (charset sniffing, binary and size limits, a second pass over
the gzip members to detect truncation) and builds the Polars table. Each timing is the median of
`--repeats` runs, alternating baseline and ours.

    python bench/ingest.py --docs 20000 --repeats 5
"""

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Replace, not prepend: sys.path[0] is bench/, whose tokenize.py would shadow the stdlib module.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from refinery.stages.ingest import read_input_shard  # noqa: E402
from refinery.config import ExtractConfig, SourceConfig  # noqa: E402
from refinery.documents import InputShard  # noqa: E402
from refinery.testing.crawl import write_corpus  # noqa: E402


def bare_warc(path: Path) -> int:
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    rows = []
    for record in ArchiveIterator(str(path), record_types=WarcRecordType.response, parse_http=True, fsspec_args=False):
        rows.append((record.headers.get("WARC-Target-URI"), record.reader.read().decode("utf-8", errors="replace")))
    return len(rows)


def bare_jsonl(path: Path) -> int:
    rows = []
    with gzip.open(path, "rb") as f:
        for line in f:
            obj = json.loads(line)
            rows.append((obj.get("url"), obj["text"]))
    return len(rows)


def ours(path: Path, fmt: str) -> int:
    source = SourceConfig(name="bench", path=str(path), format=fmt, bucket="web")
    out = read_input_shard(InputShard("bench-x", "bench", "web", str(path)), source, ExtractConfig())
    assert out.rejects.height == 0
    return out.documents.height


def timed(fn, *args) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn(*args)
    return time.perf_counter() - start, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        warc, jsonl = Path(tmp) / "bench.warc.gz", Path(tmp) / "bench.jsonl.gz"
        write_corpus(warc, args.docs, args.seed, fmt="warc")
        write_corpus(jsonl, args.docs, args.seed, fmt="jsonl")
        results = {}
        for name, path, bare, fmt in (("warc", warc, bare_warc, "warc"), ("jsonl", jsonl, bare_jsonl, "jsonl")):
            base_t, ours_t = [], []
            for _ in range(args.repeats):
                t, n_bare = timed(bare, path)
                base_t.append(t)
                t, n_ours = timed(ours, path, fmt)
                ours_t.append(t)
                assert n_bare == n_ours == args.docs, (n_bare, n_ours)
            b, o = statistics.median(base_t), statistics.median(ours_t)
            results[name] = {
                "docs": args.docs,
                "file_mb": round(path.stat().st_size / 1e6, 1),
                "bare_docs_per_s": round(args.docs / b),
                "ours_docs_per_s": round(args.docs / o),
                "ours_over_bare_time": round(o / b, 2),
            }
            print(f"{name}: bare {args.docs / b:,.0f} docs/s, ours {args.docs / o:,.0f} docs/s, ours/bare time {o / b:.2f}x")
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
