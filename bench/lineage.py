"""Lineage index: build time and peak memory at several corpus sizes, and query latency.

    python bench/lineage.py [--docs 50000 150000 450000] [--queries 2000] [--cli-queries 9]

For each size, generates a corpus the way the funnel leaves it: clean document tables of
`--docs-per-file` documents per input file (text included, doc_ids with gaps as after filtering),
a byte-level BPE tokenizer of `TOKENIZER_VOCAB` tokens (the pipeline's trainer, on text of a random
lexicon) where the `tokenizer` asset writes it, and final shards of random token ids of that
vocabulary (entries of 20-200 tokens, `--shard-tokens` per shard) holding every document once, in
a seeded random order across the input files, as the shuffle leaves them. Then
`build_lineage_index` runs in a child process, which reports its wall time and peak RSS (VmHWM of
/proc/self/status: ru_maxrss would carry the parent's high-water mark across exec), and the peak it
had after its imports, before the build.

On the largest size, times `resolve_token` on random (shard, offset) positions of the final shards,
the decoded text window included (each query checks that its text was decoded). After the first
query the process reuses the parsed index and tokenizer (`refinery.lineage.open_index`, as a server
or a loop over queries does); the first query of a shard hash-checks the files it reads (the shard's
.idx and .bin, its lineage rows file) against the index, later ones only stat them, and each reads
one row of its lineage file (the OS page cache is warm). The same positions are then timed again,
every file already checked: the difference is what the hash checks cost. Baseline in the same run: the same document found by a
scan of every clean table per query. Prints p50/p99 in ms. Then `--cli-queries` times one
`refinery lineage` command line per query, each in a fresh process (imports, the config's
preflight, the tokenizer parsed, one query, the output printed), and prints the median and max wall.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import yaml  # noqa: E402

from refinery.global_steps import tokenize as tk  # noqa: E402
from refinery import lineage as lin  # noqa: E402
from refinery import lineage_index as lindex  # noqa: E402
from refinery.config import load_config  # noqa: E402
from refinery.documents import CLEAN_STAGE, PROVENANCE_SCHEMA, input_shards, make_doc_id  # noqa: E402
from refinery.layout import TOKENIZER_KEY, documents_key  # noqa: E402
from refinery.shard_format import token_dtype  # noqa: E402
from refinery.storage import LocalDataRoot  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLEAN_SCHEMA = {**PROVENANCE_SCHEMA, "text": pl.String, "language": pl.String, "language_score": pl.Float64,
                "dup_cluster": pl.String, "dup_cluster_size": pl.Int64, "quality_score": pl.Float64,
                "pii_counts": pl.Struct({"email": pl.Int32, "phone": pl.Int32})}
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()
# A vocabulary the size of a small production tokenizer's: its tokenizer.json is what a fresh
# process parses before it can decode (~0.85 MB at this size).
TOKENIZER_VOCAB = 32_768


def clean_table(key: str, first: int, n: int, rng: np.random.Generator) -> pl.DataFrame:
    """`n` clean documents of input file `key`, documents `first`.. of the corpus."""
    lengths = rng.integers(20, 120, size=n)
    words = np.asarray(WORDS)[rng.integers(0, len(WORDS), size=int(lengths.sum()))]
    cuts = np.cumsum(lengths)[:-1]
    texts = [" ".join(part) for part in np.split(words, cuts)]
    records = [2 * i for i in range(n)]  # gaps, as after filtering
    return pl.DataFrame({
        "doc_id": [make_doc_id(key, r) for r in records], "url": [f"https://site{(first + i) % 997}.example/{first + i}" for i in range(n)],
        "source": ["web"] * n, "bucket": ["web"] * n, "file": [f"in/{key}.jsonl"] * n, "record_index": records,
        "record_offset": [r * 7919 for r in records], "fetch_time": ["2026-01-01T00:00:00Z"] * n,
        "content_type": ["text/html"] * n, "text": texts, "language": ["en"] * n,
        "language_score": rng.uniform(0.65, 1.0, size=n), "dup_cluster": [None] * n, "dup_cluster_size": [1] * n,
        "quality_score": rng.uniform(0.0, 1.0, size=n),
        "pii_counts": [{"email": i % 3, "phone": i % 2} for i in range(n)],
    }, schema=CLEAN_SCHEMA)


def write_tokenizer(root: LocalDataRoot, eod_token: str, rng: np.random.Generator) -> int:
    """A byte-level BPE of TOKENIZER_VOCAB tokens, trained (`tk.train_tokenizer`) on text of 60,000
    random lowercase words so that its merges fill the vocabulary, written where the `tokenizer`
    asset writes it; returns its vocabulary size."""
    letters = np.asarray(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(3, 10, size=60_000)
    lexicon = np.asarray(["".join(w) for w in np.split(letters[rng.integers(0, 26, size=int(lengths.sum()))],
                                                         np.cumsum(lengths)[:-1])])
    texts = [" ".join(lexicon[rng.integers(0, len(lexicon), size=200)]) for _ in range(3000)]
    tokenizer = tk.train_tokenizer(texts, TOKENIZER_VOCAB, eod_token)
    root.write_bytes(TOKENIZER_KEY, tokenizer.to_str().encode())
    return tokenizer.get_vocab_size()


def generate(folder: Path, docs: int, docs_per_file: int, shard_tokens: int, seed: int = 0) -> dict:
    """The corpus of `docs` documents in `folder`; returns the final shards' index."""
    files = -(-docs // docs_per_file)
    (folder / "in").mkdir(parents=True)
    for f in range(files):
        (folder / "in" / f"cc{f:05d}.jsonl").write_text("")  # the input shard exists; its clean table is below
    data = {"data_root": "out", "buckets": ["web"], "tokenizer": {"vocab_size": TOKENIZER_VOCAB},
            "sources": [{"name": "web", "path": "in/*.jsonl", "format": "jsonl", "bucket": "web"}]}
    (folder / "refinery.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(folder / "refinery.yaml")
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    rng = np.random.default_rng(seed)
    doc_ids: list[str] = []
    for f, shard in enumerate(input_shards(cfg)):
        n = min(docs_per_file, docs - f * docs_per_file)
        table = clean_table(shard.key, f * docs_per_file, n, rng)
        root.write_parquet(documents_key(CLEAN_STAGE, shard.key), table)
        doc_ids += table["doc_id"].to_list()
    vocab = write_tokenizer(root, cfg.tokenizer.eod_token, rng)
    dtype = token_dtype(vocab)
    lengths = rng.integers(20, 200, size=len(doc_ids))
    tokens = rng.integers(1, vocab, size=int(lengths.sum()), dtype=dtype)  # id 0 is the end-of-document token
    starts = np.concatenate([[0], np.cumsum(lengths)])
    with tk.ShardSeries(root, tk.FINAL, "web", dtype, shard_tokens) as series:
        for d in rng.permutation(len(doc_ids)):
            series.add(tokens[starts[d]:starts[d + 1]], doc_ids[d], 0, 0, 1, 0.5)
        return series.finish()


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def build_in_this_process(folder: Path) -> None:
    """The child's side: build the index of `folder`'s corpus, print wall time and memory as JSON."""
    cfg = load_config(folder / "refinery.yaml")
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    rss_before = peak_rss_mb()
    t0 = time.perf_counter()
    index = lindex.build_lineage_index(root, cfg)
    wall = time.perf_counter() - t0
    print(json.dumps({"wall_s": wall, "peak_rss_mb": peak_rss_mb(), "import_rss_mb": rss_before,
                      "documents": index["documents"]}))


def time_queries(folder: Path, index: dict, queries: int, baseline_queries: int) -> list[tuple[str, int]]:
    """Times `resolve_token` on random positions of the final shards; returns the positions."""
    cfg = load_config(folder / "refinery.yaml")
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    rng = random.Random(1)
    refs = index["shards"]
    positions = []
    for _ in range(queries):
        ref = rng.choice(refs)
        positions.append((ref["prefix"].removeprefix("shards/final/"), rng.randrange(ref["tokens"])))
    lin.resolve_token(root, cfg, *positions[0])  # warm the page cache and imports once
    lin._VERIFIED.clear()  # each shard's files are hashed at their first query, as in a fresh process
    times, again = [], []
    for passed in (times, again):
        for shard, offset in positions:
            t = time.perf_counter()
            r = lin.resolve_token(root, cfg, shard, offset)
            passed.append((time.perf_counter() - t) * 1000)
            assert r["entry_start"] <= offset < r["entry_end"] and r["text"]["token"], r["text"]
    a50, a99 = np.percentile(again, 50), np.percentile(again, 99)
    print(f"resolve_token, the same {len(again)} queries again (every file already hash-checked): p50 {a50:.2f} ms, "
          f"p99 {a99:.2f} ms, max {max(again):.2f} ms")
    clean = [root.local_path(documents_key(CLEAN_STAGE, s.key)) for s in input_shards(cfg)]
    scan_times = []
    for shard, offset in positions[:baseline_queries]:
        t = time.perf_counter()
        doc_id = lin.resolve_token(root, cfg, shard, offset)["doc_id"]
        row = pl.scan_parquet(clean).filter(pl.col("doc_id") == doc_id).drop("text").collect()
        scan_times.append((time.perf_counter() - t) * 1000)
        assert row.height == 1
    p50, p99 = np.percentile(times, 50), np.percentile(times, 99)
    print(f"resolve_token, {len(times)} queries: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(times):.2f} ms")
    b50, b99 = np.percentile(scan_times, 50), np.percentile(scan_times, 99)
    print(f"baseline (a scan of every clean table per query), {len(scan_times)} queries: "
          f"p50 {b50:.2f} ms, p99 {b99:.2f} ms; ratio of p50s {b50 / p50:.1f}x; load average {os.getloadavg()[0]:.1f}")
    return positions


def time_cli(folder: Path, positions: list[tuple[str, int]]) -> None:
    """One `refinery lineage` per position, each a fresh process (`python -m orchestration.cli`, what
    the `refinery` script runs): median and max wall, the process start included."""
    walls = []
    for shard, offset in positions:
        command = [sys.executable, "-m", "orchestration.cli", "lineage", "--config", str(folder / "refinery.yaml"),
                   "--shard", shard, "--offset", str(offset)]
        t = time.perf_counter()
        out = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout
        walls.append(time.perf_counter() - t)
        assert out.startswith(f"token     shards/final/{shard} @ {offset}:") and "\ntext      tokens " in out, out
    print(f"refinery lineage, one query per process, {len(walls)} processes: median {statistics.median(walls):.3f} s, "
          f"max {max(walls):.3f} s; load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, nargs="+", default=[50_000, 150_000, 450_000])
    ap.add_argument("--docs-per-file", type=int, default=10_000)
    ap.add_argument("--shard-tokens", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--baseline-queries", type=int, default=20)
    ap.add_argument("--cli-queries", type=int, default=9, help="`refinery lineage` processes timed on the largest size")
    ap.add_argument("--build", type=Path, help=argparse.SUPPRESS)  # the child's side
    args = ap.parse_args()
    if args.build is not None:
        build_in_this_process(args.build)
        return
    print(f"docs per input file {args.docs_per_file:,}, shard_tokens {args.shard_tokens:,}")
    rows = []
    for docs in sorted(args.docs):
        folder = Path(tempfile.mkdtemp(prefix="refinery-bench-lineage-"))
        try:
            t0 = time.perf_counter()
            index = generate(folder, docs, args.docs_per_file, args.shard_tokens)
            print(f"{docs:,} documents: {index['tokens']:,} tokens in {len(index['shards'])} shards, "
                  f"generated in {time.perf_counter() - t0:.0f}s", flush=True)
            child = subprocess.run([sys.executable, __file__, "--build", str(folder)], check=True,
                                   capture_output=True, text=True)
            built = json.loads(child.stdout.splitlines()[-1])
            assert built["documents"] == docs
            rows.append((docs, len(index["shards"]), built))
            print(f"  build {built['wall_s']:.2f} s ({built['wall_s'] / docs * 1e6:.1f} us per document), peak RSS "
                  f"{built['peak_rss_mb']:.0f} MB ({built['import_rss_mb']:.0f} MB after imports)", flush=True)
            if docs == max(args.docs):
                positions = time_queries(folder, index, args.queries, args.baseline_queries)
                time_cli(folder, positions[:args.cli_queries])
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if len(rows) < 2:
        return  # one size: no growth to report
    (d0, _, b0), (d1, _, b1) = rows[0], rows[-1]
    print(f"from {d0:,} to {d1:,} documents ({d1 / d0:.1f}x): build time {b1['wall_s'] / b0['wall_s']:.2f}x, "
          f"slope {np.log(b1['wall_s'] / b0['wall_s']) / np.log(d1 / d0):.2f}; peak RSS "
          f"{b1['peak_rss_mb'] / b0['peak_rss_mb']:.2f}x; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
