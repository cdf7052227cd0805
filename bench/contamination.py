"""Contamination scan documents/s, `refinery.contamination.scan_documents` next to a plain Python
n-gram set lookup in the same run, plus recall on planted leaks.

    python bench/contamination.py [--docs 20000] [--eval-items 2000] [--repeats 3]

Documents are 500 words drawn from a Zipf vocabulary (seeded); the eval set is `--eval-items`
items of 40 words from the same vocabulary, and 1% of documents carry 20 consecutive words of one
item. Both scanners lower-case, split on runs of word characters and look for any shared 13-gram:

- ours: words split and hashed by Polars per batch of documents, rolling 64-bit n-gram hashes in
  numpy, a bitmap prefilter and `searchsorted` against the sorted eval hashes;
- baseline: `re.findall(r"\w+", text.lower())`, a Python `set` of eval 13-gram tuples and a
  `tuple(words[i:i+13]) in set` loop per document, the way a decontamination script is usually
  written.

The eval index is built once outside the timer for both. Each figure is the median of `--repeats`
runs in this one process (numpy is single-threaded here, so docs/s is per core).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refinery import contamination as cont  # noqa: E402
from refinery.config import ContaminationConfig, EvalSetConfig  # noqa: E402

NGRAM = 13


def corpus(rng: random.Random, docs: int, eval_items: int, words_per_doc: int = 500):
    vocab = [f"w{i}" for i in range(50_000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    draw = np.random.default_rng(rng.randrange(2**32))
    ids = draw.choice(len(vocab), size=(docs, words_per_doc), p=weights / weights.sum())
    items = [" ".join(vocab[i] for i in draw.choice(len(vocab), size=40)) for _ in range(eval_items)]
    texts = [" ".join(vocab[i] for i in row) for row in ids]
    planted = set(rng.sample(range(docs), docs // 100))
    for d in planted:
        leak = items[rng.randrange(eval_items)].split()[10:30]
        texts[d] = f"{texts[d]} {' '.join(leak)}."
    return texts, items, planted


WORD = re.compile(r"\w+")


def naive_words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def naive_scan(eval_grams: set, texts: list[str]) -> set[int]:
    found = set()
    for d, text in enumerate(texts):
        words = naive_words(text)
        if any(tuple(words[i:i + NGRAM]) in eval_grams for i in range(len(words) - NGRAM + 1)):
            found.add(d)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--eval-items", type=int, default=2_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/refinery-bench-contamination")
    args = ap.parse_args()

    rng = random.Random(0)
    texts, items, planted = corpus(rng, args.docs, args.eval_items)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    eval_path = work / "eval.jsonl"
    eval_path.write_text("".join(f'{{"id": "item-{i}", "text": "{t}"}}\n' for i, t in enumerate(items)))
    # EvalIndex.build reads only the contamination section and path resolution of a config.
    ccfg = ContaminationConfig(eval_sets=[EvalSetConfig(name="bench", path=str(eval_path))], ngram=NGRAM)
    index = cont.EvalIndex.build(SimpleNamespace(contamination=ccfg, resolve=str))
    eval_grams = {tuple(ws[i:i + NGRAM]) for t in items for ws in [naive_words(t)]
                  for i in range(len(ws) - NGRAM + 1)}
    docs = [(f"web/{d}", None, "web", t) for d, t in enumerate(texts)]

    ours_t, base_t = [], []
    for _ in range(args.repeats):
        start = time.process_time()
        base_found = naive_scan(eval_grams, texts)
        base_t.append(time.process_time() - start)
        start = time.process_time()
        ours_found = {int(h.doc_id.split("/")[1]) for h in cont.scan_documents(index, docs)}
        ours_t.append(time.process_time() - start)
    ours, base = statistics.median(ours_t), statistics.median(base_t)
    words = sum(len(t.split()) for t in texts) / len(texts)
    print(f"{args.docs:,} documents of {words:.0f} words; {args.eval_items:,} eval items ({len(index):,} {NGRAM}-grams); "
          f"{len(planted)} planted leaks")
    print(f"{'scanner':<34} {'docs/s':>10} {'CPU s':>8} {'found':>6} {'recall':>7}")
    for name, t, found in [("python set of n-gram tuples", base, base_found), ("refinery scan_documents", ours, ours_found)]:
        print(f"{name:<34} {args.docs / t:>10,.0f} {t:>8.2f} {len(found):>6} {len(found & planted) / len(planted):>7.3f}")
    print(f"ratio ours / baseline: {base / ours:.2f}x; false positives: ours {len(ours_found - planted)}, "
          f"baseline {len(base_found - planted)}")


if __name__ == "__main__":
    main()
