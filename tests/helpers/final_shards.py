"""Final shards in shuffled_shards' layout (shards/final/<bucket>/shard-NNNNN.* + entries.parquet +
index.json, written with ShardWriter) and the two-bucket curriculum config over them, shared by the
manifest, validate and CLI tests."""

from __future__ import annotations

import numpy as np
import polars as pl

from helpers.configs import write_config
from refinery.layout import final_index_key
from refinery.shard_format import SHARD_SUFFIXES, ShardWriter
from refinery.storage import LocalDataRoot
from training.heldout import shard_entry_docs

DOCS_PER_BUCKET = {"web": 40, "math": 20}


def document_entries(docs: list[tuple[str, int, float | None]]) -> list[tuple[str, int, int, int, float | None]]:
    """(doc_id, tokens, window, n_windows, quality_score) per entry of documents (doc_id, tokens,
    quality_score) in order; every fifth document is cut into two windows."""
    entries = []
    for position, (doc_id, n, score) in enumerate(docs):
        if position % 5 == 4:
            entries += [(doc_id, n // 2, 0, 2, score), (doc_id, n - n // 2, 1, 2, score)]
        else:
            entries.append((doc_id, n, 0, 1, score))
    return entries


def write_entry_table_and_index(root: LocalDataRoot, bucket: str, shards: list[dict], entries: list[tuple],
                                difficulty: dict[str, float | None] | None = None,
                                language: dict[str, str | None] | None = None) -> None:
    """The bucket's entries.parquet (tokens Int32, as shuffled_shards writes it) and index.json; with
    `difficulty` (doc_id -> score, None = unscored) the table carries the `difficulty` column too,
    with `language` (doc_id -> language) the `language` column."""
    rows = [{"entry": i, "doc_id": doc_id, "tokens": n, "window": window, "n_windows": n_windows, "quality_score": score,
             **({"difficulty": difficulty.get(doc_id)} if difficulty is not None else {}),
             **({"language": language.get(doc_id)} if language is not None else {})}
            for i, (doc_id, n, window, n_windows, score) in enumerate(entries)]
    table_key = f"shards/final/{bucket}/entries.parquet"
    schema = {"entry": pl.Int64, "doc_id": pl.String, "tokens": pl.Int32, "window": pl.Int32, "n_windows": pl.Int32,
              "quality_score": pl.Float64, **({"difficulty": pl.Float64} if difficulty is not None else {}),
              **({"language": pl.String} if language is not None else {})}
    table = pl.DataFrame(rows, schema=schema)
    digest = root.write_parquet(table_key, table)
    root.write_json(final_index_key(bucket), {"bucket": bucket, "shards": shards, "entries_table": {"key": table_key, "sha256": digest}})


def write_final_shards(root: LocalDataRoot, bucket: str, docs: list[tuple[str, int, float | None]], per_shard: int = 16,
                       difficulty: dict[str, float | None] | None = None) -> None:
    """Documents (doc_id, tokens, quality_score) in order, as real shards (see `document_entries`);
    `difficulty` as in `write_entry_table_and_index`."""
    rng = np.random.default_rng(len(docs))
    entries = document_entries(docs)
    shards = []
    for number, start in enumerate(range(0, len(entries), per_shard)):
        prefix = f"shards/final/{bucket}/shard-{number:05d}"
        writer = ShardWriter(root.root / prefix, np.uint16)
        for doc_id, n, window, n_windows, _ in entries[start : start + per_shard]:
            writer.add(rng.integers(0, 1000, n), doc_id, window=window, n_windows=n_windows)
        shards.append({"prefix": prefix, "tokens": writer.num_tokens, "entries": writer.num_entries, "sha256": writer.close()})
    write_entry_table_and_index(root, bucket, shards, entries, difficulty)


def write_final_index(root: LocalDataRoot, bucket: str, docs: list[tuple[str, int, float | None]], per_shard: int = 4,
                      difficulty: dict[str, float | None] | None = None) -> None:
    """The index.json and entries.parquet `write_final_shards` would write, without the shard files
    (their hashes are placeholders): enough for validation and manifests, which read only these, at
    token counts no test could write to disk."""
    entries = document_entries(docs)
    shards = []
    for number, start in enumerate(range(0, len(entries), per_shard)):
        chunk = entries[start : start + per_shard]
        shards.append({"prefix": f"shards/final/{bucket}/shard-{number:05d}", "tokens": sum(e[1] for e in chunk),
                       "entries": len(chunk), "sha256": {suffix: "0" * 64 for suffix in SHARD_SUFFIXES}})
    write_entry_table_and_index(root, bucket, shards, entries, difficulty)


def sample_docs(bucket: str, n: int) -> list[tuple[str, int, float | None]]:
    rng = np.random.default_rng(7 if bucket == "web" else 8)
    scores = rng.permutation(n) / n  # distinct, so the top fraction is exact
    docs = [(f"{bucket}-0/{i:07d}", int(rng.integers(40, 200)), float(scores[i])) for i in range(n)]
    docs[3] = (docs[3][0], docs[3][1], None)  # empty text: no score
    return docs


def sample_difficulty(docs: list[tuple[str, int, float | None]], unscored: tuple[int, ...] = (5,)) -> dict[str, float | None]:
    """A distinct difficulty per document (doc_id -> score), None for the documents at `unscored`."""
    rng = np.random.default_rng(len(docs) + 11)
    scores = 1.0 + 7.0 * rng.permutation(len(docs)) / len(docs)
    return {doc_id: None if i in unscored else float(scores[i]) for i, (doc_id, _, _) in enumerate(docs)}


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


def bucket_entry_docs(root, bucket) -> list[str]:
    """doc_id of every global entry of a manifest's bucket, in global entry order (a whole scan: tests
    only; the trainer reads a bounded sample, training/heldout.py)."""
    return [doc for ref in bucket.shards for doc in shard_entry_docs(root, ref)[0]]
