"""Throughput of the quality scorer and the PII redactor, each next to a baseline run in the same process.

- quality: `QualityModel.score` on batches (one featurization and one EmbeddingBag call per 2,048
  documents) against one call per document, the same model, on the same documents.
- pii: `PiiRedactor.run` (6 kinds, checksums, per-document counts) against datatrove's
  `PIIFormatter` (emails and IPv4/IPv6 only) when a Python with datatrove is given with
  `--datatrove-python` (it runs there, on the same documents, in a subprocess timed from inside).

Documents are synthetic web-like text of about 3.6 KB (the size the ANCHORS figures use), with
numbers, dates, versions and prices everywhere, and planted PII in one document of five.

    python -m bench.quality_pii --docs 4000 --repeats 5 [--datatrove-python /path/to/python]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time

import polars as pl

from refinery.stages.pii import PiiRedactor
from refinery.models.quality_fit import train_quality_model

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will can more about said out "
         "market city season report price team data system service online page home news product review").split()
FILLERS = ["in 2019", "on 2023-10-05", "version 3.11.4", "for $19.99", "at 12:30", "page 42", "(see 1.2)", "v2.0.1",
           "about 1,500", "ISBN 978-3-16-148410-0", "call us today", "2019-2020"]
PLANTED = ["write to jane.doe{i}@example.org", "server 10.{a}.{b}.7", "phone +44 20 7946 {n:04d}",
           "call (555) 123-{n:04d}", "host 2001:db8::{a}"]


def make_docs(n: int, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """Texts, their buckets, and the PII values planted in them."""
    rng = random.Random(seed)
    texts, buckets, planted = [], [], []
    for i in range(n):
        parts = []
        while sum(len(p) + 1 for p in parts) < 3600:
            sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20)))
            if rng.random() < 0.4:
                sentence += " " + rng.choice(FILLERS)
            parts.append(sentence.capitalize() + ".")
        if i % 5 == 0:
            phrase = rng.choice(PLANTED).format(i=i, a=rng.randint(0, 255), b=rng.randint(1, 255),
                                                n=rng.randint(0, 9999))
            planted.append(phrase.split(" ", 1)[1])
            parts.insert(3, phrase + ".")
        texts.append(" ".join(parts))
        buckets.append("wiki" if i % 2 else "web")
    return texts, buckets, planted


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


DATATROVE_SCRIPT = """
import json, sys, time, statistics
from datatrove.data import Document
from datatrove.pipeline.formatters import PIIFormatter
texts = json.load(open(sys.argv[1])); repeats = int(sys.argv[2])
step = PIIFormatter()
times = []
for _ in range(repeats):
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    start = time.perf_counter()
    for _ in step.run(iter(docs)):
        pass
    times.append(time.perf_counter() - start)
print(json.dumps({"median_s": statistics.median(times)}))
"""


def datatrove_pii_seconds(python: str, texts: list[str], repeats: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "texts.json")
        with open(data, "w") as f:
            json.dump(texts, f)
        out = subprocess.run([python, "-c", DATATROVE_SCRIPT, data, str(repeats)], capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["median_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--per-doc-sample", type=int, default=500, help="documents scored one call each (baseline)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--datatrove-python", help="a python with datatrove installed, for the PII baseline")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)  # per-core figures
    texts, buckets, planted = make_docs(args.docs)
    frame = pl.DataFrame({"doc_id": [f"b/{i:07d}" for i in range(len(texts))], "bucket": buckets, "text": texts})
    results: dict[str, object] = {"docs": len(texts), "mean_doc_bytes": round(sum(map(len, texts)) / len(texts))}

    start = time.perf_counter()
    model, report = train_quality_model(frame, ["wiki"], ["web"], num_features=1 << 18, ngram=2, epochs=5,
                                        learning_rate=0.5, holdout_fraction=0.2, max_chars=100_000,
                                        max_docs_per_class=200_000, seed=0)
    results["train_s"] = round(time.perf_counter() - start, 2)
    series = pl.Series(texts)
    batched = median_time(lambda: model.score(series), args.repeats)
    sample = texts[: args.per_doc_sample]
    per_doc = median_time(lambda: [model.score(pl.Series([t])) for t in sample], args.repeats)
    results["quality_batched_docs_per_s"] = round(len(texts) / batched, 1)
    results["quality_per_doc_docs_per_s"] = round(len(sample) / per_doc, 1)
    results["quality_batched_vs_per_doc"] = round((len(texts) / batched) / (len(sample) / per_doc), 2)

    docs = pl.DataFrame({"doc_id": frame["doc_id"], "url": [None] * len(texts), "source": buckets,
                         "bucket": buckets, "text": texts}, schema_overrides={"url": pl.String})
    redactor = PiiRedactor()
    ours = median_time(lambda: redactor.run(docs), args.repeats)
    out = redactor.run(docs)
    results["pii_docs_per_s"] = round(len(texts) / ours, 1)
    replaced = sum(n for name, n in out.stats.counters.items() if name.startswith("pii/"))
    redacted_text = "\n".join(out.documents["text"])
    results["pii_planted"] = len(planted)
    results["pii_planted_left"] = sum(value in redacted_text for value in planted)
    results["pii_replacements_beyond_planted"] = replaced - len(planted)
    if args.datatrove_python:
        theirs = datatrove_pii_seconds(args.datatrove_python, texts, args.repeats)
        results["datatrove_pii_docs_per_s"] = round(len(texts) / theirs, 1)
        results["pii_vs_datatrove"] = round(theirs / ours, 2)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
