"""Build the ablation crawl (issue 37): real text mixed as a crawl mixes it, for bench/ablations.py
and configs/ablations.yaml. Deterministic: the same seed writes the same bytes.

    python data/ablations/build_crawl.py --out out/ablations-crawl

Four buckets, written into `--out`: two from the committed real-text sets (their origins and
licences: data/labelled/README.md, data/multilingual/README.md), two from what `make install` put on
the machine (nothing is downloaded):

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
- `code/code-00..01.jsonl.gz`: real code, Python source files of the standard library of the
  interpreter that runs the build (`sysconfig`'s `stdlib`; PSF License), 2-40 KB each, tests, IDLE, codec tables,
  tkinter and the like left out, chosen by a hash of their path up to `CODE_BYTES`; `{"url", "text"}`.
- `math/math-00..01.jsonl.gz`: math-heavy technical English, the docstrings (formulas in LaTeX and
  ASCII, doctests) of the installed `mpmath` and `sympy` (both BSD; torch requires them), one document
  per module (its module, class and function docstrings of 200 characters or more, cut at a
  paragraph near `MAX_MATH_CHARS`), modules with at least 2,000 such characters, chosen by a hash of
  their path up to `MATH_BYTES`.
  The same inputs give the same bytes; another Python or sympy release gives other bytes. The tests
  build from `slices/{code,math}.jsonl.gz`, small committed slices of the two made by `--write-slices`,
  so their counts hold on any machine.

`ground_truth.json` lists every document (file, record index, bucket, kind, language), the planted
duplicates and spam (the sample's ground-truth format, data/README.md), and `summary`: documents,
UTF-8 bytes of text and languages per bucket and kind.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.util
import json
import sys
import sysconfig
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
CODE_FILES, MATH_FILES = 2, 2
CODE_BYTES, MATH_BYTES = 1_200_000, 1_200_000
CODE_MIN_BYTES, CODE_MAX_BYTES = 2_000, 40_000
# Parts of the standard library that are not the library's code (tests, demos, the IDE, bundled
# wheels) or are generated (the codecs' tables in encodings/; the build's config-* folder).
CODE_LEFT_OUT = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "encodings",
                 "site-packages", "__pycache__"}
MATH_PACKAGES = ("mpmath", "sympy")
MIN_DOCSTRING_CHARS, MIN_MATH_CHARS, MAX_MATH_CHARS = 200, 2_000, 24_000
SLICES = HERE / "slices"
SLICE_BYTES = 120_000  # each committed slice's cap: a tenth of a bucket, a few files


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def by_hash(paths: list[str]) -> list[str]:
    """`paths` in the order of their blake2b digest: a spread over packages, not the alphabet's first."""
    return sorted(paths, key=lambda p: hashlib.blake2b(p.encode(), digest_size=8).digest())


def up_to(rows: list[dict], cap: int) -> list[dict]:
    """The first rows whose texts together stay within `cap` UTF-8 bytes."""
    kept, size = [], 0
    for row in rows:
        size += len(row["text"].encode())
        if size > cap:
            break
        kept.append(row)
    return kept


def stdlib_code(root: Path, cap: int = CODE_BYTES) -> list[dict]:
    """Source files of the standard library under `root` as `{"url", "text"}` rows (see the module
    docstring); a file that is not UTF-8 is left out."""
    rels = [str(p.relative_to(root)) for p in root.rglob("*.py")
            if not set(p.relative_to(root).parts[:-1]) & CODE_LEFT_OUT and not p.parts[-2].startswith("config-")
            and CODE_MIN_BYTES <= p.stat().st_size <= CODE_MAX_BYTES]
    rows = []
    for rel in by_hash(rels):
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        rows.append({"url": f"https://cpython.example/Lib/{rel}", "text": text})
    return up_to(rows, cap)


