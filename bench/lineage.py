"""Lineage query latency on a generated corpus of at least 100M tokens.

    python bench/lineage.py [--tokens 100000000] [--queries 2000]

Generates final shards of random tokens (entries of 20-1,000 tokens, 4M-token shards, one entry
per document) with `ShardSeries`, and a lineage documents table for them, then times
`resolve_token` on random (shard, offset) positions. Every query starts cold in-process: a new
`LineageIndex` each time, so index.json, the shard's .idx (hash-checked), its sidecar and one row
group of the documents table are read again (the OS page cache is warm). Baseline in the same run:
the same lookup by a full scan of the documents table per query. Prints p50/p99 in ms.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import yaml  # noqa: E402

from refinery import layout  # noqa: E402
from refinery.stages import tokenize as tk  # noqa: E402
from refinery import lineage as lin  # noqa: E402
from refinery.config import load_config  # noqa: E402
from refinery.documents import PROVENANCE_SCHEMA  # noqa: E402
from refinery.storage import LocalDataRoot  # noqa: E402

SHARD_TOKENS = 4_000_000


def generate(folder: Path, tokens: int, seed: int = 0):
    (folder / "in").mkdir(parents=True)
    data = {"data_root": "out", "buckets": ["web"],
            "sources": [{"name": "web", "path": "in/*.jsonl", "format": "jsonl", "bucket": "web"}]}
    (folder / "refinery.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(folder / "refinery.yaml")
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    rng = np.random.default_rng(seed)
    doc_ids: list[str] = []
    with tk.ShardSeries(root, tk.FINAL, "web", np.dtype(np.uint16), SHARD_TOKENS) as series:
        written = 0
        while written < tokens:
            lengths = rng.integers(20, 1000, size=10_000)
            block = rng.integers(0, 65_000, size=int(lengths.sum()), dtype=np.uint16)
            start = 0
            for n in lengths:
                doc_id = f"web-cc{len(doc_ids) // 50_000:03d}/{len(doc_ids) % 50_000:07d}"
                doc_ids.append(doc_id)
                series.add(block[start : start + n], doc_id, 0, 0, 1, 0.5)
                start += n
            written += int(lengths.sum())
        index = series.finish()
    n = len(doc_ids)
    docs = pl.DataFrame({
        "doc_id": doc_ids, "url": [f"https://site{i % 997}.example/page/{i}" for i in range(n)],
        "source": ["web"] * n, "bucket": ["web"] * n, "file": [f"in/cc{i // 50_000:03d}.warc.gz" for i in range(n)],
        "record_index": list(range(n)), "record_offset": [i * 7919 for i in range(n)],
        "fetch_time": ["2026-01-01T00:00:00Z"] * n, "content_type": ["text/html"] * n,
    }, schema=PROVENANCE_SCHEMA).with_columns(
        language=pl.lit("en"), language_score=pl.lit(0.93), dup_cluster=pl.lit(None, pl.String),
        dup_cluster_size=pl.lit(1, pl.Int64), quality_score=pl.lit(0.5), text_bytes=pl.lit(4000, pl.Int64),
        pii_counts=pl.lit({"email": 0, "phone": 1}),
    )
    lin.write_lineage_index(root, docs, ["web"], {"final_shards_verified": 0})
    return cfg, root, index


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100_000_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--baseline-queries", type=int, default=20)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="refinery-bench-lineage-"))
    try:
        t0 = time.perf_counter()
        cfg, root, index = generate(folder, args.tokens)
        print(f"generated {index['tokens']:,} tokens, {index['entries']:,} entries/documents in "
              f"{len(index['shards'])} shards in {time.perf_counter() - t0:.0f}s")
        rng = random.Random(1)
        refs = index["shards"]
        positions = []
        for _ in range(args.queries):
            ref = rng.choice(refs)
            positions.append((ref["prefix"].removeprefix("shards/final/"), rng.randrange(ref["tokens"])))
        lin.resolve_token(root, cfg, *positions[0])  # warm the page cache and imports once
        times = []
        for shard, offset in positions:
            t = time.perf_counter()
            r = lin.resolve_token(root, cfg, shard, offset)
            times.append((time.perf_counter() - t) * 1000)
            assert r["entry_start"] <= offset < r["entry_end"]
        scan_times = []
        docs_path = root.local_path(layout.LINEAGE_DOCUMENTS_KEY)
        for shard, offset in positions[: args.baseline_queries]:
            t = time.perf_counter()
            doc_id = lin.resolve_token(root, cfg, shard, offset)["doc_id"]
            row = pl.read_ipc(docs_path).filter(pl.col("doc_id") == doc_id)
            scan_times.append((time.perf_counter() - t) * 1000)
            assert row.height == 1
        p50, p99 = percentile(times, 50), percentile(times, 99)
        print(f"resolve_token, {len(times)} queries: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(times):.2f} ms")
        b50, b99 = percentile(scan_times, 50), percentile(scan_times, 99)
        print(f"baseline (full scan of the documents table per query), {len(scan_times)} queries: "
              f"p50 {b50:.2f} ms, p99 {b99:.2f} ms; ratio of p50s {b50 / p50:.1f}x; load average {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
