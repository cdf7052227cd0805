"""Build the ablation crawl (issue 37): real text mixed as a crawl mixes it, for bench/ablations.py
and configs/ablations.yaml. Deterministic: the same seed writes the same bytes.

    python data/ablations/build_crawl.py --out out/ablations-crawl

Two buckets, from the committed real-text sets (their origins and licences: data/labelled/README.md,
data/multilingual/README.md), written into `--out`:

- `web/web-00..03.warc.gz`: a crawl's mix, HTML pages in per-record gzip WARC:
  - documentation pages (data/multilingual/clean.jsonl.gz: the GNOME help and man pages in ten
    languages), kind `clean`;
  - real low-value text (data/labelled/'s `low` pages: licences, debian/copyright files, changelogs,
    gettext catalogues, word lists, generated tables of contents, templated package pages), kind
    `low/<kind>`;
  - spam, kind `spam`: data/multilingual/spam.jsonl.gz (made from the clean pages' own lines, so
    language ID reads it as its language) and the sample generator's SEO spam (keyword stuffing,
    repeated lines, link farms, lorem ipsum, "click here"; half on the demo's blocklisted domains).
    data/labelled/'s synthetic spam is left out: it is made from the Debian Reference pages the
    evaluation set is drawn from, so it would leak evaluation text into the raw variant;
  - exact and near copies of documentation pages planted by the sample generator
    (`SampleBuilder.plant_duplicates`: a new URL, the same text or a Jaccard band), each in the
    file after its original's.
- `docs/docs-00..01.jsonl.gz`: the curated bucket, data/labelled/'s `high` pages (Debian Reference
  and the New Maintainers' Guide in nine languages), `{"url", "text"}`. The ablations' held-out
  evaluation documents are drawn from it.

`ground_truth.json` lists every document (file, record index, bucket, kind, language), the planted
duplicates and spam (the sample's ground-truth format, data/README.md), and `summary`: documents,
UTF-8 bytes of text and languages per bucket and kind.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from synthetic.documents import BLOCKLISTED_DOMAINS, SPAM_KINDS, Doc, spam_doc
from synthetic.warc import gzip_member, warc_bytes, web_entries, write_bytes
from synthetic.sample import SampleBuilder

DATA = HERE.parent
LABELLED = DATA / "labelled" / "labelled.jsonl.gz"
MULTILINGUAL = DATA / "multilingual"
SEED = 37
DEFAULT_OUT = Path("out/ablations-crawl")  # relative to the checkout: where configs/ablations.yaml reads it
WEB_FILES, DOCS_FILES = 4, 2
SEO_SPAM_PAGES = 40
# Copies of documentation pages: about one web page in nine is a planted copy. Near copies sit
# above the near-dedup threshold of configs/ablations.yaml (0.8), in two bands.
EXACT_COPIES = 60
NEAR_COPIES = [(0.8, 0.9), (0.85, 0.95)] * 30
# Languages whose words are space-separated, so a near copy can replace words (Chinese, Japanese
# and Korean pages are copied by nobody here; their spam still is planted).
DUPLICATED_LANGUAGES = ("en", "de", "fr", "es", "ru", "el", "ro")


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def crawl_url(url: str) -> str:
    """A page's crawl URL: man:// pages (data/multilingual) become https pages of their own site."""
    return f"https://manpages.example/{url[len('man://'):]}.html" if url.startswith("man://") else url


def web_page(row: dict, kind: str) -> Doc:
    """A page's first line is its title, every other non-blank line a paragraph (one HTML <p>)."""
    lines = [line.strip() for line in row["text"].splitlines() if line.strip()]
    return Doc(crawl_url(row["url"]), lines[0][:200], lines[1:], "web", row["lang"], kind)


