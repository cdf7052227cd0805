"""Rebuild data/source/*.jsonl.gz, the real text the sample generator draws from.

Run once by hand, never by the pipeline: it needs the Debian packages listed in data/README.md
unpacked under one folder, plus a CPython source tree for the code bucket:

    mkdir -p /tmp/debs && cd /tmp/debs && apt-get download debian-reference-{en,de,fr,es,it,pt,ja} \
        debian-handbook python-mpmath-doc python3.11-doc
    for f in *.deb; do mkdir -p x/${f%%_*}; dpkg-deb -x $f x/${f%%_*}; done
    python data/build_sources.py --debs /tmp/debs/x --cpython-lib /root/.pyenv/versions/3.11.7/lib/python3.11

Only paragraph text is kept (<p> elements, plus display math and examples for mpmath); tables,
shell listings and navigation are left out so the clean documents read as prose.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import os
import re
from pathlib import Path

WEB_LANGS = {"en": 200, "de": 6, "fr": 6, "es": 6, "it": 6, "pt": 6, "ja": 6}  # sections kept per language
HANDBOOK_LANGS = {"en-US": ("en", 12), "fr-FR": ("fr", 2)}  # chapters kept per language
WIKI_DIRS = ("tutorial", "howto", "faq")
MIN_PARAGRAPH_WORDS = 6
MIN_SECTION_WORDS = 250
MIN_WEB_SECTION_WORDS = 150
CODE_FILES = 70
CODE_MIN_BYTES, CODE_MAX_BYTES = 3_000, 25_000

_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")
# DocBook HTML puts paragraphs in <p>; Publican (the handbook) in <div class="para">.
_P = re.compile(r"<p\b[^>]*>(.*?)</p>|<div class=\"para\">(.*?)</div>", re.S)


def clean(fragment: str) -> str:
    return _SPACE.sub(" ", html.unescape(_TAG.sub("", fragment))).strip()


def word_count(text: str) -> int:
    # Japanese has no spaces; count characters / 2 there so sections are comparable in size
    n = len(text.split())
    return max(n, len(text) // 2) if n < len(text) // 20 else n


def prose_paragraphs(fragment: str) -> list[str]:
    out = []
    for m in _P.finditer(fragment):
        text = clean(m.group(1) or m.group(2) or "")
        if "{" in text or "}" in text or word_count(text) < MIN_PARAGRAPH_WORDS:
            continue
        out.append(text)
    return out


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode()
    with open(path, "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"{path}: {len(rows)} records, {len(data)} bytes raw, {path.stat().st_size} gz")


def debian_reference(debs: Path) -> list[dict]:
    rows = []
    for lang, keep in WEB_LANGS.items():
        folder = debs / f"debian-reference-{lang}" / "usr/share/debian-reference"
        kept = 0
        for chapter in sorted(folder.glob(f"ch*.{lang}.html")):
            text = chapter.read_text(encoding="utf-8")
            pieces = re.split(r'<h3 class="title">', text)
            for i, piece in enumerate(pieces[1:], 1):
                title = clean(piece.split("</h3>", 1)[0])
                paragraphs = prose_paragraphs(piece)
                if sum(word_count(p) for p in paragraphs) < MIN_WEB_SECTION_WORDS or kept >= keep:
                    continue
                kept += 1
                rows.append(
                    {
                        "origin": f"debian-reference-{lang} 2.100 {chapter.name} section {i}",
                        "lang": lang,
                        "title": title,
                        "paragraphs": paragraphs,
                    }
                )
    return rows


def handbook(debs: Path) -> list[dict]:
    rows = []
    root = debs / "debian-handbook/usr/share/doc/debian-handbook/html"
    for folder, (lang, keep) in HANDBOOK_LANGS.items():
        index = (root / folder / "index.html").read_text(encoding="utf-8")
        order = list(dict.fromkeys(re.findall(r'href="([a-z][\w.-]*\.html)(?:#[^"]*)?"', index)))
        chapters: list[list[str]] = []
        for name in order:
            if not (root / folder / name).is_file() or name == "index.html":
                continue
            if not name.startswith("sect.") or not chapters:
                chapters.append([])
            chapters[-1].append(name)
        for files in chapters:
            paragraphs = []
            for name in files:
                paragraphs += prose_paragraphs((root / folder / name).read_text(encoding="utf-8"))
            if sum(word_count(p) for p in paragraphs) < 3000 or len([r for r in rows if r["lang"] == lang]) >= keep:
                continue
            title = clean(re.search(r"<title[^>]*>(.*?)</title>", (root / folder / files[0]).read_text(encoding="utf-8"), re.S).group(1))
            rows.append(
                {
                    "origin": f"debian-handbook 11.20220922 html/{folder}/{files[0]} (+{len(files) - 1} sections)",
                    "lang": lang,
                    "title": title,
                    "paragraphs": paragraphs,
                }
            )
    return rows


def python_docs(debs: Path) -> list[dict]:
    rows = []
    root = debs / "python3.11-doc/usr/share/doc/python3.11/html"
    for sub in WIKI_DIRS:
        for page in sorted((root / sub).glob("*.html")):
            text = page.read_text(encoding="utf-8")
            paragraphs = prose_paragraphs(text)
            if sum(word_count(p) for p in paragraphs) < MIN_SECTION_WORDS:
                continue
            title = clean(re.search(r"<h1>(.*?)</h1>", text, re.S).group(1)).rstrip("¶")
            rows.append(
                {
                    "origin": f"python3.11-doc 3.11.2-6+deb12u9 html/{sub}/{page.name}",
                    "lang": "en",
                    "title": title,
                    "paragraphs": paragraphs,
                }
            )
    return rows


_MATH_BLOCK = re.compile(
    r'<p\b[^>]*>(?P<p>.*?)</p>|<div class="math[^"]*"[^>]*>(?P<m>.*?)</div>|<pre\b[^>]*>(?P<pre>.*?)</pre>', re.S
)


def mpmath_docs(debs: Path) -> list[dict]:
    """mpmath's function reference keeps its formulas as LaTeX (MathJax), so the text has real math."""
    rows = []
    root = debs / "python-mpmath-doc/usr/share/doc/python-mpmath-doc/html"
    pages = sorted(root.glob("*.html")) + sorted(root.glob("*/*.html"))
    for page in pages:
        text = page.read_text(encoding="utf-8")
        blocks = []
        for m in _MATH_BLOCK.finditer(text):
            if m.group("pre") is not None:
                block = html.unescape(_TAG.sub("", m.group("pre"))).strip()
            else:
                block = clean(m.group("p") or m.group("m"))
            if block:
                blocks.append(block)
        if sum(len(b.split()) for b in blocks) < MIN_SECTION_WORDS or "genindex" in page.name:
            continue
        title = clean(re.search(r"<h1>(.*?)</h1>", text, re.S).group(1)).rstrip("¶") if "<h1>" in text else page.stem
        rows.append(
            {
                "origin": f"python-mpmath-doc 1.2.1-2 html/{page.relative_to(root)}",
                "lang": "en",
                "title": title,
                "paragraphs": blocks,
            }
        )
    return rows


