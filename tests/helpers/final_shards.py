"""Final shards in shuffled_shards' layout (shards/final/<bucket>/shard-NNNNN.* + entries.parquet +
index.json, written with ShardWriter) and the two-bucket curriculum config over them, shared by the
manifest, validate and CLI tests."""

from __future__ import annotations

import numpy as np
import polars as pl

from helpers.configs import write_config
from refinery.layout import final_index_key
from refinery.shard_format import ShardWriter
from refinery.storage import LocalDataRoot

DOCS_PER_BUCKET = {"web": 40, "math": 20}


def write_final_shards(root: LocalDataRoot, bucket: str, docs: list[tuple[str, int, float | None]], per_shard: int = 16) -> None:
    """Documents (doc_id, tokens, quality_score) in order; every fifth is cut into two windows."""
    rng = np.random.default_rng(len(docs))
    entries = []
    for doc_id, n, score in docs:
        if docs.index((doc_id, n, score)) % 5 == 4:
            entries += [(doc_id, n // 2, 0, 2, score), (doc_id, n - n // 2, 1, 2, score)]
        else:
            entries.append((doc_id, n, 0, 1, score))
    shards, rows = [], []
    for number, start in enumerate(range(0, len(entries), per_shard)):
        prefix = f"shards/final/{bucket}/shard-{number:05d}"
        writer = ShardWriter(root.root / prefix, np.uint16)
        for doc_id, n, window, n_windows, score in entries[start : start + per_shard]:
            rows.append({"entry": len(rows), "doc_id": doc_id, "tokens": n, "quality_score": score})
            writer.add(rng.integers(0, 1000, n), doc_id, window=window, n_windows=n_windows)
        shards.append({"prefix": prefix, "tokens": writer.num_tokens, "entries": writer.num_entries, "sha256": writer.close()})
    table_key = f"shards/final/{bucket}/entries.parquet"
    table = pl.DataFrame(rows, schema={"entry": pl.Int64, "doc_id": pl.String, "tokens": pl.Int32, "quality_score": pl.Float64})
    digest = root.write_parquet(table_key, table)
    root.write_json(final_index_key(bucket), {"bucket": bucket, "shards": shards, "entries_table": {"key": table_key, "sha256": digest}})


def sample_docs(bucket: str, n: int) -> list[tuple[str, int, float | None]]:
    rng = np.random.default_rng(7 if bucket == "web" else 8)
    scores = rng.permutation(n) / n  # distinct, so the top fraction is exact
    docs = [(f"{bucket}-0/{i:07d}", int(rng.integers(40, 200)), float(scores[i])) for i in range(n)]
    docs[3] = (docs[3][0], docs[3][1], None)  # empty text: no score
    return docs


def config_dict(tmp_path, **curriculum):
    cur = {
        "total_tokens": 4096,
        "buckets": {"math": {"max_epochs": 3}},
        "phases": [
            {"name": "main", "share": 0.75, "weights": {"web": 0.75, "math": 0.25}, "seq_len": 128},
            {"name": "anneal", "share": 0.25, "weights": {"web": 0.5, "math": 0.5}, "seq_len": 256,
             "interpolation": 0.05, "quality_top_fraction": 0.25},
        ],
    }
    cur.update(curriculum)
    return {
        "data_root": str(tmp_path / "root"),
        "buckets": ["web", "math"],
        "sources": [{"name": b, "path": f"{b}/*.jsonl", "format": "jsonl", "bucket": b} for b in ("web", "math")],
        "shards": {"max_seq_len": 256, "overlap": 0},
        "training": {"micro_batch_size": 1},
        "curriculum": cur,
    }


def write_curriculum_config(tmp_path, **curriculum) -> str:
    """`config_dict` as tmp_path/refinery.yaml; returns the path."""
    return str(write_config(tmp_path, config_dict(tmp_path, **curriculum)))