class CrawlBuilder(SampleBuilder):
    """Writes the crawl and its ground truth; the sample generator's planting and file layout."""

    def __init__(self, out: Path, seed: int) -> None:
        super().__init__(out, seed)
        self.texts: dict[str, str] = {}  # every written document's text by URL, for the summary

    def build_web(self) -> None:
        labelled = read_jsonl_gz(LABELLED)
        docs = [web_page(r, "clean") for r in read_jsonl_gz(MULTILINGUAL / "clean.jsonl.gz")]
        docs += [web_page(r, f"low/{r['kind']}") for r in labelled if r["label"] == "low"]
        spam = [web_page(r, "spam") for r in read_jsonl_gz(MULTILINGUAL / "spam.jsonl.gz")]
        for page, row in zip(spam, read_jsonl_gz(MULTILINGUAL / "spam.jsonl.gz")):
            page.extra["spam_kind"] = row["kind"].removeprefix("spam/")
        links: dict[str, list[str]] = {}
        spam_rng = self.rng("web-spam")
        for k in range(SEO_SPAM_PAGES):
            page, links[page.url] = spam_doc(SPAM_KINDS[k % len(SPAM_KINDS)], k, spam_rng)
            spam.append(page)
        for page in spam:
            host = page.url.split("/")[2]
            self.truth.spam.append({"url": page.url, "kind": page.extra["spam_kind"], "lang": page.lang,
                                    "blocklisted_domain": host.endswith(BLOCKLISTED_DOMAINS)})
        copies = self.plant_duplicates(docs, "web", EXACT_COPIES, NEAR_COPIES, DUPLICATED_LANGUAGES)
        rng = self.rng("web")
        for i, file_docs in enumerate(self.split_files(docs + spam, copies, WEB_FILES, "web-files")):
            name = f"web/web-{i:02d}.warc.gz"
            entries = web_entries(file_docs, links, rng)
            records, index = warc_bytes(entries, rng, name)
            write_bytes(self.out / name, b"".join(gzip_member(r) for r in records))
            for d in file_docs:
                self.truth.add_doc(d, name, index[d.url])
                self.texts[d.url] = d.text
            self.truth.files[name] = {"bucket": "web", "records": len(records), "responses": len(entries),
                                      "documents": len(file_docs)}

    def build_docs(self) -> None:
        docs = [Doc(r["url"], "", [r["text"]], "docs", r["lang"]) for r in read_jsonl_gz(LABELLED) if r["label"] == "high"]
        for i, file_docs in enumerate(self.split_files(docs, [], DOCS_FILES, "docs-files")):
            self.write_jsonl_file(f"docs/docs-{i:02d}.jsonl.gz", file_docs)
            self.texts.update((d.url, d.text) for d in file_docs)

    def build(self) -> dict:
        self.build_web()
        self.build_docs()
        truth = self.truth.to_json()
        truth["summary"] = summary(truth, self.texts)
        write_bytes(self.out / "ground_truth.json", (json.dumps(truth, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode())
        return truth


def summary(truth: dict, texts: dict[str, str]) -> dict:
    """Documents, UTF-8 bytes of text and languages, per bucket and per kind (spam, low/* ...)."""
    docs, size, langs = Counter(), Counter(), {}
    for url, entry in truth["documents"].items():
        for key in (entry["bucket"], f"{entry['bucket']}/{entry['kind']}"):
            docs[key] += 1
            size[key] += len(texts[url].encode())
            langs.setdefault(key, set()).add(entry["lang"])
    return {key: {"documents": docs[key], "bytes": size[key], "languages": sorted(x for x in langs[key] if x)}
            for key in sorted(docs)}


def build_crawl(out: Path, seed: int = SEED) -> dict:
    """Write the crawl under `out`; return its ground truth."""
    return CrawlBuilder(out, seed).build()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE.parents[1] / DEFAULT_OUT, help=f"the folder to write (default {DEFAULT_OUT})")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    truth = build_crawl(args.out, args.seed)
    for key, row in truth["summary"].items():
        print(f"{key:<24} {row['documents']:>5} documents {row['bytes'] / 1e6:>6.2f} MB  {' '.join(row['languages'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
