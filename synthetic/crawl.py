"""The seeded generator of the bundled sample crawl and of benchmark corpora.

Everything is built from real, redistributable text in `data/source/` (see data/README.md for its
origin and licences): Debian Reference sections become web pages in seven languages, Python's
documentation becomes the wiki, the Debian Administrator's Handbook the books, mpmath's reference
(with its LaTeX formulas) the math, and CPython's standard library the code. Into that the
generator plants the cases the funnel must handle (exact and near duplicates at a computed Jaccard,
SEO spam, PII, binary records, bad UTF-8, truncated files, an empty file, a 50 MB line, a URL-less
record) and writes `ground_truth.json`, which the tests read.

    python -m synthetic.crawl --out data/sample --seed 1234

regenerates the checked-in sample byte for byte: every random choice comes from a
`random.Random` seeded by (seed, purpose), gzip members carry no timestamp, and JSON is written
with sorted keys. The parts: synthetic/documents.py (source text and planted variants),
synthetic/warc.py (pages and records), synthetic/sample.py (the sample), and here the benchmark
corpora and the command line.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Iterator

from refinery.storage import atomic_path
from synthetic.documents import SOURCE_DIR, Doc, english_sentences, rng_for
from synthetic.sample import build_sample
from synthetic.warc import gzip_member, http_response, render_page, warc_record



def generate_corpus(
    n_docs: int,
    seed: int,
    words_per_doc: int = 550,
    dup_fraction: float = 0.05,
    near_dup_fraction: float = 0.05,
    near_dup_replace: float = 0.05,
    source_dir: Path = SOURCE_DIR,
) -> Iterator[tuple[str, str]]:
    """`n_docs` (url, text) documents of real English sentences, about `words_per_doc` words
    (550 words is about 3.6 KB, datatrove's measured document size), in paragraphs. A
    `dup_fraction` of them repeat an earlier document exactly under a new URL, and a
    `near_dup_fraction` repeat one with `near_dup_replace` of its sentences swapped."""
    sentences = english_sentences(source_dir)
    rng = rng_for(seed, "corpus")
    recent: list[list[list[str]]] = []  # paragraphs of sentences of the last documents, to copy from
    for i in range(n_docs):
        url = f"https://corpus.example/{seed}/{i:08d}"
        roll = rng.random()
        if recent and roll < dup_fraction:
            paragraphs = rng.choice(recent)
        elif recent and roll < dup_fraction + near_dup_fraction:
            paragraphs = [[rng.choice(sentences) if rng.random() < near_dup_replace else s for s in p] for p in rng.choice(recent)]
        else:
            paragraphs, words = [], 0
            while words < words_per_doc:
                para = [rng.choice(sentences) for _ in range(rng.randint(3, 6))]
                words += sum(len(s.split()) for s in para)
                paragraphs.append(para)
            recent.append(paragraphs)
            if len(recent) > 256:
                recent.pop(rng.randrange(len(recent)))
        yield url, "\n\n".join(" ".join(p) for p in paragraphs)


def write_corpus(path: Path, n_docs: int, seed: int, fmt: str = "jsonl", **kwargs) -> int:
    """Write `generate_corpus` as JSONL ({"url", "text"}; gzip when the name ends in .gz) or as a
    per-record-gzip WARC of HTML pages. Returns the number of documents written."""
    rng = rng_for(seed, "corpus-html")
    n = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        sink = gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6, mtime=0) if fmt == "jsonl" and path.name.endswith(".gz") else f
        if fmt == "warc":
            f.write(gzip_member(warc_record("warcinfo", None, b"software: refinery.synth\r\n", rng, "application/warc-fields")))
        for url, text in generate_corpus(n_docs, seed, **kwargs):
            if fmt == "warc":
                title, *paragraphs = text.split("\n\n")
                body = render_page(Doc(url, title[:80], paragraphs, "web")).encode()
                f.write(gzip_member(warc_record("response", url, http_response(body, "text/html; charset=utf-8", rng), rng, "application/http; msgtype=response")))
            else:
                sink.write(json.dumps({"url": url, "text": text}, ensure_ascii=False).encode() + b"\n")
            n += 1
        if sink is not f:
            sink.close()
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m synthetic.crawl", description="Regenerate the sample crawl, or write a benchmark corpus.")
    ap.add_argument("--out", type=Path, required=True, help="the sample folder (data/sample), or a corpus file with --corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--source", type=Path, default=SOURCE_DIR, help="the real source text (data/source)")
    ap.add_argument("--corpus", type=int, metavar="N", help="write a benchmark corpus of N documents instead of the sample")
    ap.add_argument("--format", choices=["jsonl", "warc"], default="jsonl")
    args = ap.parse_args(argv)
    if args.corpus:
        n = write_corpus(args.out, args.corpus, args.seed, args.format, source_dir=args.source)
        print(f"wrote {n} documents to {args.out}")
        return 0
    truth = build_sample(args.out, args.seed, args.source)
    print(f"wrote {len(truth['files'])} files and {len(truth['documents'])} documents to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
