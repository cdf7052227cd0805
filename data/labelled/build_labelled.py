"""Build data/labelled/labelled.jsonl.gz: real high-value and real low-value pages in several
languages, plus synthetic spam, to measure the quality classifier against labels (docs/quality.md).
Run it by hand on a Debian machine, never at run time:

    python data/labelled/build_labelled.py              # downloads the .debs with apt-get download
    python data/labelled/build_labelled.py --debs DIR   # or reads .debs already in DIR

One JSON object a line: {"url", "text", "lang", "label", "kind", "package", "synthetic"}.

- label "high", kind "docs": sections of Debian Reference (debian-reference-*) and of the Debian New
  Maintainers' Guide (maint-guide*), paragraph text only, in the languages below; a section is kept
  when lid.176 reads it as its language at >= MIN_LANGUAGE_SCORE.
- label "low": real low-value text of the kinds a crawl is full of:
  kind "licence" (base-files' /usr/share/common-licenses, cut into pages), "copyright" (the
  packages' debian/copyright files), "changelog" (their changelog.Debian), "catalogue" (the
  packages' gettext catalogues, tar and grep, rendered back as .po text), "wordlist" (pages of the
  w* word lists), "navigation" (the manuals' generated tables of contents, one link a line) and
  "templated" (a download page per package filled from its control fields, the same template for
  every package).
- label "spam", kind "spam/<type>", synthetic true: data/multilingual's spam generator run over
  the high-value pages of each language (url under .example, package null).

None of these packages is used by data/multilingual. Pages are cut to MAX_CHARS at a line boundary
and picked in file-name order, so the output is the same bytes for the same packages.
"""

from __future__ import annotations

import argparse
import gettext
import glob
import gzip
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "multilingual"))

from build_corpus import spam_pages, unpacked, write_jsonl_gz  # noqa: E402
from build_sources import clean, prose_paragraphs  # noqa: E402

from refinery.stages.language import LanguageModel  # noqa: E402

# lid.176 code -> (Debian Reference suffix, maint-guide package or None, gettext locale)
LANGUAGES = {
    "en": ("en", "maint-guide", None),
    "de": ("de", "maint-guide-de", "de"),
    "fr": ("fr", "maint-guide-fr", "fr"),
    "es": ("es", "maint-guide-es", "es"),
    "it": ("it", "maint-guide-it", "it"),
    "ja": ("ja", "maint-guide-ja", "ja"),
    "pt": ("pt", None, "pt"),
    "zh": ("zh-cn", None, "zh_CN"),
    "ru": (None, "maint-guide-ru", "ru"),
}
WORDLISTS = {"en": ("wamerican", "american-english"), "de": ("wngerman", "ngerman"), "fr": ("wfrench", "french"),
             "es": ("wspanish", "spanish"), "it": ("witalian", "italian"), "pt": ("wportuguese", "portuguese")}
CATALOGUE_PACKAGES = ["tar", "grep"]
LICENCE_PACKAGE = "base-files"
MAX_CHARS = 3_000
MIN_SECTION_CHARS = 600
MIN_LANGUAGE_SCORE = 0.65
DOC_PAGES = {"debian-reference": 45, "maint-guide": 25}  # high-value pages per language and manual
WORDLIST_PAGES, WORDS_PER_PAGE = 10, 150
CATALOGUE_ENTRIES = 30  # .po entries a page
SEED = 36


def packages() -> list[str]:
    names = [f"debian-reference-{r}" for r, _, _ in LANGUAGES.values() if r]
    names += [m for _, m, _ in LANGUAGES.values() if m]
    return names + [p for p, _ in WORDLISTS.values()] + CATALOGUE_PACKAGES + [LICENCE_PACKAGE]


def cut(text: str) -> str:
    """`text` cut to MAX_CHARS at the last line break before it."""
    if len(text) <= MAX_CHARS:
        return text
    at = text.rfind("\n", 0, MAX_CHARS)
    return text[: at if at > 0 else MAX_CHARS]


def row(url: str, text: str, lang: str, label: str, kind: str, package: str | None) -> dict:
    return {"url": url, "text": text, "lang": lang, "label": label, "kind": kind, "package": package,
            "synthetic": False}


# ---- high-value: manual sections ----------------------------------------------------------------


