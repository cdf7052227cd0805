"""Build data/heuristic_docs/docs.jsonl.gz: real documentation pages, whole (code samples, option
lists, commands and all), in many languages, and real low-value pages beside them, to measure what
the heuristics keep and remove per language (bench/heuristic_docs.py, docs/languages.md). Run it by
hand on a Debian machine, never at run time:

    python data/heuristic_docs/build_docs.py              # downloads the .debs with apt-get download
    python data/heuristic_docs/build_docs.py --debs DIR   # or reads .debs already in DIR

One JSON object a line: {"url", "text", "lang", "label", "kind", "package"}.

- label "clean": pages as a crawler's extraction gives them, not paragraphs picked out of them.
  kind "docs": the HTML chapters and sections of the Debian Administrator's Handbook (26
  languages), the Debian Developer's Reference, the Debian FAQ, the Securing Debian Manual, the
  Python 3.11 library reference, tutorial and howtos, and git's manuals, extracted with
  `refinery.stages.html.main_content_text` (the pipeline's extractor); kind "manpage": section 1
  man pages of the manpages-XX translations, rendered by man(1) as data/multilingual does. A page
  is kept when lid.176 reads at least half of its characters in lines of 60 or more characters as
  the package's language (at any score), so an untranslated page does not count for a language;
  the score itself is left for language ID to judge.
- label "low": real low-value pages. kind "index": generated pages (the handbook's tables of
  contents, Python's general and module indexes); "wordlist": runs of the w* word lists of
  languages data/labelled has none for; "catalogue": coreutils' gettext catalogues rendered as
  .po text; "changelog" and "copyright": the doc packages' own debian files.

data/labelled's low and spam pages (licences, copyright files, changelogs, catalogues, word lists,
tables of contents, templated pages, planted spam) are the rest of the junk the bench reads. None of
these packages is in data/multilingual, whose pages the heuristic thresholds were first calibrated
on. A page is at most MAX_CHARS, cut at a line break; pages are sampled with SEED in file-name order,
so the output is the same bytes for the same packages.
"""

from __future__ import annotations

import argparse
import gettext
import glob
import gzip
import json
import random
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent / "multilingual"))
sys.path.insert(0, str(HERE.parent / "labelled"))

from build_corpus import man_text, unpacked  # noqa: E402
from build_labelled import write_with_sources  # noqa: E402

from refinery.stages.html import main_content_text  # noqa: E402
from refinery.stages.language import LanguageModel  # noqa: E402

MAX_CHARS = 5_000
MIN_PAGE_CHARS = 800
PAGES_PER_SOURCE = 8  # clean pages per language and manual
LOW_PAGES = 4  # low-value pages per language and kind
PROSE_LINE_CHARS = 60
SEED = 47

# Handbook folder -> lid.176 code (lid.176 reads Norwegian Bokmål as "no").
HANDBOOK = {"ar-MA": "ar", "ca-ES": "ca", "cs-CZ": "cs", "da-DK": "da", "de-DE": "de", "el-GR": "el",
            "en-US": "en", "es-ES": "es", "fa-IR": "fa", "fr-FR": "fr", "hr-HR": "hr", "id-ID": "id",
            "it-IT": "it", "ja-JP": "ja", "ko-KR": "ko", "nb-NO": "no", "nl-NL": "nl", "pl-PL": "pl",
            "pt-BR": "pt", "ro-RO": "ro", "ru-RU": "ru", "sv-SE": "sv", "tr-TR": "tr", "vi-VN": "vi",
            "zh-CN": "zh", "zh-TW": "zh"}
HARDEN = {"de-DE": "de", "en-US": "en", "es-ES": "es", "fr-FR": "fr", "it-IT": "it", "ja-JP": "ja",
          "pt-BR": "pt", "zh-CN": "zh"}
DEVREF = {"": "en", "de": "de", "fr": "fr", "it": "it", "ja": "ja", "ru": "ru"}
FAQ = {"": "en", "de": "de", "fr": "fr", "it": "it", "zh-cn": "zh"}
MANPAGES = {"de": "de", "fr": "fr", "ja": "ja", "ru": "ru", "es": "es", "pl": "pl", "it": "it", "nl": "nl",
            "pt-br": "pt", "uk": "uk", "da": "da", "fi": "fi", "sv": "sv", "cs": "cs"}
WORDLISTS = {"nl": ("wdutch", "dutch"), "pl": ("wpolish", "polish"), "sv": ("wswedish", "swedish"),
             "da": ("wdanish", "danish"), "no": ("wnorwegian", "bokmaal"), "uk": ("wukrainian", "ukrainian")}
