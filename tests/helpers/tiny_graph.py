"""A whole graph, training included, small enough to run several times in one test module: one
JSONL source of a few generated pages per file in two hash batches, no quality classifier, a 300-token vocabulary, two
phases of a few optimizer steps of a one-layer model. For tests of the state around runs (which
instance, which plan, which slot), not of what the stages compute."""

from __future__ import annotations

import json
from pathlib import Path

from synthetic.crawl import generate_corpus

from helpers.configs import write_config

DOCS_PER_FILE = 6
SEQ_LEN = 32
STEP_TOKENS = 2 * SEQ_LEN  # micro batch 2, one accumulation step


def write_pages(folder: Path, files: int, seed: int = 3) -> list[list[dict]]:
    """`files` JSONL files of generated pages in `folder`; returns their records, file by file."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = list(generate_corpus(files * DOCS_PER_FILE, seed=seed, words_per_doc=120, dup_fraction=0.0,
                                near_dup_fraction=0.0))
    out = []
    for i in range(files):
        records = [{"text": text, "url": url} for url, text in docs[i * DOCS_PER_FILE:(i + 1) * DOCS_PER_FILE]]
        write_records(folder / f"f{i}.jsonl", records)
        out.append(records)
    return out


def write_records(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def tiny_graph_config(folder: Path, inputs: Path, data_root: Path, name: str = "refinery.yaml",
                      steps: tuple[int, int] = (4, 4), warmup_steps: int = 1) -> Path:
    """The config of the tiny graph over `inputs/*.jsonl`, writing to `data_root`: two phases of
    `steps` optimizer steps."""
    return write_config(folder, {
        "seed": 1, "data_root": str(data_root), "buckets": ["web"],
        "sources": [{"name": "web", "path": str(inputs / "*.jsonl"), "format": "jsonl", "bucket": "web"}],
        "partitions": {"by": "hash", "count": 2},
        "stages": {"quality": {"enabled": False}, "language": {"min_score": 0.0}},
        "tokenizer": {"vocab_size": 300},
        "shards": {"max_seq_len": SEQ_LEN, "overlap": 4, "shard_tokens": 4096},
        "curriculum": {
            "total_tokens": sum(steps) * STEP_TOKENS,
            "allow_bucket_exhaustion": True,
            "buckets": {"web": {"max_epochs": 50}},
            "phases": [{"name": "warmup", "tokens": steps[0] * STEP_TOKENS, "seq_len": SEQ_LEN, "weights": {"web": 1.0}},
                       {"name": "main", "tokens": steps[1] * STEP_TOKENS, "seq_len": SEQ_LEN, "weights": {"web": 1.0}}],
        },
        "training": {"micro_batch_size": 2, "grad_accum_steps": 1, "checkpoint_interval": 2, "keep_last": 1,
                     "warmup_steps": warmup_steps, "model": {"n_layer": 1, "n_head": 2, "n_embd": 32}},
    }, name)