def manual_sections(files: list[str]) -> list[tuple[str, str]]:
    """(file#section, paragraphs one a line) of DocBook HTML files, split at their h2/h3 titles."""
    out = []
    for path in files:
        html = Path(path).read_text(encoding="utf-8")
        for i, piece in enumerate(re.split(r'<h[23] class="title"', html)[1:], 1):
            title = clean(piece.split(">", 1)[-1].split("</h", 1)[0])
            text = "\n".join([title, *prose_paragraphs(piece)])
            if len(text) >= MIN_SECTION_CHARS:
                out.append((f"{Path(path).name}#s{i}", cut(text)))
    return out


def high_pages(root: Path, model: LanguageModel) -> list[dict]:
    pages = []
    for lang, (ref, guide, _) in LANGUAGES.items():
        manuals = []
        if ref:
            files = sorted(glob.glob(str(root / f"debian-reference-{ref}/usr/share/debian-reference/ch*.html")))
            manuals.append(("debian-reference", f"debian-reference-{ref}", files))
        if guide:
            files = sorted(f for f in glob.glob(str(root / guide / "usr/share/doc" / guide / "html/*.html"))
                           if not f.endswith(("index.en.html", f"index.{lang}.html")))
            manuals.append(("maint-guide", guide, files))
        for manual, package, files in manuals:
            taken = 0
            for name, text in manual_sections(files):
                if taken == DOC_PAGES[manual]:
                    break
                found, score = model.predict(text)
                if found != lang or score < MIN_LANGUAGE_SCORE:
                    continue
                pages.append(row(f"https://www.debian.org/doc/{manual}/{lang}/{name}", text, lang, "high", "docs",
                                 package))
                taken += 1
    return pages


# ---- low-value ----------------------------------------------------------------------------------


def line_pages(lines: list[str]) -> list[str]:
    """Lines grouped into pages of at most MAX_CHARS."""
    pages, current = [], []
    for line in lines:
        if current and sum(len(x) + 1 for x in current) + len(line) > MAX_CHARS:
            pages.append("\n".join(current))
            current = []
        current.append(line[:MAX_CHARS])
    if current:
        pages.append("\n".join(current))
    return pages


def licence_pages(root: Path) -> list[dict]:
    pages = []
    for path in sorted(glob.glob(str(root / LICENCE_PACKAGE / "usr/share/common-licenses/*"))):
        name = Path(path).name
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        for i, page in enumerate(line_pages([line.rstrip() for line in text.split("\n")])[:3]):
            pages.append(row(f"https://licences.example/{name}/{i}", page, "en", "low", "licence", LICENCE_PACKAGE))
    return pages


def package_file_pages(root: Path, names: list[str]) -> list[dict]:
    """Every package's copyright file and the start of its changelog.Debian."""
    pages = []
    for package in names:
        doc = root / package / "usr/share/doc" / package
        copyright_file = doc / "copyright"
        if copyright_file.is_file():
            text = cut(copyright_file.read_text(encoding="utf-8", errors="replace"))
            pages.append(row(f"https://sources.example/{package}/copyright", text, "en", "low", "copyright", package))
        changelog = doc / "changelog.Debian.gz"
        if changelog.is_file():
            text = cut(gzip.decompress(changelog.read_bytes()).decode("utf-8", "replace"))
            pages.append(row(f"https://sources.example/{package}/changelog", text, "en", "low", "changelog", package))
    return pages