CATALOGUE_LOCALES = {"cs": "cs", "da": "da", "de": "de", "el": "el", "es": "es", "fi": "fi", "fr": "fr", "id": "id",
                     "it": "it", "ja": "ja", "ko": "ko", "nb": "no", "nl": "nl", "pl": "pl", "pt_BR": "pt",
                     "ro": "ro", "ru": "ru", "sv": "sv", "tr": "tr", "uk": "uk", "vi": "vi", "zh_CN": "zh"}
NOT_CHAPTERS = ("index.html", "search.html", "genindex", "py-modindex", "contents.html")
DOC_PACKAGES = ["debian-handbook", "harden-doc", "python3.11-doc", "git-doc", "debian-faq",
                *(f"developers-reference-{d}" if d else "developers-reference" for d in DEVREF),
                *(f"debian-faq-{d}" for d in FAQ if d)]


def packages() -> list[str]:
    return [*DOC_PACKAGES, *(f"manpages-{m}" for m in MANPAGES), *(p for p, _ in WORDLISTS.values()), "coreutils"]


def cut(text: str) -> str:
    """`text` cut to MAX_CHARS at the last line break before it."""
    if len(text) <= MAX_CHARS:
        return text
    at = text.rfind("\n", 0, MAX_CHARS)
    return text[: at if at > 0 else MAX_CHARS]


def windows(text: str) -> list[str]:
    """`text` in consecutive pieces of at most MAX_CHARS, each cut at a line break."""
    out = []
    while len(text) >= MIN_PAGE_CHARS:
        piece = cut(text)
        out.append(piece)
        text = text[len(piece):].lstrip("\n")
    return out


def row(url: str, text: str, lang: str, label: str, kind: str, package: str) -> dict:
    return {"url": url, "text": text, "lang": lang, "label": label, "kind": kind, "package": package}


def in_language(model: LanguageModel, text: str, lang: str) -> bool:
    """Whether lid.176 reads at least half the characters of `text`'s long lines as `lang`."""
    lines = [line for line in text.split("\n") if len(line.strip()) >= PROSE_LINE_CHARS]
    total = sum(map(len, lines))
    return total > 0 and sum(len(line) for line in lines if model.predict(line)[0] == lang) * 2 >= total


def sampled(pages: list[dict], n: int, rng: random.Random) -> list[dict]:
    return pages if len(pages) <= n else [pages[i] for i in sorted(rng.sample(range(len(pages)), n))]


def html_manual(model: LanguageModel, rng: random.Random, package: str, files: list[str], lang: str,
                url: str) -> list[dict]:
    """Up to PAGES_PER_SOURCE pages of one manual in one language: each chapter's extracted text in
    MAX_CHARS pieces."""
    pages = []
    for path in files:
        if Path(path).name.startswith(NOT_CHAPTERS):
            continue
        text = main_content_text(Path(path).read_text(encoding="utf-8", errors="replace"))
        for i, piece in enumerate(windows(text)):
            if in_language(model, piece, lang):
                pages.append(row(f"{url}/{Path(path).name}#{i}", piece, lang, "clean", "docs", package))
    return sampled(pages, PAGES_PER_SOURCE, rng)


def clean_pages(root: Path, model: LanguageModel, rng: random.Random) -> list[dict]:
    pages = []
    share = "usr/share/doc"
    for folder, lang in HANDBOOK.items():
        files = sorted(glob.glob(str(root / "debian-handbook" / share / "debian-handbook/html" / folder / "*.html")))
        pages += html_manual(model, rng, "debian-handbook", files, lang, f"https://debian-handbook.info/{folder}")
    for folder, lang in HARDEN.items():
        files = sorted(glob.glob(str(root / "harden-doc" / share / "harden-doc/html" / folder / "*.html")))
        pages += html_manual(model, rng, "harden-doc", files, lang, f"https://www.debian.org/doc/harden/{folder}")
    for folder, lang in DEVREF.items():
        package = f"developers-reference-{folder}" if folder else "developers-reference"
        files = sorted(glob.glob(str(root / package / "usr/share/developers-reference" / folder / "*.html")))
        pages += html_manual(model, rng, package, files, lang, f"https://www.debian.org/doc/devref/{lang}")
    for folder, lang in FAQ.items():
        package = f"debian-faq-{folder}" if folder else "debian-faq"
        files = sorted(glob.glob(str(root / package / share / "debian/FAQ" / folder / "*.html")))
        pages += html_manual(model, rng, package, files, lang, f"https://www.debian.org/doc/faq/{lang}")
    python = root / "python3.11-doc" / share / "python3.11/html"
    for part in ("library", "tutorial", "howto"):
        files = sorted(glob.glob(str(python / part / "*.html")))
        pages += html_manual(model, rng, "python3.11-doc", files, "en", f"https://docs.python.org/3.11/{part}")
    files = sorted(glob.glob(str(root / "git-doc" / share / "git-doc/git-*.html")))
    pages += html_manual(model, rng, "git-doc", files, "en", "https://git-scm.com/docs")
    for folder, lang in MANPAGES.items():
        package = f"manpages-{folder}"
        found = []
        for path in sorted(glob.glob(str(root / package / "usr/share/man/*/man1/*"))):
            text = cut(man_text(path))
            if len(text) >= MIN_PAGE_CHARS and in_language(model, text, lang):
                found.append(row(f"https://manpages.debian.org/{folder}/{Path(path).name}", text, lang, "clean",
                                 "manpage", package))
        pages += sampled(found, 2 * PAGES_PER_SOURCE, rng)
    return pages


