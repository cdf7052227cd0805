"""Throughput of `read_input_shard` (raw_documents) next to the bare library loop, in one process.

- WARC: a per-record-gzip WARC of HTML pages written by `synthetic.crawl.write_corpus`. Baseline:
  FastWARC's `ArchiveIterator` with HTTP parsing, reading each payload and decoding it as UTF-8
  into a list of (url, text) — the least any reader must do.
- JSONL: the same documents as gzip JSONL. Baseline: `gzip.open`, `json.loads` per line.

Ours does the same plus the checks (charset sniffing, binary and size limits, a second pass over
the gzip members to detect truncation) and builds the Polars table. Each timing is the median of
`--repeats` runs, alternating baseline and ours, in CPU seconds (`time.process_time`, every thread
of the process), so that a loaded machine slows both sides alike.

    python bench/ingest.py --docs 20000 --repeats 5

With `--warc-gb` (issue 26), also a large per-record-gzip WARC of each size given (GB decompressed,
a pool of `--pool` distinct crawl pages repeated to that size): raw_documents as the asset runs it
(`stream_input_shard` writing its tables batch by batch) next to FastWARC's bare iteration of the
same file (HTTP parsing, each payload read), each alone in a fresh process, alternating. Reported:
decompressed MB/s and peak RSS of each; peak RSS should not grow with the file.

    python bench/ingest.py --docs 0 --warc-gb 0.25 1 --repeats 2
"""

import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Replace, not prepend: sys.path[0] is bench/, whose tokenize.py would shadow the stdlib module.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from refinery.stages.ingest import read_input_shard  # noqa: E402
from refinery.config import ExtractConfig, SourceConfig  # noqa: E402
from refinery.documents import InputShard  # noqa: E402
from synthetic.crawl import write_corpus  # noqa: E402


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
    """CPU seconds of `fn(*args)` (every thread of this process), and its answer."""
    start = time.process_time()
    n = fn(*args)
    return time.process_time() - start, n


def write_big_warc(path: Path, pool: Path, gb: float) -> int:
    """Per-record gzip members of `pool` (a per-record gzip WARC) repeated until the decompressed
    size reaches `gb` GB; returns the decompressed size."""
    import zlib

    members, data = [], pool.read_bytes()
    while data:
        d = zlib.decompressobj(wbits=31)
        size = len(d.decompress(data))
        members.append((data[: len(data) - len(d.unused_data)], size))
        data = d.unused_data
    total, target = 0, int(gb * 1e9)
    with open(path, "wb") as f:
        while total < target:
            for member, size in members:
                f.write(member)
                total += size
                if total >= target:
                    break
    return total


def child_bare_warc(path: str) -> dict:
    """FastWARC's bare iteration: every record parsed with its HTTP headers, each payload read."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    records = 0
    for record in ArchiveIterator(path, record_types=WarcRecordType.response, parse_http=True, fsspec_args=False):
        record.reader.read()
        records += 1
    return {"records": records}


def child_ours_warc(path: str) -> dict:
    """raw_documents as the asset runs it: read batch by batch, each batch written as a row group."""
    from refinery.documents import REJECTS_SCHEMA
    from refinery.stages.ingest import RAW_SCHEMA, stream_input_shard
    from refinery.stages.parquet_batches import ParquetBatchWriter

    source = SourceConfig(name="bench", path=path, format="warc", bucket="web")
    out = Path(path).parent
    with ParquetBatchWriter(out / "documents.parquet", RAW_SCHEMA) as documents, \
         ParquetBatchWriter(out / "rejects.parquet", REJECTS_SCHEMA) as rejects:
        stats = stream_input_shard(InputShard("bench-x", "bench", "web", path), source, ExtractConfig(),
                                   documents.write, rejects.write)
    return {"records": stats.docs_in, "rejects": rejects.rows}


def in_fresh_process(kind: str, path: Path) -> dict:
    """One child run: its CPU time and peak RSS (the child's own `ru_maxrss`)."""
    done = subprocess.run([sys.executable, __file__, "--child", kind, str(path)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_child(kind: str, path: str) -> None:
    start = time.process_time()
    result = (child_bare_warc if kind == "bare" else child_ours_warc)(path)
    result["seconds"] = time.process_time() - start
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def big_warc(tmp: Path, sizes: list[float], pool_docs: int, repeats: int, seed: int) -> dict:
    pool = tmp / "pool.warc.gz"
    write_corpus(pool, pool_docs, seed, fmt="warc")
    results = {}
    for gb in sizes:
        path = tmp / f"big-{gb}.warc.gz"
        decompressed = write_big_warc(path, pool, gb)
        runs: dict[str, list[dict]] = {"bare": [], "ours": []}
        for _ in range(repeats):
            for kind in ("bare", "ours"):
                runs[kind].append(in_fresh_process(kind, path))
        assert runs["bare"][0]["records"] == runs["ours"][0]["records"], runs
        row = {"decompressed_mb": round(decompressed / 1e6), "file_mb": round(path.stat().st_size / 1e6),
               "records": runs["ours"][0]["records"]}
        for kind, rs in runs.items():
            seconds = statistics.median(r["seconds"] for r in rs)
            row[f"{kind}_mb_per_s"] = round(decompressed / 1e6 / seconds, 1)
            row[f"{kind}_peak_rss_mb"] = round(max(r["peak_rss_mb"] for r in rs))
        row["ours_over_bare_throughput"] = round(row["ours_mb_per_s"] / row["bare_mb_per_s"], 2)
        print(f"warc {gb} GB: bare {row['bare_mb_per_s']} MB/s, {row['bare_peak_rss_mb']} MB peak; ours "
              f"{row['ours_mb_per_s']} MB/s, {row['ours_peak_rss_mb']} MB peak; ours/bare {row['ours_over_bare_throughput']}x",
              flush=True)
        results[f"warc_{gb}gb"] = row
        path.unlink()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000, help="documents of the small-file comparison (0: skip it)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warc-gb", type=float, nargs="*", default=[], help="sizes of the large WARC comparison")
    ap.add_argument("--pool", type=int, default=1000, help="distinct pages the large WARCs repeat")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        results = big_warc(Path(tmp), args.warc_gb, args.pool, args.repeats, args.seed) if args.warc_gb else {}
        if not args.docs:
            print(json.dumps(results, indent=1))
            return
        warc, jsonl = Path(tmp) / "bench.warc.gz", Path(tmp) / "bench.jsonl.gz"
        write_corpus(warc, args.docs, args.seed, fmt="warc")
        write_corpus(jsonl, args.docs, args.seed, fmt="jsonl")
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
