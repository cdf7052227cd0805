"""Tokenize + pack throughput: `tokenize_file` (batched, parallel encode, windowing, shard writes)
against a naive per-document `encode` loop over the same documents, in the same run.

    python bench/tokenize_throughput.py [--mb 20] [--repeats 3] [--threads 2]

Prints tokens/s for each (median of the repeats, wall clock and per CPU-second) and the ratio. The
corpus is real text found in this environment (package docs and standard-library source, see
`corpus_texts`), written as one clean table; the tokenizer is a byte-level BPE with 8,192 entries
trained on 2,000 of its documents first.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import statistics  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import yaml  # noqa: E402

from refinery.global_steps import tokenize as tk  # noqa: E402
from refinery.config import load_config  # noqa: E402
from refinery.documents import CLEAN_STAGE, PROVENANCE_SCHEMA, input_shards, make_doc_id
from refinery.layout import documents_key
from refinery.storage import LocalDataRoot  # noqa: E402


def corpus_texts(max_mb: float) -> list[str]:
    """Real text that ships with this environment, in a fixed order: the prose of installed packages
    (.txt, .rst, .md, METADATA) and then standard-library Python source, cut into documents of about
    4 KB at paragraph breaks, up to `max_mb` MB."""
    paths = sysconfig.get_paths()
    prose = sorted(p for p in Path(paths["purelib"]).rglob("*")
                   if p.is_file() and (p.suffix in (".txt", ".rst", ".md") or p.name == "METADATA"))
    code = sorted(Path(paths["stdlib"]).rglob("*.py"))
    texts, size, budget = [], 0, max_mb * 1e6
    for path in prose + code:
        try:
            body = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        doc = []
        for para in body.split("\n\n"):
            doc.append(para)
            if sum(len(x) for x in doc) > 4000:
                texts.append("\n\n".join(doc))
                size += len(texts[-1])
                doc = []
        if doc and doc != [""]:
            texts.append("\n\n".join(doc))
            size += len(texts[-1])
        if size >= budget:
            break
    return texts


def setup(folder: Path, max_mb: float):
    (folder / "in").mkdir(parents=True)
    (folder / "in" / "bench.jsonl").write_text("")
    data = {
        "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "in/*.jsonl", "format": "jsonl", "bucket": "web"}],
        "tokenizer": {"vocab_size": 8192, "train_docs": 2000},
        "shards": {"max_seq_len": 2048, "overlap": 128, "shard_tokens": 4_000_000, "encode_batch_docs": 512},
    }
    (folder / "refinery.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(folder / "refinery.yaml")
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    shard = input_shards(cfg)[0]
    texts = corpus_texts(max_mb)
    n = len(texts)
    df = pl.DataFrame({
        "doc_id": [make_doc_id(shard.key, i) for i in range(n)], "url": [f"https://b.example/{i}" for i in range(n)],
        "source": ["web"] * n, "bucket": ["web"] * n, "file": [shard.path] * n, "record_index": list(range(n)),
        "record_offset": [0] * n, "fetch_time": [None] * n, "content_type": ["text/plain"] * n,
    }, schema=PROVENANCE_SCHEMA).with_columns(text=pl.Series(texts), quality_score=pl.lit(0.5))
    root.write_parquet(documents_key(CLEAN_STAGE, shard.key), df)
    return cfg, root, texts


def naive_loop(tokenizer, texts: list[str], eod: int) -> int:
    """One `encode` call per document, ids copied into numpy: what a first version does."""
    total = 0
    for text in texts:
        ids = np.array(tokenizer.encode(text, add_special_tokens=False).ids + [eod], dtype=np.uint16)
        total += len(ids)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20.0, help="corpus size in MB of text")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cfg, root, texts = setup(Path(tmp), args.mb)
        shard = input_shards(cfg)[0]
        t0 = time.perf_counter()
        tok = tk.build_tokenizer(root, cfg).tokenizer
        print(f"tokenizer trained in {time.perf_counter() - t0:.1f}s on {cfg.tokenizer.train_docs} docs")
        eod = tok.token_to_id(cfg.tokenizer.eod_token)
        naive, ours, naive_cpu, ours_cpu = [], [], [], []
        tokens = 0
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            tokens = naive_loop(tok, texts, eod)
            naive.append(tokens / (time.perf_counter() - t0))
            naive_cpu.append(tokens / (time.process_time() - c0))
            t0, c0 = time.perf_counter(), time.process_time()
            index = tk.tokenize_file(root, cfg, shard, tok).index
            ours.append(index["tokens"] / (time.perf_counter() - t0))
            ours_cpu.append(index["tokens"] / (time.process_time() - c0))
            assert index["tokens"] >= tokens  # windows repeat their overlap tokens
        mb = sum(len(t.encode()) for t in texts) / 1e6
        print(f"corpus: {len(texts)} docs, {mb:.1f} MB, {tokens:,} tokens (+ overlap: {index['tokens']:,}), "
              f"{index['entries']} entries in {len(index['shards'])} shards; RAYON_NUM_THREADS={args.threads}")
        print(f"naive per-document encode loop: {statistics.median(naive) / 1e6:.2f}M tokens/s "
              f"(runs: {', '.join(f'{x / 1e6:.2f}' for x in naive)})")
        print(f"tokenize_file (read, encode_batch_fast, window, pack, write): {statistics.median(ours) / 1e6:.2f}M "
              f"tokens/s (runs: {', '.join(f'{x / 1e6:.2f}' for x in ours)})")
        print(f"ratio: {statistics.median(ours) / statistics.median(naive):.2f}x")
        print(f"per CPU-second: naive {statistics.median(naive_cpu) / 1e6:.2f}M, "
              f"tokenize_file {statistics.median(ours_cpu) / 1e6:.2f}M tokens; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
