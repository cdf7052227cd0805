"""MinHash signatures/s per core, ours next to datasketch.MinHash.bulk in the same run, plus LSH recall.

    python bench/minhash.py [--docs 4000] [--baseline-docs 400] [--repeats 5]

Documents are 500 tokens drawn from a Zipf vocabulary with punctuation (seeded), once with ASCII
words and once with non-ASCII words (Greek, Cyrillic, accented Latin, CJK and Hangul letters), side
by side. Each figure is documents per CPU-second (`time.process_time`; numpy is single-threaded
here, so that is per core), the median of `--repeats` rounds in this one process, every round timing
every method on both alphabets in turn:

- ours: `MinHasher.signatures` from raw text (word splitting included) at 128 permutations;
- ours + sketch: `MinHasher.sketch(texts, 1024)`, what `dedup_signatures` computes per document;
- datasketch bulk: `MinHash.bulk` at 128 permutations (datasketch's default sha1 hash) on shingles
  prepared outside the timer, so the baseline is not charged for tokenization;
- datasketch end to end: the same with word splitting and shingle joining timed too.

LSH recall (ASCII and non-ASCII words): pairs of a 300-word document and an edited copy, spread over exact shingle Jaccard
0.5-1.0. Reported per Jaccard bin and for all pairs with Jaccard >= 0.8: the fraction that are LSH
candidates (any of the 16 x 8 bands equal), and the fraction that end in one cluster after
verification; the verified fraction of pairs below 0.8 is what precision loses.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refinery.global_steps import minhash as mh  # noqa: E402
from refinery.global_steps import near_dedup as nd  # noqa: E402

PUNCT = [",", ".", ";", ":", "!", "?", "(", ")", "-"]
ALPHABETS = {
    "ASCII": "abcdefghijklmnopqrstuvwxyz",
    "non-ASCII": "αβγδεζηθικλμνξπρστφχψωабвгдежзиклмнопрстăâîșțéèüöß日本語中文字東京한국어문장",
}


def vocabulary(rng: random.Random, letters: str, size: int = 30_000) -> list[str]:
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(size)]


def documents(n: int, words: int, seed: int, letters: str) -> list[str]:
    rng = random.Random(seed)
    vocab = vocabulary(rng, letters)
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    out = []
    for _ in range(n):
        tokens = rng.choices(vocab, weights=weights, k=words)
        out.append(" ".join(t + (rng.choice(PUNCT) if rng.random() < 0.08 else "") for t in tokens))
    return out


def median_rates(cases: dict[tuple[str, str], tuple[Callable[[], object], int]], repeats: int) -> dict[tuple[str, str], float]:
    """Items per CPU-second of each case, the median of `repeats` rounds; every round runs every case
    once, in turn, so that a change in the machine's load falls on all of them alike."""
    seconds: dict[tuple[str, str], list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (fn, _items) in cases.items():
            start = time.process_time()
            fn()
            seconds[name].append(time.process_time() - start)
    return {name: items / statistics.median(seconds[name]) for name, (_fn, items) in cases.items()}


def datasketch_shingles(text: str) -> list[bytes]:
    return [" ".join(s).encode("utf-8") for s in mh.shingles(mh.shingle_words(text), 5)]


def signature_cases(docs: int, baseline_docs: int, letters: str) -> dict[str, tuple[Callable[[], object], int]]:
    from datasketch import MinHash

    texts = documents(docs, 500, seed=1, letters=letters)
    hasher = mh.MinHasher(128, 1, 5)
    base_texts = texts[:baseline_docs]
    prepared = [datasketch_shingles(t) for t in base_texts]
    hasher.signatures(texts[:1])  # builds the code-point tables (once per process) outside the timer
    return {
        "ours": (lambda: hasher.signatures(texts), len(texts)),
        "ours + bottom-1024 sketch": (lambda: hasher.sketch(texts, 1024), len(texts)),
        "datasketch MinHash.bulk": (lambda: MinHash.bulk(prepared, num_perm=128), len(prepared)),
        "datasketch end to end": (
            lambda: MinHash.bulk([datasketch_shingles(t) for t in base_texts], num_perm=128), len(base_texts)
        ),
    }


def lsh_recall(pairs: int, seed: int, letters: str) -> list[tuple[str, int, float, float]]:
    """(Jaccard bin, pairs, candidate fraction, clustered fraction) per bin, then the >= 0.8 total."""
    rng = random.Random(seed)
    vocab = vocabulary(rng, letters)
    texts = []
    for _ in range(pairs):
        base = [rng.choice(vocab) for _ in range(300)]
        copy = list(base)
        for _ in range(rng.randint(0, 16)):
            copy[rng.randrange(300)] = rng.choice(vocab)
        texts += [" ".join(base), " ".join(copy)]
    settings = nd.DedupSettings(num_perm=128, shingle_size=5, seed=1, threshold=0.8, bands=16, rows=8, hash_ranges=1)
    sigs, sketches = settings.hasher().sketch(texts, settings.bottom_k)
    bands = nd.band_hashes(sigs, settings.bands, settings.rows)
    keys = np.arange(len(texts), dtype=np.uint64)
    table = nd.cluster_signatures(keys, sigs, sketches, settings)
    keeper = dict(zip(table["doc_key"].to_list(), table["keeper_key"].to_list()))
    rows = []
    for p in range(pairs):
        a, b = 2 * p, 2 * p + 1
        sa = set(mh.shingles(mh.shingle_words(texts[a]), 5))
        sb = set(mh.shingles(mh.shingle_words(texts[b]), 5))
        j = len(sa & sb) / len(sa | sb)
        candidate = bool((bands[a] == bands[b]).any())
        rows.append((j, candidate, a in keeper and keeper.get(a) == keeper.get(b)))
    out = []
    for lo, hi in [(0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.85), (0.85, 0.9), (0.9, 0.95), (0.95, 1.01)]:
        sel = [r for r in rows if lo <= r[0] < hi]
        if sel:
            out.append((f"[{lo:.2f}, {min(hi, 1.0):.2f})", len(sel), sum(r[1] for r in sel) / len(sel),
                        sum(r[2] for r in sel) / len(sel)))
    high = [r for r in rows if r[0] >= 0.8]
    out.append((">= 0.80", len(high), sum(r[1] for r in high) / len(high), sum(r[2] for r in high) / len(high)))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=4000)
    p.add_argument("--baseline-docs", type=int, default=400)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--pairs", type=int, default=3000)
    args = p.parse_args()
    cases = {
        (words, name): case
        for words, letters in ALPHABETS.items()
        for name, case in signature_cases(args.docs, args.baseline_docs, letters).items()
    }
    measured = median_rates(cases, args.repeats)
    rates = {words: {name: measured[(words, name)] for (w, name) in cases if w == words} for words in ALPHABETS}
    print("| method | " + " | ".join(f"{w} docs/s (1 core, median) | vs MinHash.bulk" for w in rates) + " |")
    print("| --- |" + " ---: | ---: |" * len(rates))
    for name in rates["ASCII"]:
        cells = [f"{r[name]:,.0f} | {r[name] / r['datasketch MinHash.bulk']:.1f}x" for r in rates.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name in ("ours", "ours + bottom-1024 sketch"):
        print(f"{name}: a non-ASCII document costs {rates['ASCII'][name] / rates['non-ASCII'][name]:.2f}x an ASCII one")
    for words, letters in ALPHABETS.items():
        print(f"\n{words} words\n\n| exact Jaccard | pairs | LSH candidates (16 x 8) | clustered after verification |")
        print("| --- | ---: | ---: | ---: |")
        for label, n, cand, clustered in lsh_recall(args.pairs, seed=2, letters=letters):
            print(f"| {label} | {n} | {cand:.3f} | {clustered:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
