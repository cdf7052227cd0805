"""A proxy run's inputs without the funnel: a variant's data root of synthetic token shards in one
phase (synthetic/curriculum.py) with a small BPE tokenizer beside them, and evaluation
documents in two domains and two languages. For the proxy-run and report tests; the variants' own
selection is tested with the real graph."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from refinery.config import load_config
from refinery.layout import TOKENIZER_KEY
from refinery.global_steps.tokenize import train_tokenizer
from refinery.storage import LocalDataRoot
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, synthetic_config, write_synthetic_curriculum

EVAL_TEXTS = [
    ("docs", "en", "The pipeline reads every shard once and writes its tokens in order. " * 3),
    ("docs", "de", "Die Pipeline liest jede Datei einmal und schreibt ihre Tokens der Reihe nach. " * 2),
    ("web", "en", "Buy now! Cheap offers on every page, click here for more offers today."),
    ("web", "de", "Jetzt kaufen! Günstige Angebote auf jeder Seite, hier klicken."),
    ("web", "en", ""),  # no text: nothing to score
    ("docs", None, "A document whose source skips language ID. " * 12),
]


def eval_frame() -> pl.DataFrame:
    return pl.DataFrame({"doc_id": [f"eval-{i}" for i in range(len(EVAL_TEXTS))],
                         "text": [t for _, _, t in EVAL_TEXTS], "domain": [d for d, _, _ in EVAL_TEXTS],
                         "language": [lang for _, lang, _ in EVAL_TEXTS]}, schema_overrides={"language": pl.String})


def tiny_variant(folder: Path, seed: int = 0, steps: int = 8):
    """The config of one proxy run over a synthetic one-phase data root in `folder` (`steps`
    optimizer steps of 2 x 32 tokens, checkpoints every 3 steps), its tokenizer written there."""
    root = folder / "root"
    buckets = {"web": SyntheticBucket(docs=120, mean_len=50)}
    phases = [SyntheticPhase("ablation", steps * 64, {"web": 1.0}, seq_len=32)]
    write_synthetic_curriculum(root, buckets, phases, vocab=512, window=32, overlap=0, seed=5)
    tokenizer = train_tokenizer([t for _, _, t in EVAL_TEXTS] * 4, 300, "<|endoftext|>")
    LocalDataRoot(root).write_bytes(TOKENIZER_KEY, tokenizer.to_str().encode())
    path = synthetic_config(folder / "variant.yaml", root, buckets, phases, seed=seed, shards={"max_seq_len": 32, "overlap": 0},
                            training={"micro_batch_size": 2, "grad_accum_steps": 1, "checkpoint_interval": 3,
                                      "keep_last": 1, "warmup_steps": 2, "run_dir": f"runs/seed-{seed}",
                                      "model": {"n_layer": 1, "n_head": 2, "n_embd": 32}})
    return load_config(path)
