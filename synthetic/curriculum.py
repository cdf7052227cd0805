"""A synthetic curriculum (final shards + phase manifests + config) written with the real shard and
manifest modules, so the trainer, its tests and bench/loader.py run without the funnel.

Documents are random token runs ending with EOD (token 0); documents longer than `window` are cut
with `split_windows`, so some entries carry an overlap prefix as real shards do.

When a phase has an `order`, each bucket also gets the entry table shuffled_shards writes
(entries.parquet) with a `difficulty` per document (seeded, apart from the token stream; every
`unscored_every`-th document without one), and the phase's manifest pins its bands through the real
`order_manifest`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from refinery.curriculum import BucketSlice, PhaseManifest, ShardRef, write_manifest
from refinery.curriculum.manifests import order_manifest
from refinery.shard_format import ShardWriter, split_windows
from refinery.storage import LocalDataRoot
from refinery.layout import bucket_entries_key, selection_key, shard_key

EOD = 0


@dataclass
class SyntheticBucket:
    docs: int
    mean_len: int
    max_epochs: float = 1.0
    shards: int = 1
    unscored_every: int = 0  # every n-th document has no difficulty score (0: every one has one)


@dataclass
class SyntheticPhase:
    name: str
    tokens: int
    weights: dict[str, float]
    seq_len: int
    lr_scale: float = 1.0
    interpolation: float = 0.0
    top_fraction: dict[str, float] = field(default_factory=dict)  # bucket -> kept fraction of its entries
    rope_scaling: str | dict[str, Any] | None = None  # the config's curriculum.phases[].rope_scaling
    order: dict[str, Any] | None = None  # the config's curriculum.phases[].order, e.g. {"by": "difficulty", ...}


def write_bucket(root: LocalDataRoot, name: str, spec: SyntheticBucket, rng: np.random.Generator, vocab: int,
                 window: int, overlap: int) -> tuple[list[ShardRef], list[tuple[int, int, int, int]]]:
    """The bucket's shards, and (document, tokens, window, windows) per entry in global entry order."""
    lengths = np.maximum(2, rng.geometric(1.0 / spec.mean_len, size=spec.docs))
    per_shard = -(-spec.docs // spec.shards)
    refs, entries = [], []
    for s in range(spec.shards):
        prefix = shard_key("final", name, s)
        writer = ShardWriter(root.root / prefix, np.uint16)
        for d in range(s * per_shard, min(spec.docs, (s + 1) * per_shard)):
            doc = rng.integers(1, vocab, size=int(lengths[d]), dtype=np.int64)
            doc[-1] = EOD
            cuts = split_windows(len(doc), window, overlap)
            for w, (a, b, ov) in enumerate(cuts):
                writer.add(doc[a:b], f"{name}-{d:06d}", overlap=ov, window=w, n_windows=len(cuts))
                entries.append((d, b - a, w, len(cuts)))
        hashes = writer.close()
        refs.append(ShardRef(prefix, writer.num_tokens, writer.num_entries, hashes))
    return refs, entries


def document_difficulty(name: str, spec: SyntheticBucket, seed: int) -> np.ndarray:
    """A difficulty per document (float64, NaN = no score), from its own seeded stream."""
    rng = np.random.default_rng([seed, sum(name.encode())])
    scores = rng.uniform(1.0, 8.0, size=spec.docs)
    if spec.unscored_every:
        scores[spec.unscored_every - 1::spec.unscored_every] = np.nan
    return scores


def write_entry_table(root: LocalDataRoot, name: str, entries: list[tuple[int, int, int, int]],
                      difficulty: np.ndarray) -> None:
    """The bucket's entries.parquet as shuffled_shards writes it, with the `difficulty` column."""
    import polars as pl

    docs = np.array([e[0] for e in entries], dtype=np.int64)
    scores = difficulty[docs]
    table = pl.DataFrame({
        "entry": np.arange(len(entries), dtype=np.int64),
        "doc_id": [f"{name}-{d:06d}" for d in docs.tolist()],
        "tokens": pl.Series([e[1] for e in entries], dtype=pl.Int32),
        "window": pl.Series([e[2] for e in entries], dtype=pl.Int32),
        "n_windows": pl.Series([e[3] for e in entries], dtype=pl.Int32),
        "quality_score": pl.Series([None] * len(entries), dtype=pl.Float64),
        "difficulty": pl.Series([None if np.isnan(x) else float(x) for x in scores.tolist()], dtype=pl.Float64),
        "language": pl.Series([None] * len(entries), dtype=pl.String),
    })
    root.write_parquet(bucket_entries_key("final", name), table)


def write_synthetic_curriculum(
    root_dir: str | Path,
    buckets: dict[str, SyntheticBucket],
    phases: list[SyntheticPhase],
    vocab: int = 512,
    window: int = 256,
    overlap: int = 16,
    seed: int = 0,
) -> list[PhaseManifest]:
    root = LocalDataRoot(root_dir)
    rng = np.random.default_rng(seed)
    written = {name: write_bucket(root, name, spec, rng, vocab, window, overlap) for name, spec in sorted(buckets.items())}
    refs = {name: r for name, (r, _) in written.items()}
    if any(ph.order for ph in phases):
        for name, (_, entries) in written.items():
            write_entry_table(root, name, entries, document_difficulty(name, buckets[name], seed))
    manifests = []
    for i, ph in enumerate(phases):
        slices = {}
        for name, spec in sorted(buckets.items()):
            total = sum(r.entries for r in refs[name])
            all_tokens = sum(r.tokens for r in refs[name])
            selection = sha = None
            entries, tokens = total, all_tokens
            if name in ph.top_fraction:
                keep = np.sort(rng.permutation(total)[: max(1, int(total * ph.top_fraction[name]))]).astype(np.int64)
                selection = selection_key(ph.name, name)
                with root.writer(selection) as tmp:
                    with open(tmp, "wb") as f:
                        np.save(f, keep)
                sha = root.sha256(selection)
                lengths = np.concatenate([np.diff(_offsets(root, r)) for r in refs[name]])
                entries, tokens = len(keep), int(lengths[keep].sum())
            slices[name] = BucketSlice(name, refs[name], tokens, entries, spec.max_epochs, selection, sha)
        manifest = PhaseManifest(
            phase=ph.name, index=i, token_budget=ph.tokens, seq_len=ph.seq_len, lr_scale=ph.lr_scale,
            weights=dict(ph.weights), interpolation=ph.interpolation, buckets=slices, rope_scaling=ph.rope_scaling,
            validation={"ok": True, "errors": [], "warnings": []},
        )
        if ph.order:
            manifest = order_manifest(root, manifest, ph.order)
        write_manifest(root, manifest)
        manifests.append(manifest)
    return manifests


def _offsets(root: LocalDataRoot, ref: ShardRef) -> np.ndarray:
    from refinery.shard_format import read_index

    return read_index(root.root / (ref.prefix + ".idx")).offsets


def synthetic_config(
    path: str | Path,
    data_root: str | Path,
    buckets: dict[str, SyntheticBucket],
    phases: list[SyntheticPhase],
    training: dict[str, Any] | None = None,
    allow_bucket_exhaustion: bool = False,
    seed: int = 0,
    shards: dict[str, Any] | None = None,
) -> Path:
    """Write a config YAML whose curriculum names the synthetic phases; returns its path. Its one
    source is an empty file beside it (the shards are written directly, no document goes through
    the funnel) and it trains no quality classifier, so the config passes the preflight. `shards`
    is the config's shards section: a phase longer than 2,048 tokens needs its max_seq_len."""
    path = Path(path)
    source = path.parent / "synthetic-input" / "empty.jsonl"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.touch()
    cfg = {
        "seed": seed,
        "data_root": str(data_root),
        "buckets": sorted(buckets),
        "sources": [{"name": "synthetic", "path": str(source), "format": "jsonl", "bucket": sorted(buckets)[0]}],
        "stages": {"quality": {"enabled": False}},
        "tokenizer": {"vocab_size": 512},
        **({"shards": shards} if shards else {}),
        "curriculum": {
            "total_tokens": sum(p.tokens for p in phases),
            "allow_bucket_exhaustion": allow_bucket_exhaustion,
            "buckets": {name: {"max_epochs": b.max_epochs} for name, b in sorted(buckets.items())},
            "phases": [
                {"name": p.name, "tokens": p.tokens, "weights": p.weights, "seq_len": p.seq_len,
                 "lr_scale": p.lr_scale, "interpolation": p.interpolation,
                 **({"rope_scaling": p.rope_scaling} if p.rope_scaling is not None else {}),
                 **({"order": p.order} if p.order is not None else {})}
                for p in phases
            ],
        },
        "training": training or {},
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


TINY_BUCKETS = {"web": SyntheticBucket(docs=240, mean_len=60), "math": SyntheticBucket(docs=40, mean_len=40, max_epochs=4)}
TINY_PHASES = [
    SyntheticPhase("warmup", 2048, {"web": 0.8, "math": 0.2}, seq_len=32),
    SyntheticPhase("main", 3072, {"web": 0.6, "math": 0.4}, seq_len=32, interpolation=0.05),
    SyntheticPhase("anneal", 2048, {"web": 0.5, "math": 0.5}, seq_len=64, lr_scale=0.5, interpolation=0.05,
                   top_fraction={"web": 0.4}),
]
TINY_TRAINING = {
    "micro_batch_size": 2, "grad_accum_steps": 2, "checkpoint_interval": 4, "keep_last": 2, "warmup_steps": 3,
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 32},
}


def tiny_run(tmp: str | Path, training: dict[str, Any] | None = None, phases: list[SyntheticPhase] | None = None,
             buckets: dict[str, SyntheticBucket] | None = None, allow_bucket_exhaustion: bool = False) -> Path:
    """A three-phase synthetic curriculum (seq_len 32 -> 64, a quality selection in the last phase)
    and its config under `tmp`, sized to train in seconds on a CPU; returns the config path."""
    tmp = Path(tmp)
    buckets = buckets or TINY_BUCKETS
    phases = phases or TINY_PHASES
    write_synthetic_curriculum(tmp / "root", buckets, phases, vocab=512, window=48, overlap=8)
    return synthetic_config(tmp / "run.yaml", tmp / "root", buckets, phases, {**TINY_TRAINING, **(training or {})},
                            allow_bucket_exhaustion=allow_bucket_exhaustion)