def po_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def catalogue_pages(root: Path) -> list[dict]:
    """Each package's gettext catalogue of each language, read back from its .mo and written as .po
    entries, CATALOGUE_ENTRIES to a page."""
    pages = []
    for package in CATALOGUE_PACKAGES:
        for lang, (_, _, locale) in LANGUAGES.items():
            mo = root / package / "usr/share/locale" / (locale or "") / "LC_MESSAGES" / f"{package}.mo"
            if not locale or not mo.is_file():
                continue
            with open(mo, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
            entries = [(k, v) for k, v in sorted(catalog.items(), key=lambda kv: str(kv[0])) if k and isinstance(k, str)]
            for i in range(0, min(len(entries), 3 * CATALOGUE_ENTRIES), CATALOGUE_ENTRIES):
                text = "\n".join(f'msgid "{po_escape(k)}"\nmsgstr "{po_escape(v)}"\n'
                                 for k, v in entries[i : i + CATALOGUE_ENTRIES])
                pages.append(row(f"https://translations.example/{package}/{locale}.po#{i}", cut(text), lang, "low",
                                 "catalogue", package))
    return pages


def wordlist_pages(root: Path) -> list[dict]:
    rng = random.Random(SEED)
    pages = []
    for lang, (package, name) in WORDLISTS.items():
        words = (root / package / "usr/share/dict" / name).read_text(encoding="utf-8", errors="replace").split("\n")
        words = [w for w in words if w]
        for i in range(WORDLIST_PAGES):
            start = rng.randrange(0, len(words) - WORDS_PER_PAGE)
            text = cut("\n".join(words[start : start + WORDS_PER_PAGE]))
            pages.append(row(f"https://dict.example/{lang}/{start}", text, lang, "low", "wordlist", package))
    return pages


def navigation_pages(root: Path) -> list[dict]:
    """The manuals' generated tables of contents (index pages and each chapter's own), one link a line."""
    pages = []
    for lang, (ref, guide, _) in LANGUAGES.items():
        files = []
        if ref:
            files += [(f"debian-reference-{ref}", p) for p in
                      sorted(glob.glob(str(root / f"debian-reference-{ref}/usr/share/debian-reference/*.html")))]
        if guide:
            files += [(guide, p) for p in sorted(glob.glob(str(root / guide / "usr/share/doc" / guide / "html/*.html")))]
        for package, path in files:
            html = Path(path).read_text(encoding="utf-8")
            toc = re.search(r'<div class="toc">(.*?)</div>\s*(?:<div class="list-of|<div class="(?:chapter|section|preface)"|</div>)', html, re.S)
            if not toc:
                continue
            links = [clean(a) for a in re.findall(r"<a\b[^>]*>(.*?)</a>", toc.group(1), re.S)]
            links = [x for x in links if x]
            if len(links) < 8:
                continue
            text = cut("\n".join(links))
            pages.append(row(f"https://www.debian.org/doc/{package}/{Path(path).name}", text, lang, "low",
                             "navigation", package))
    return pages


TEMPLATE = """Download {Package} {Version}
Home > Packages > {Section} > {Package}
Package: {Package} ({Version}) [{Architecture}]
{Description}
Installed size: {Installed-Size} kB
Maintainer: {Maintainer}
Download {Package} for {Architecture}: choose a mirror near you
Mirror list: ftp.example.org, mirror.example.net, deb.example.com
Related packages: see all packages in section {Section}
Report a bug in {Package} | View the changelog of {Package} | View the copyright of {Package}
Copyright 1997 - 2024 Packages. All rights reserved. Contact us | Privacy policy | Terms of use"""


def templated_pages(debs: Path) -> list[dict]:
    """A package download page from one template per .deb, filled from its control fields."""
    pages = []
    for deb in sorted(debs.glob("*.deb")):
        fields = {}
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True).stdout.decode()
        for line in control.split("\n"):
            if ":" in line and not line.startswith(" "):
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        fields.setdefault("Section", "misc")
        fields.setdefault("Installed-Size", "0")
        text = TEMPLATE.format_map(fields)
        pages.append(row(f"https://packages.example/{fields['Package']}", text, "en", "low", "templated",
                         fields["Package"]))
    return pages


# ---- output -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--debs", type=Path, help="folder of already downloaded .debs (default: apt-get download)")
    parser.add_argument("--out", type=Path, default=HERE / "labelled.jsonl.gz")
    args = parser.parse_args()
    names = packages()
    with tempfile.TemporaryDirectory() as tmp:
        root, versions = unpacked(names, args.debs, Path(tmp))
        high = high_pages(root, LanguageModel())
        low = (licence_pages(root) + package_file_pages(root, names) + catalogue_pages(root) + wordlist_pages(root)
               + navigation_pages(root) + templated_pages(args.debs or Path(tmp) / "debs"))
    spam = [{**page, "label": "spam", "synthetic": True} for page in spam_pages(high, SEED)]
    write_with_sources(args.out, high + low + spam, {p: versions[p] for p in names}, SEED)
    return 0


def write_with_sources(out: Path, rows: list[dict], versions: dict[str, str], seed: int) -> None:
    """`rows` to `out`, and SOURCES.json beside it: the packages' versions, pages per language and
    label, the seed; prints the page counts."""
    write_jsonl_gz(out, rows)
    counts: dict[str, dict[str, int]] = {}
    for r in rows:
        counts.setdefault(r["lang"], {}).setdefault(r["label"], 0)
        counts[r["lang"]][r["label"]] += 1
    sources = {"packages": versions, "pages": dict(sorted(counts.items())), "seed": seed}
    (out.parent / "SOURCES.json").write_text(json.dumps(sources, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(sources["pages"]))


if __name__ == "__main__":
    sys.exit(main())
