"""Peak memory and wall time of exact + near dedup on synthetic documents, run partitioned.

    python -m bench.dedup_memory --docs 1000000 --shards 16 --workdir /tmp/dedup-1m
    python -m bench.dedup_memory --synthetic-signatures --docs 1000000 --shards 16 --max-memory-mb 32 --workdir /tmp/dedup-1m
    python -m bench.dedup_memory --synthetic-signatures --docs 10000000 --shards 160 --max-memory-mb 32 --workdir /tmp/dedup-10m

Keep the documents per shard the same across sizes (62,500 above): a shard is one input file, and
a step's read buffers grow with one file, so a larger corpus is more files, not larger ones.

Generates `--docs` short documents (60 words from a 50k vocabulary) over `--shards` input shards,
with 5% exact copies (case and spacing changed) and 5% near copies (one word replaced, shingle
Jaccard about 0.84) of random earlier documents, written as `heuristic_filtered` tables. Then runs
every dedup step the way the Dagster graph partitions it, each partition in its own process
(dedup_signatures per shard, exact_deduped per hash range, near_deduped per band,
near_dup_clusters once, deduped per shard), and reports per step the largest peak RSS of any of its
partitions and the summed wall time (and a band's splits K). A partition's peak is its own
process's VmHWM, read from /proc/self/status by the child as it ends and printed with the step's
counts as one JSON line (wait4's ru_maxrss would report the driver's peak, which a forked child
keeps across exec). `import` is the peak of a process that only imports the dedup steps
(polars, numpy; no Dagster): the floor under every step.

`--synthetic-signatures` skips the text: it writes the `dedup_signatures` files directly (numpy,
vectorised; 16 permutations, 8 bands x 2 rows, 8-value bottom sketches) with 1% exact copies, 1% near
copies (one band differs, same sketch: an edge in the other 7 bands) and 1% false candidates (one
band differs, a sketch of their own: rejected by verification), and runs only the global steps
(exact_deduped, near_deduped, near_dup_clusters), whose state grows with the corpus; the per-shard
steps hold one shard. `--hash-ranges` defaults to one range per 250k documents (at least 4), and
`--max-memory-mb` or `--band-splits` set the near-dedup bound (docs/dedup.md).
"""

from __future__ import annotations

import argparse
import json
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