def module_docstrings(source: str) -> str:
    """A module's docstrings of MIN_DOCSTRING_CHARS or more, in source order, cut at the last
    paragraph that ends within MAX_MATH_CHARS; "" for a file Python cannot parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    nodes = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))),
                   key=lambda n: getattr(n, "lineno", 0))
    docs = [d for d in (ast.get_docstring(n, clean=True) for n in nodes) if d and len(d) >= MIN_DOCSTRING_CHARS]
    text = "\n\n".join(docs)
    if len(text) > MAX_MATH_CHARS:
        text = text[:text.rfind("\n\n", 0, MAX_MATH_CHARS)]
    return text


def package_root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"build_crawl: the math bucket reads the installed {name!r}, which is not installed (make install)")
    return Path(spec.submodule_search_locations[0])


def math_docstrings(roots: dict[str, Path], cap: int = MATH_BYTES) -> list[dict]:
    """One `{"url", "text"}` row per module of the packages in `roots` (name: folder) with enough
    docstring text (see the module docstring); tests and benchmarks left out."""
    files = {f"{name}/{p.relative_to(root)}": p for name, root in roots.items() for p in root.rglob("*.py")
             if not set(p.relative_to(root).parts[:-1]) & {"tests", "test", "benchmarks"}}
    rows = []
    for rel in by_hash(list(files)):
        text = module_docstrings(files[rel].read_text(encoding="utf-8", errors="replace"))
        if len(text) >= MIN_MATH_CHARS:
            rows.append({"url": f"https://{rel.split('/')[0]}.example/{rel.split('/', 1)[1]}", "text": text})
    return up_to(rows, cap)


def installed_text() -> tuple[list[dict], list[dict]]:
    """The code and math buckets' rows from what is installed on this machine."""
    return (stdlib_code(Path(sysconfig.get_paths()["stdlib"])),
            math_docstrings({name: package_root(name) for name in MATH_PACKAGES}))


def committed_slices() -> tuple[list[dict], list[dict]]:
    return read_jsonl_gz(SLICES / "code.jsonl.gz"), read_jsonl_gz(SLICES / "math.jsonl.gz")


def write_slices() -> None:
    """Write slices/{code,math}.jsonl.gz: the first SLICE_BYTES of each installed bucket."""
    SLICES.mkdir(exist_ok=True)
    for name, rows in zip(("code", "math"), installed_text()):
        body = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in up_to(rows, SLICE_BYTES))
        write_bytes(SLICES / f"{name}.jsonl.gz", gzip.compress(body.encode(), mtime=0))


def crawl_url(url: str) -> str:
    """A page's crawl URL: man:// pages (data/multilingual) become https pages of their own site."""
    return f"https://manpages.example/{url[len('man://'):]}.html" if url.startswith("man://") else url


def web_page(row: dict, kind: str) -> Doc:
    """A page's first line is its title, every other non-blank line a paragraph (one HTML <p>)."""
    lines = [line.strip() for line in row["text"].splitlines() if line.strip()]
    return Doc(crawl_url(row["url"]), lines[0][:200], lines[1:], "web", row["lang"], kind)


class CrawlBuilder(SampleBuilder):
    """Writes the crawl and its ground truth; the sample generator's planting and file layout."""

    def __init__(self, out: Path, seed: int, code: list[dict], math: list[dict]) -> None:
        super().__init__(out, seed)
        self.texts: dict[str, str] = {}  # every written document's text by URL, for the summary
        self.code, self.math = code, math

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

    def build_jsonl_bucket(self, bucket: str, docs: list[Doc], n_files: int) -> None:
        for i, file_docs in enumerate(self.split_files(docs, [], n_files, f"{bucket}-files")):
            self.write_jsonl_file(f"{bucket}/{bucket}-{i:02d}.jsonl.gz", file_docs)
            self.texts.update((d.url, d.text) for d in file_docs)

    def build(self) -> dict:
        self.build_web()
        high = [r for r in read_jsonl_gz(LABELLED) if r["label"] == "high"]
        self.build_jsonl_bucket("docs", [Doc(r["url"], "", [r["text"]], "docs", r["lang"]) for r in high], DOCS_FILES)
        self.build_jsonl_bucket("code", [Doc(r["url"], "", [r["text"]], "code") for r in self.code], CODE_FILES)
        self.build_jsonl_bucket("math", [Doc(r["url"], "", [r["text"]], "math", "en") for r in self.math], MATH_FILES)
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


def build_crawl(out: Path, seed: int = SEED, slices: bool = False) -> dict:
    """Write the crawl under `out`, its code and math buckets from what is installed (`slices`: from
    the committed slices); return its ground truth."""
    code, math = committed_slices() if slices else installed_text()
    return CrawlBuilder(out, seed, code, math).build()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE.parents[1] / DEFAULT_OUT, help=f"the folder to write (default {DEFAULT_OUT})")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--slices", action="store_true", help="the code and math buckets from the committed slices/")
    ap.add_argument("--write-slices", action="store_true", help=f"write {SLICES.name}/ from what is installed; build nothing")
    args = ap.parse_args(argv)
    if args.write_slices:
        write_slices()
        return 0
    truth = build_crawl(args.out, args.seed, args.slices)
    for key, row in truth["summary"].items():
        print(f"{key:<24} {row['documents']:>5} documents {row['bytes'] / 1e6:>6.2f} MB  {' '.join(row['languages'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
