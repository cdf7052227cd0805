"""Cost of the difficulty score per document, beside the quality classifier's and the tokenizer's.

The reference model (refinery/models/difficulty.py, a trigram over token ids) is trained on the
curated sources the bundled sample is built from (data/source/: the books and the wiki, each
paragraph a document), with a byte-level BPE of 8,192 entries trained on them first. The documents
scored are `synthetic.crawl.generate_corpus` documents (real English sentences, about 3.6 KB
each). Three costs are measured on the same documents, each as CPU seconds (`time.process_time`,
which counts every thread of the process), median of `--repeats`:

- tokenizer: `encode_batch_fast` of the texts (what tokenized_shards does anyway);
- difficulty: `score_documents` of the token ids (what tokenized_shards adds);
- quality: `QualityModel.score` of the texts (one torch thread; the quality_scored stage's scorer).

    python bench/difficulty.py [--docs 4000] [--repeats 5]

Prints JSON: documents per CPU-second of each, the model's size and what it was trained on.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from refinery.models import difficulty as dfc  # noqa: E402
from refinery.models.quality_fit import train_quality_model  # noqa: E402
from refinery.global_steps.tokenize import encode_texts, train_tokenizer  # noqa: E402
from synthetic.documents import load_source  # noqa: E402
from synthetic.crawl import generate_corpus  # noqa: E402

EOD = "<|endoftext|>"


def cpu_seconds(fn, repeats: int) -> float:
    """Median process CPU time of `fn()` over `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-train-tokens", type=int, default=4_000_000)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    reference = [p for name in ("books", "wiki") for rec in load_source(name) if rec["lang"] == "en"
                 for p in rec["paragraphs"] if p.strip()]
    texts = [text for _, text in generate_corpus(args.docs, seed=1)]
    tokenizer = train_tokenizer(reference, 8192, EOD)
    dtype = np.dtype(np.uint16)

    start = time.process_time()
    model = dfc.train(encode_texts(tokenizer, reference, dtype), tokenizer.get_vocab_size(), order=3,
                      max_tokens=args.max_train_tokens)
    train_cpu_s = time.process_time() - start
    data = model.to_bytes()

    frame = pl.DataFrame({"doc_id": [f"r/{i:07d}" for i in range(len(reference))] +
                          [f"w/{i:07d}" for i in range(len(texts))],
                          "bucket": ["wiki"] * len(reference) + ["web"] * len(texts), "text": reference + texts})
    quality, _ = train_quality_model(frame, ["wiki"], ["web"], num_features=1 << 18, ngram=2, epochs=1,
                                     learning_rate=0.5, holdout_fraction=0.2, max_chars=100_000,
                                     max_docs_per_class=200_000, seed=0)

    encoded = encode_texts(tokenizer, texts, dtype)
    series = pl.Series(texts)
    tokenizer_s = cpu_seconds(lambda: encode_texts(tokenizer, texts, dtype), args.repeats)
    difficulty_s = cpu_seconds(lambda: dfc.score_documents(model, encoded), args.repeats)
    quality_s = cpu_seconds(lambda: quality.score(series), args.repeats)
    scores = dfc.score_documents(model, encoded)
    n = len(texts)
    print(json.dumps({
        "docs": n,
        "mean_doc_bytes": round(sum(len(t.encode()) for t in texts) / n),
        "mean_doc_tokens": round(sum(map(len, encoded)) / n, 1),
        "reference_docs": len(reference),
        "model_tokens": model.tokens,
        "model_distinct_ngrams": model.distinct_ngrams(),
        "model_file_bytes": len(data),
        "model_train_cpu_s": round(train_cpu_s, 2),
        "tokenizer_docs_per_cpu_s": round(n / tokenizer_s, 1),
        "difficulty_docs_per_cpu_s": round(n / difficulty_s, 1),
        "quality_docs_per_cpu_s": round(n / quality_s, 1),
        "difficulty_ms_per_doc": round(1000 * difficulty_s / n, 3),
        "difficulty_over_quality_cpu": round(difficulty_s / quality_s, 3),
        "difficulty_over_tokenizer_cpu": round(difficulty_s / tokenizer_s, 3),
        "difficulty_mean_p10_p50_p90": [round(float(v), 3) for v in
                                        (scores.mean(), *np.quantile(scores, [0.1, 0.5, 0.9]))],
    }, indent=1))


if __name__ == "__main__":
    main()
