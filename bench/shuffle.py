"""Peak memory of the external shuffle for two corpus sizes 10x apart, with the same buffer.

    python bench/shuffle.py [--small-tokens 10000000] [--buffer-mb 64] [--repeats 2]

For each size a tokenized bucket of random tokens (one token series of entries of 50-4,000 tokens,
uint16, shards of 4M tokens) is generated, then `shuffle_bucket` runs in a fresh subprocess that reports its peak
RSS (`ru_maxrss`) and its RSS before shuffling (interpreter, numpy, polars and pyarrow loaded: the
baseline). Target:
peak minus baseline flat across sizes and within the configured buffer.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from refinery.global_steps import shuffle as sh  # noqa: E402
from refinery import layout  # noqa: E402
from refinery.global_steps import tokenize as tk  # noqa: E402
from refinery.storage import LocalDataRoot  # noqa: E402

SHARD_TOKENS = 4_000_000
BUCKET = "web"
PART = "bench"  # the one input file's token series the bucket is made of
FIELDS = {"vocab_size": 65_000, "eod_id": 0, "window": 4000, "overlap": 0}  # what the generated series claims


def current_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def generate(folder: str, tokens: int, seed: int = 0) -> int:
    """A tokenized bucket of about `tokens` random tokens; returns the entry count."""
    rng = np.random.default_rng(seed)
    root = LocalDataRoot(folder)
    with tk.ShardSeries(root, tk.TOKENIZED, BUCKET, np.dtype(np.uint16), SHARD_TOKENS, dict(FIELDS), part=PART) as series:
        written, doc = 0, 0
        while written < tokens:
            lengths = rng.integers(50, 4000, size=1000)
            block = rng.integers(0, 65_000, size=int(lengths.sum()), dtype=np.uint16)
            start = 0
            for n in lengths:
                series.add(block[start : start + n], f"bench-{doc // 100:05d}/{doc:07d}", 0, 0, 1, 0.5)
                start += n
                doc += 1
            written += int(lengths.sum())
        return series.finish()["entries"]


def child(folder: str, buffer_mb: int) -> None:
    import polars as pl
    import pyarrow.parquet  # noqa: F401  (loaded by the shuffle; its libraries belong to the baseline)

    root = LocalDataRoot(folder)
    pl.scan_parquet(root.local_path(layout.bucket_entries_key(tk.TOKENIZED, BUCKET, PART))).head(1).collect()
    before = current_rss_mb()
    t0 = time.perf_counter()
    result = sh.shuffle_bucket(root, 1, BUCKET, [PART], {"dtype": "uint16", **FIELDS}, SHARD_TOKENS, buffer_mb)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"baseline_mb": before, "peak_mb": peak, "runs": result.runs, "wall_s": wall,
                      "tokens": result.index["tokens"], "entries": result.index["entries"]}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small-tokens", type=int, default=10_000_000)
    ap.add_argument("--buffer-mb", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.buffer_mb)
        return
    for tokens in (args.small_tokens, 10 * args.small_tokens):
        folder = tempfile.mkdtemp(prefix="refinery-bench-shuffle-")
        try:
            entries = generate(folder, tokens)
            runs = []
            for _ in range(args.repeats):
                out = subprocess.run([sys.executable, __file__, "--child", folder, "--buffer-mb", str(args.buffer_mb)],
                                     check=True, capture_output=True, text=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
            peak = statistics.median(r["peak_mb"] for r in runs)
            base = statistics.median(r["baseline_mb"] for r in runs)
            wall = statistics.median(r["wall_s"] for r in runs)
            print(f"{runs[0]['tokens']:>12,} tokens ({runs[0]['tokens'] * 2 / 2**20:,.0f} MiB), {entries:,} entries, "
                  f"{runs[0]['runs']} runs: peak RSS {peak:.0f} MiB, baseline {base:.0f} MiB, "
                  f"peak - baseline {peak - base:.0f} MiB (buffer {args.buffer_mb} MiB + one 4M-token shard "
                  f"{SHARD_TOKENS * 2 / 2**20:.0f} MiB); {wall:.1f}s, {runs[0]['tokens'] / wall / 1e6:.1f}M tokens/s "
                  f"(peaks: {', '.join(format(r['peak_mb'], '.0f') for r in runs)})")
        finally:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