def write_config(workdir: Path, shards: int, stages: dict) -> Path:
    import yaml

    (workdir / "in").mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        (workdir / "in" / f"part-{s:03d}.jsonl").write_text("")
    config = workdir / "refinery.yaml"
    config.write_text(yaml.safe_dump({
        "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "in/*.jsonl", "format": "jsonl", "bucket": "web"}],
        "stages": stages,
    }))
    return config


def generate(workdir: Path, docs: int, shards: int, stages: dict) -> Path:
    import polars as pl

    from refinery.config import load_config
    from refinery.documents import PROVENANCE_SCHEMA, input_shards, make_doc_id
    from refinery.stages.attributes import write_stage_documents
    from refinery.storage import LocalDataRoot

    config = write_config(workdir, shards, stages)
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
        write_stage_documents(root, "heuristic_filtered", shard.key, table)
    return config


SYNTH_PERM, SYNTH_BANDS, SYNTH_ROWS, SYNTH_BOTTOM = 16, 8, 2, 8


def synthetic_sources(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per global document number: its kind (0 exact copy, 1 near copy, 2 false candidate, else
    original) and the earlier document it copies (itself for originals)."""
    kind = np.where(g > 0, g % np.uint64(100), np.uint64(99))
    source = np.where(kind <= 2, _mix(g + np.uint64(7)) % np.maximum(g, np.uint64(1)), g)
    return kind, source


def _values(ids: np.ndarray, salt: int, width: int) -> np.ndarray:
    grid = ids[:, None] * np.uint64(1_000_003) + np.uint64(salt) + np.arange(width, dtype=np.uint64)
    return (_mix(grid) >> np.uint64(32)).astype(np.uint32)


def write_synthetic_signatures(workdir: Path, docs: int, shards: int, stages: dict) -> Path:
    """`dedup_signatures` files of `docs` documents, without text (see the module docstring)."""
    import polars as pl

    from refinery import layout
    from refinery.global_steps import exact_dedup as ex
    from refinery.global_steps import near_dedup as nd
    from refinery.config import load_config
    from refinery.documents import input_shards
    from refinery.storage import LocalDataRoot

    stages["near_dedup"].update(num_perm=SYNTH_PERM, bands=SYNTH_BANDS, rows=SYNTH_ROWS)
    config = write_config(workdir, shards, stages)
    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    per = -(-docs // shards)
    for ordinal, shard in enumerate(input_shards(cfg)):
        n = max(0, min(per, docs - ordinal * per))
        g = np.arange(ordinal * per, ordinal * per + n, dtype=np.uint64)
        kind, source = synthetic_sources(g)
        sigs = _values(source, 0, SYNTH_PERM)
        # Near copies and false candidates differ from their source in the first band only.
        sigs[kind == 1, 0] ^= np.uint32(1)
        sigs[kind == 2, 0] ^= np.uint32(2)
        bottom = np.sort(_values(np.where(kind <= 1, source, g), 1 << 40, SYNTH_BOTTOM), axis=1)
        hashed = np.where(kind == 0, source, g)
        bands = nd.band_hashes(sigs, SYNTH_BANDS, SYNTH_ROWS)
        columns = {
            "doc_key": pl.Series(ex.doc_keys(ordinal, n), dtype=pl.UInt64),
            "doc_id": pl.select(pl.format("{}/{}", pl.lit(shard.key), pl.int_range(n).cast(pl.String).str.zfill(7))).to_series(),
            "hash_hi": pl.Series(_mix(hashed * np.uint64(2) + np.uint64(1)), dtype=pl.UInt64),
            "hash_lo": pl.Series(_mix(hashed * np.uint64(2) + np.uint64(2)), dtype=pl.UInt64),
            "near": pl.Series(np.ones(n, dtype=bool)),
        }
        for band in range(SYNTH_BANDS):
            columns[nd.band_column(band)] = pl.Series(bands[:, band], dtype=pl.UInt64)
        root.write_parquet(layout.signatures_key(shard.key), pl.DataFrame(columns))
        root.write_parquet(layout.sketches_key(shard.key), pl.DataFrame({
            "doc_key": columns["doc_key"],
            "bottom": pl.Series(bottom, dtype=pl.Array(pl.UInt32, SYNTH_BOTTOM)).cast(pl.List(pl.UInt32))}))
    return config


def run_step(config: str, step: str, key: str) -> dict[str, int]:
    """One partition of one step, in this process (the child side of `measure`); returns the
    step's counts where it has them (a band's splits and the documents its largest split held)."""
    from refinery.global_steps import dedup_compute as dedup
    from refinery.config import load_config
    from refinery.storage import LocalDataRoot

    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    if step == "import":
        return {}
    if step == "dedup_signatures":
        dedup.compute_signatures(cfg, root, key)
    elif step == "exact_deduped":
        dedup.compute_exact_range(cfg, root, key)
    elif step == "near_deduped":
        _, counts, _ = dedup.compute_band_edges(cfg, root, key)
        return counts
    elif step == "near_dup_clusters":
        dedup.compute_clusters(cfg, root)
    elif step == "deduped":
        dedup.apply_to_shard(cfg, root, key)
    else:
        raise ValueError(f"unknown step {step!r}")
    return {}


RESULT_PREFIX = "child-result "


def own_peak_bytes() -> int:
    """This process's own high-water RSS (VmHWM). exec gives the child a fresh address space, so
    this counts nothing of the driver's, unlike wait4's ru_maxrss, which keeps the pre-exec peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(config: Path, step: str, key: str) -> tuple[float, int, dict[str, int]]:
    """(wall seconds, the child's own peak RSS bytes, the step's counts) of one partition run in a
    fresh process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.dedup_memory", "--child", str(config), step, key],
                          cwd=REPO, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{step}[{key}] failed with status {proc.returncode}")
    results = [json.loads(line[len(RESULT_PREFIX):]) for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not results:
        raise RuntimeError(f"{step}[{key}] reported no peak")
    return time.perf_counter() - start, results[-1]["peak_bytes"], results[-1]["counts"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--workdir", default="/tmp/dedup-1m")
    p.add_argument("--synthetic-signatures", action="store_true", help="write signatures directly; global steps only")
    p.add_argument("--hash-ranges", type=int, help="exact_dedup.hash_ranges (default: one per 250k documents, at least 4)")
    p.add_argument("--max-memory-mb", type=int, help="near_dedup.max_memory_mb")
    p.add_argument("--band-splits", type=int, help="near_dedup.band_splits")
    p.add_argument("--child", nargs=3, metavar=("CONFIG", "STEP", "KEY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    if args.child:
        counts = run_step(*args.child)
        print(RESULT_PREFIX + json.dumps({"peak_bytes": own_peak_bytes(), "counts": counts}), flush=True)
        return 0

    from refinery.global_steps import exact_dedup as ex
    from refinery.global_steps import near_dedup as nd
    from refinery.config import load_config
    from refinery.documents import input_shards

    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    start = time.perf_counter()
    near = {k: v for k, v in (("max_memory_mb", args.max_memory_mb), ("band_splits", args.band_splits)) if v is not None}
    stages = {"exact_dedup": {"hash_ranges": args.hash_ranges or max(4, -(-args.docs // 250_000))}, "near_dedup": near}
    write = write_synthetic_signatures if args.synthetic_signatures else generate
    config = write(workdir, args.docs, args.shards, stages)
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
    if args.synthetic_signatures:
        plan = [(step, keys) for step, keys in plan if step not in ("dedup_signatures", "deduped")]
    results = {}
    for step, keys in plan:
        runs = [measure(config, step, k) for k in keys]
        results[step] = {"partitions": len(keys), "wall_s": sum(w for w, _, _ in runs), "peak_rss_mib": max(r for _, r, _ in runs) / 2**20}
        if step == "near_deduped":
            results[step]["splits"] = max(c["splits"] for _, _, c in runs)
            results[step]["largest_split_docs"] = max(c["largest_split_docs"] for _, _, c in runs)
        extra = f", {results[step]['splits']} split(s) per band" if "splits" in results[step] else ""
        print(f"{step}: {len(keys)} partition(s){extra}, {results[step]['wall_s']:.1f}s, "
              f"peak VmHWM {results[step]['peak_rss_mib']:.0f} MiB", flush=True)

    import polars as pl

    out = workdir / "out"
    clusters = pl.read_parquet(out / "dedup/near/clusters.parquet")
    dropped = {
        "exact_dedup/duplicate": pl.scan_parquet(str(out / "dedup/exact/*.parquet")).select(pl.len()).collect().item(),
        "near_dedup/duplicate": clusters.filter(pl.col("doc_key") != pl.col("keeper_key")).height,
    }
    sig_bytes = sum(f.stat().st_size for f in (out / "dedup/signatures").glob("*.parquet"))
    summary = {
        "docs": args.docs,
        "dropped": dropped,
        "signature_bytes_per_doc_on_disk": round(sig_bytes / args.docs, 1),
        "edges_bytes": sum(f.stat().st_size for f in (out / "dedup/near/edges").glob("*.parquet")),
        "total_wall_s": round(sum(r["wall_s"] for k, r in results.items() if k != "import"), 1),
        "max_peak_rss_mib": round(max(r["peak_rss_mib"] for r in results.values()), 1),
        "config": stages,
        "steps": {k: {kk: round(v, 1) if isinstance(v, float) else v for kk, v in r.items()} for k, r in results.items()},
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