def cpython_code(lib: Path) -> list[dict]:
    candidates = sorted(
        p for p in lib.glob("*.py") if CODE_MIN_BYTES <= p.stat().st_size <= CODE_MAX_BYTES
    )
    step = max(1, len(candidates) // CODE_FILES)
    rows = []
    for p in candidates[::step][:CODE_FILES]:
        rows.append({"origin": f"CPython 3.11.7 Lib/{p.name}", "path": f"Lib/{p.name}", "text": p.read_text(encoding="utf-8")})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--debs", type=Path, required=True, help="folder with the unpacked Debian packages")
    ap.add_argument("--cpython-lib", type=Path, required=True, help="a CPython 3.11 Lib folder")
    ap.add_argument("--out", type=Path, default=Path(os.path.dirname(__file__)) / "source")
    args = ap.parse_args()
    write_jsonl_gz(args.out / "web.jsonl.gz", debian_reference(args.debs))
    write_jsonl_gz(args.out / "books.jsonl.gz", handbook(args.debs))
    write_jsonl_gz(args.out / "wiki.jsonl.gz", python_docs(args.debs))
    write_jsonl_gz(args.out / "math.jsonl.gz", mpmath_docs(args.debs))
    write_jsonl_gz(args.out / "code.jsonl.gz", cpython_code(args.cpython_lib))


if __name__ == "__main__":
    main()
