"""Peak memory and wall time of exact + near dedup on 1M synthetic documents, run partitioned.

    python -m bench.dedup_memory --docs 1000000 --shards 16 --workdir /tmp/dedup-1m

Generates `--docs` short documents (60 words from a 50k vocabulary) over `--shards` input shards,
with 5% exact copies (case and spacing changed) and 5% near copies (one word replaced, shingle
Jaccard about 0.84) of random earlier documents, written as `heuristic_filtered` tables. Then runs
every dedup step the way the Dagster graph partitions it, each partition in its own process
(dedup_signatures per shard, exact_deduped per hash range, near_deduped per band,
near_dup_clusters once, deduped per shard), and reports per step the largest peak RSS of any of its
partitions (from wait4) and the summed wall time. `import` is the RSS of a process that only imports
the dedup module (dagster, polars, numpy): the floor under every step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
WORDS_PER_DOC = 60
VOCAB = 50_000


def _mix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(33))
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x


def word_ids(doc_ids: np.ndarray) -> np.ndarray:
    """(len(doc_ids), WORDS_PER_DOC) vocabulary indices, a pure function of the document number."""
    grid = doc_ids[:, None].astype(np.uint64) * np.uint64(1_000_003) + np.arange(WORDS_PER_DOC, dtype=np.uint64)
    return (_mix(grid) % np.uint64(VOCAB)).astype(np.int64)


def shard_texts(first: int, count: int) -> list[str]:
    vocab = np.array([f"w{i}" for i in range(VOCAB)], dtype=object)
    g = np.arange(first, first + count, dtype=np.uint64)
    kind = g % np.uint64(20)
    source = np.where((kind <= 1) & (g > 0), _mix(g + np.uint64(7)) % np.maximum(g, np.uint64(1)), g)
    words = vocab[word_ids(source)]
    texts = []
    for i, row in enumerate(words):
        if kind[i] == 0 and g[i] > 0:
            texts.append("  " + " ".join(row).upper() + " \n")
        elif kind[i] == 1 and g[i] > 0:
            row = row.copy()
            row[-3] = f"edit{int(g[i])}"
            texts.append(" ".join(row))
        else:
            texts.append(" ".join(row))
    return texts


def generate(workdir: Path, docs: int, shards: int) -> Path:
    import polars as pl
    import yaml

    from refinery.config import load_config
    from refinery.documents import PROVENANCE_SCHEMA, documents_key, input_shards, make_doc_id
    from refinery.storage import LocalDataRoot

    (workdir / "in").mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        (workdir / "in" / f"part-{s:03d}.jsonl").write_text("")
    config = workdir / "refinery.yaml"
    config.write_text(yaml.safe_dump({
        "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "in/*.jsonl", "format": "jsonl", "bucket": "web"}],
    }))
    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    per = -(-docs // shards)
    for s, shard in enumerate(input_shards(cfg)):
        first, count = s * per, max(0, min(per, docs - s * per))
        texts = shard_texts(first, count)
        n = len(texts)
        table = pl.DataFrame(
            {"doc_id": [make_doc_id(shard.key, i) for i in range(n)], "url": [f"https://x.example/{first + i}" for i in range(n)],
             "source": ["web"] * n, "bucket": ["web"] * n, "file": [shard.path] * n, "record_index": list(range(n)),
             "record_offset": list(range(n)), "fetch_time": [None] * n, "content_type": ["text/plain"] * n, "text": texts},
            schema={**PROVENANCE_SCHEMA, "text": pl.String},
        )
        root.write_parquet(documents_key("heuristic_filtered", shard.key), table)
    return config


def run_step(config: str, step: str, key: str) -> None:
    """One partition of one step, in this process (the child side of `measure`)."""
    from assets import dedup
    from refinery.config import load_config
    from refinery.storage import LocalDataRoot

    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    if step == "import":
        return
    if step == "dedup_signatures":
        dedup.compute_signatures(cfg, root, key)
    elif step == "exact_deduped":
        dedup.compute_exact_range(cfg, root, key)
    elif step == "near_deduped":
        dedup.compute_band_edges(cfg, root, key)
    elif step == "near_dup_clusters":
        dedup.compute_clusters(cfg, root)
    elif step == "deduped":
        dedup.apply_to_shard(cfg, root, key)
    else:
        raise ValueError(f"unknown step {step!r}")


def measure(config: Path, step: str, key: str) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one partition run in a fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bench.dedup_memory", "--child", str(config), step, key], cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"{step}[{key}] failed with status {status}")
    return time.perf_counter() - start, usage.ru_maxrss * 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--workdir", default="/tmp/dedup-1m")
    p.add_argument("--child", nargs=3, metavar=("CONFIG", "STEP", "KEY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    if args.child:
        run_step(*args.child)
        return 0

    from assets.stages import exact_dedup as ex
    from assets.stages import near_dedup as nd
    from refinery.config import load_config
    from refinery.documents import input_shards

    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    start = time.perf_counter()
    config = generate(workdir, args.docs, args.shards)
    print(f"generated {args.docs:,} documents in {args.shards} shards in {time.perf_counter() - start:.0f}s", flush=True)
    cfg = load_config(config)
    settings = nd.DedupSettings.from_config(cfg)
    shards = [s.key for s in input_shards(cfg)]
    plan = [
        ("import", ["-"]),
        ("dedup_signatures", shards),
        ("exact_deduped", ex.range_keys(settings.hash_ranges)),
        ("near_deduped", nd.band_keys(settings.bands)),
        ("near_dup_clusters", ["-"]),
        ("deduped", shards),
    ]
    results = {}
    for step, keys in plan:
        runs = [measure(config, step, k) for k in keys]
        results[step] = {"partitions": len(keys), "wall_s": sum(w for w, _ in runs), "peak_rss_mib": max(r for _, r in runs) / 2**20}
        print(f"{step}: {len(keys)} partition(s), {results[step]['wall_s']:.1f}s, peak RSS {results[step]['peak_rss_mib']:.0f} MiB", flush=True)

    import polars as pl

    out = workdir / "out"
    kept = sum(pl.scan_parquet(str(f)).select(pl.len()).collect().item() for f in (out / "documents/deduped").glob("*.parquet"))
    stats = [json.loads(f.read_text()) for f in (out / "stats").rglob("*.json")]
    dropped: dict[str, int] = {}
    for s in stats:
        for rule, n in s["dropped"].items():
            dropped[rule] = dropped.get(rule, 0) + n
    sig_bytes = sum(f.stat().st_size for f in (out / "dedup/signatures").glob("*.parquet"))
    summary = {
        "docs": args.docs,
        "kept": kept,
        "dropped": dropped,
        "signature_bytes_per_doc_on_disk": round(sig_bytes / args.docs, 1),
        "edges_bytes": sum(f.stat().st_size for f in (out / "dedup/near/edges").glob("*.parquet")),
        "total_wall_s": round(sum(r["wall_s"] for k, r in results.items() if k != "import"), 1),
        "max_peak_rss_mib": round(max(r["peak_rss_mib"] for r in results.values()), 1),
        "steps": {k: {kk: round(v, 1) if isinstance(v, float) else v for kk, v in r.items()} for k, r in results.items()},
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
