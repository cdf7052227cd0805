"""Peak memory of quality training on a generated corpus, measured in a fresh process.

`python tests/helpers/quality_memory.py DOCS` trains the classifier on DOCS documents of about
8 KB, generated one table of 100 at a time as the trainer reads them (so the corpus itself takes
no memory), with 1 MiB feature chunks, and prints the process's peak RSS in KiB."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import polars as pl

CURATED = "river valley farmers stone houses records harvests weather trade council history letters".split()
WEB = "click buy cheap deals free shipping price casino bonus win money online offer sale".split()
TABLE_DOCS = 100


def generated_tables(docs: int) -> Iterator[pl.DataFrame]:
    """`docs` documents, half `wiki` and half `web`, the same on every pass."""
    for first in range(0, docs, TABLE_DOCS):
        rng = random.Random(first)
        ids = range(first, min(first + TABLE_DOCS, docs))
        buckets = ["wiki" if i % 2 else "web" for i in ids]
        texts = [" ".join(rng.choice(CURATED if b == "wiki" else WEB) for _ in range(1000)) for b in buckets]
        yield pl.DataFrame({"doc_id": [f"d/{i:07d}" for i in ids], "bucket": buckets, "text": texts})


def peak_rss_kib(docs: int) -> int:
    """Run this file for `docs` documents in a fresh interpreter; its peak RSS in KiB."""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, __file__, str(docs)], capture_output=True, text=True, check=True,
                          cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    return int(done.stdout.split()[-1])


if __name__ == "__main__":
    from refinery.models import quality_fit as qfit

    n = int(sys.argv[1])
    qfit.train_quality_model(lambda: generated_tables(n), ["wiki"], ["web"], num_features=1 << 16, ngram=2, epochs=1,
                          learning_rate=0.5, holdout_fraction=0.2, max_chars=100_000, max_docs_per_class=n,
                          seed=0, chunk_bytes=1 << 20)
    # VmHWM, this process image's own peak in KiB: ru_maxrss keeps the forking parent's peak across exec.
    print(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])