def index_pages(root: Path, rng: random.Random) -> list[dict]:
    """Generated pages: the handbook's table of contents per language, Python's indexes."""
    pages = []
    for folder, lang in HANDBOOK.items():
        path = root / "debian-handbook/usr/share/doc/debian-handbook/html" / folder / "index.html"
        for i, piece in enumerate(windows(main_content_text(path.read_text(encoding="utf-8")))[:2]):
            pages.append(row(f"https://debian-handbook.info/{folder}/index.html#{i}", piece, lang, "low", "index",
                             "debian-handbook"))
    python = root / "python3.11-doc/usr/share/doc/python3.11/html"
    found = []
    for path in sorted(python.glob("genindex-*.html")) + [python / "py-modindex.html"]:
        text = main_content_text(path.read_text(encoding="utf-8"))
        found += [row(f"https://docs.python.org/3.11/{path.name}#{i}", piece, "en", "low", "index", "python3.11-doc")
                  for i, piece in enumerate(windows(text))]
    return pages + sampled(found, 2 * LOW_PAGES, rng)


def wordlist_pages(root: Path, rng: random.Random) -> list[dict]:
    pages = []
    for lang, (package, name) in WORDLISTS.items():
        raw = (root / package / "usr/share/dict" / name).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")  # wdanish's list is Latin-1
        words = [w for w in text.split("\n") if w]
        for _ in range(LOW_PAGES):
            start = rng.randrange(0, len(words) - 400)
            pages.append(row(f"https://dict.example/{lang}/{start}", cut("\n".join(words[start:start + 400])), lang,
                             "low", "wordlist", package))
    return pages


def catalogue_pages(root: Path) -> list[dict]:
    pages = []
    for locale, lang in CATALOGUE_LOCALES.items():
        with open(root / "coreutils/usr/share/locale" / locale / "LC_MESSAGES/coreutils.mo", "rb") as f:
            catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
        entries = sorted((k, v) for k, v in catalog.items() if isinstance(k, str) and k)
        text = "\n".join(f"msgid {json.dumps(k, ensure_ascii=False)}\nmsgstr {json.dumps(v, ensure_ascii=False)}\n"
                         for k, v in entries[200:260])
        pages.append(row(f"https://translations.example/coreutils/{locale}.po", cut(text), lang, "low", "catalogue",
                         "coreutils"))
    return pages


def package_file_pages(root: Path) -> list[dict]:
    pages = []
    for package in DOC_PACKAGES:
        doc = root / package / "usr/share/doc" / package
        if (doc / "copyright").is_file():
            pages.append(row(f"https://sources.example/{package}/copyright", cut((doc / "copyright").read_text(
                encoding="utf-8", errors="replace")), "en", "low", "copyright", package))
        if (doc / "changelog.Debian.gz").is_file():
            text = gzip.decompress((doc / "changelog.Debian.gz").read_bytes()).decode("utf-8", "replace")
            pages.append(row(f"https://sources.example/{package}/changelog", cut(text), "en", "low", "changelog",
                             package))
    return pages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--debs", type=Path, help="folder of already downloaded .debs (default: apt-get download)")
    parser.add_argument("--out", type=Path, default=HERE / "docs.jsonl.gz")
    args = parser.parse_args()
    names = packages()
    rng = random.Random(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        root, versions = unpacked(names, args.debs, Path(tmp))
        rows = clean_pages(root, LanguageModel(), rng)
        rows += index_pages(root, rng) + wordlist_pages(root, rng) + catalogue_pages(root) + package_file_pages(root)
    write_with_sources(args.out, rows, {p: versions[p] for p in names}, SEED)
    return 0


if __name__ == "__main__":
    sys.exit(main())
