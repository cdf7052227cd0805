"""A hand-made clean corpus (`pii_redacted` tables over empty input files) and the tokenizer views
the tokenize, shuffle, lineage and token-asset tests share."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from refinery import layout
from refinery.global_steps import shuffle as sh
from refinery.global_steps import tokenize as tk
from refinery.config import RefineryConfig, load_config
from refinery.documents import CLEAN_STAGE, PROVENANCE_SCHEMA, input_shards, make_doc_id
from refinery.layout import documents_key
from refinery.storage import LocalDataRoot

WORDS = (
    "the of and to in is was for on that with as by at from his her an were are which this be has had it not "
    "river mountain algebra theorem proof vector matrix kernel compiler function variable history empire café "
    "naïve résumé Zürich straße 東京 数学 😀 ≥ ∑ λ-calculus C++ x86_64 e-mail http://example.org"
).split()


@dataclass
class Corpus:
    cfg: RefineryConfig
    config_path: Path
    root: LocalDataRoot
    texts: dict[str, str]  # doc_id -> clean text (None/empty ones included)
    buckets: dict[str, str]  # doc_id -> bucket


def random_text(rng: random.Random, n_words: int) -> str:
    out = []
    for i in range(n_words):
        out.append(rng.choice(WORDS))
        if rng.random() < 0.08:
            out.append(rng.choice([".", ",", "!\n", "\n\n", ";"]))
    return " ".join(out)


def make_corpus(
    tmp_path: Path,
    docs_per_shard: dict[str, int] | None = None,
    seed: int = 7,
    empty_docs: int = 0,
    **overrides,
) -> Corpus:
    """Input files (empty: only their names matter) and hand-made `pii_redacted` tables for them."""
    docs_per_shard = docs_per_shard or {"web/a": 60, "web/b": 40, "math/m": 30}
    for name in docs_per_shard:
        path = tmp_path / "in" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    data = {
        "seed": seed,
        "data_root": "out",
        "buckets": ["web", "math", "code"],
        "sources": [
            {"name": "web", "path": "in/web/*.jsonl", "format": "jsonl", "bucket": "web"},
            {"name": "math", "path": "in/math/*.jsonl", "format": "jsonl", "bucket": "math", "skip": ["heuristic"]},
        ],
        "tokenizer": {"vocab_size": 400, "train_docs": 200},
        "shards": {"max_seq_len": 64, "overlap": 16, "shard_tokens": 1024, "shuffle_buffer_mb": 1, "encode_batch_docs": 16},
    }
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    config_path = tmp_path / "refinery.yaml"
    config_path.write_text(yaml.safe_dump(data))
    cfg = load_config(config_path)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    rng = random.Random(seed)
    texts, buckets = {}, {}
    for shard in input_shards(cfg):
        n = docs_per_shard[f"{shard.source}/{Path(shard.path).stem}"]
        rows = []
        for i in range(n):
            doc_id = make_doc_id(shard.key, i * 3)  # gaps, as after filtering
            long_doc = rng.random() < 0.25
            text = random_text(rng, rng.randint(60, 220) if long_doc else rng.randint(1, 30))
            if i < empty_docs:
                text = None if i % 2 else ""
            texts[doc_id], buckets[doc_id] = text, shard.bucket
            rows.append({
                "doc_id": doc_id, "url": f"https://{shard.source}.example/{i}", "source": shard.source,
                "bucket": shard.bucket, "file": shard.path, "record_index": i * 3, "record_offset": i * 1000,
                "fetch_time": "2026-01-01T00:00:00Z", "content_type": "text/plain", "text": text,
                "language": "en", "language_score": 0.9 + (i % 10) / 100, "dup_cluster": None,
                "dup_cluster_size": 1, "quality_score": rng.random(),
                "pii_counts": {"email": i % 3, "phone": 0},
            })
        schema = {**PROVENANCE_SCHEMA, "text": pl.String, "language": pl.String, "language_score": pl.Float64,
                  "dup_cluster": pl.String, "dup_cluster_size": pl.Int64, "quality_score": pl.Float64,
                  "pii_counts": pl.Struct({"email": pl.Int32, "phone": pl.Int32})}
        root.write_parquet(documents_key(CLEAN_STAGE, shard.key), pl.DataFrame(rows, schema=schema))
    return Corpus(cfg, config_path, root, texts, buckets)


def token_bytes(tokenizer) -> list[bytes]:
    """Each token id's bytes (byte-level BPE); special tokens map to b""."""
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    table = []
    for i in range(tokenizer.get_vocab_size()):
        piece = tokenizer.id_to_token(i)
        table.append(b"" if piece in special else bytes(_BYTE_DECODER[c] for c in piece))
    return table


def _byte_decoder() -> dict[str, int]:
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # The GPT-2 byte-to-unicode map: printable bytes map to themselves, the rest to 256+n in order.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping, n = {}, 0
    for b in range(256):
        if b in printable:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + n)] = b
            n += 1
    assert set(mapping) == set(alphabet)
    return mapping


_BYTE_DECODER = _byte_decoder()


def tokenize_all(c: Corpus) -> dict[str, tk.TokenizeResult]:
    """Every input file's clean documents tokenized (as `tokenized_shards` does), by file key."""
    tok = tk.build_tokenizer(c.root, c.cfg).tokenizer
    return {shard.key: tk.tokenize_file(c.root, c.cfg, shard, tok) for shard in input_shards(c.cfg)}


def bucket_parts(c: Corpus, bucket: str) -> list[str]:
    """The file keys of a bucket's token series, in input order (what its shuffle reads)."""
    return [shard.key for shard in tk.bucket_shards(c.cfg, bucket)]


def shuffle(c: Corpus, bucket: str, seed: int, shard_tokens: int, buffer_mb: int):
    """`shuffled_shards` for one bucket over its files' token series, as the asset calls it."""
    fields = tk.series_fields(c.cfg, tk.read_tokenizer(c.root, c.cfg.tokenizer.eod_token))
    return sh.shuffle_bucket(c.root, seed, bucket, bucket_parts(c, bucket), fields, shard_tokens, buffer_mb)


def series_indexes(c: Corpus, stage: str, bucket: str) -> list[dict]:
    """The index.json of a bucket's final shards, or of each of its files' tokenized series."""
    parts = bucket_parts(c, bucket) if stage == tk.TOKENIZED else [None]
    return [c.root.read_json(layout.shard_index_key(stage, bucket, part)) for part in parts]
