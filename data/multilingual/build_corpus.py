"""Build data/multilingual/: clean documentation pages in ten languages from Debian packages, plus
planted spam pages from a seeded generator. Run it on a Debian machine with `man` and `groff`:

    python data/multilingual/build_corpus.py              # downloads the .debs with apt-get download
    python data/multilingual/build_corpus.py --debs DIR   # or reads .debs already in DIR

Clean pages come from two kinds of translated documentation (never the Debian handbook,
installation guide or Debian Reference, which an independent check uses):

- gnome-user-docs: the GNOME help (Mallard XML pages), translated per language;
- manpages-l10n (manpages-ro, manpages-el) and manpages-zh: translated man pages, rendered with
  `man -l` at a very wide MANWIDTH so that each paragraph is one line, as HTML extraction gives it;
  the English originals of the Romanian man pages come from the packages that ship them.

A page is taken only when its English original holds at least MIN_SOURCE_WORDS words (so every
language gets the same kind of page, whatever its script), and a translated page only when lid.176
(refinery/stages/language.py) reads it as its language at >= 0.65: GNOME ships half-translated pages
with English paragraphs left in. Pages are picked in name order, up to PAGES_PER_LANGUAGE per
language and source.

Writes clean.jsonl.gz and spam.jsonl.gz ({"url", "text", "lang", "kind", "package"}) and
SOURCES.json (every package with its version and licence), atomically.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from refinery.stages.language import LanguageModel  # noqa: E402

# gnome-user-docs help folders and the ISO code lid.176 reports for them.
GNOME_LANGUAGES = {"C": "en", "de": "de", "fr": "fr", "es": "es", "ru": "ru", "el": "el", "ja": "ja", "ko": "ko",
                   "zh_CN": "zh", "ro": "ro"}
# Man pages: (package, folder under usr/share/man, language).
MAN_TRANSLATIONS = [("manpages-ro", "ro", "ro"), ("manpages-el", "el", "el"), ("manpages-zh", "zh_CN", "zh")]
# Packages shipping the English originals of the translated man pages picked.
MAN_ORIGINALS = ["coreutils", "diffutils", "sed", "nano", "flex", "wdiff", "manpages"]
LICENCES = {
    "gnome-user-docs": "CC-BY-SA-3.0",
    "manpages-ro": "GPL-3+ (translations); originals under their own free licences",
    "manpages-el": "GPL-3+ (translations); originals under their own free licences",
    "manpages-zh": "GFDL-1.2+ / the licences of the originals (debian/copyright)",
    "coreutils": "GPL-3+",
    "diffutils": "GPL-3+",
    "sed": "GPL-3+",
    "nano": "GPL-3+",
    "flex": "BSD-2-clause (flex)",
    "wdiff": "GPL-3+",
    "manpages": "various free licences (Linux man-pages project; debian/copyright)",
}
PAGES_PER_LANGUAGE = 40
MIN_SOURCE_WORDS = 120
MAX_CHARS = 12_000
MIN_LANGUAGE_SCORE = 0.65
SEED = 11
SPAM_PER_LANGUAGE = 12


# ---- reading packages ---------------------------------------------------------------------------


def fetch_debs(packages: list[str], dest: Path) -> None:
    subprocess.run(["apt-get", "download", *packages], cwd=dest, check=True, capture_output=True)


def unpacked(packages: list[str], debs: Path | None, tmp: Path) -> tuple[Path, dict[str, str]]:
    """`packages` unpacked under `tmp`/root, from the .debs in `debs` (None: apt-get download them
    into `tmp`/debs); returns that root and package -> version. Exits naming any .deb missing."""
    if debs is None:
        debs = tmp / "debs"
        debs.mkdir()
        fetch_debs(packages, debs)
    root = tmp / "root"
    root.mkdir()
    versions = unpack(debs, root)
    missing = [p for p in packages if p not in versions]
    if missing:
        raise SystemExit(f"missing .debs for {missing}; apt-get download them into {debs}")
    return root, versions


def unpack(debs: Path, out: Path) -> dict[str, str]:
    """Unpack every .deb; returns package -> version."""
    versions = {}
    for deb in sorted(debs.glob("*.deb")):
        package, version = deb.name.split("_")[:2]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(out / package)], check=True)
        versions[package] = version.replace("%3a", ":")
    return versions


_MALLARD_BLOCKS = {"title", "p", "code", "screen"}


def mallard_text(path: str) -> str:
    """A Mallard page's titles, paragraphs and code blocks, one per line; the <info> header is skipped."""
    lines: list[str] = []

    def walk(el: ET.Element) -> None:
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "info":
            return
        if tag in _MALLARD_BLOCKS:
            text = "".join(el.itertext())
            if tag in ("code", "screen"):
                lines.extend(line.rstrip() for line in text.strip("\n").split("\n") if line.strip())
            elif text.strip():
                lines.append(re.sub(r"\s+", " ", text).strip())
            return
        for child in el:
            walk(child)

    walk(ET.parse(path).getroot())
    return "\n".join(lines)


def man_text(path: str) -> str:
    """A man page rendered by man(1) at a wide width (a paragraph per line), without the running
    header and footer, indentation removed."""
    env = {**os.environ, "MANWIDTH": "4000", "MAN_KEEP_FORMATTING": "0", "LC_ALL": "C.UTF-8"}
    out = subprocess.run(["man", "--nj", "--nh", "-E", "UTF-8", "-l", path], env=env, check=True,
                         capture_output=True).stdout.decode("utf-8", "replace")
    out = subprocess.run(["col", "-b", "-x"], input=out.encode(), check=True, capture_output=True).stdout.decode()
    lines = [re.sub(r"[ \t]+", " ", line).strip() for line in out.split("\n")]
    lines = [line for line in lines if line][1:-1]  # the running header and footer
    return "\n".join(lines)


def words(text: str) -> int:
    return len(text.split())


# ---- clean pages --------------------------------------------------------------------------------


def gnome_pages(root: Path, model: LanguageModel) -> list[dict]:
    help_dir = root / "gnome-user-docs" / "usr" / "share" / "help"
    pages = []
    originals = sorted(glob.glob(str(help_dir / "C" / "gnome-help" / "*.page")))
    wanted = [p for p in originals if words(mallard_text(p)) >= MIN_SOURCE_WORDS]
    for folder, lang in GNOME_LANGUAGES.items():
        taken = 0
        for original in wanted:
            path = original.replace("/C/", f"/{folder}/")
            if taken == PAGES_PER_LANGUAGE or not os.path.isfile(path):
                continue
            text = mallard_text(path)[:MAX_CHARS]
            found, score = model.predict(text)
            if found != lang or score < MIN_LANGUAGE_SCORE:
                continue
            name = Path(path).stem
            pages.append({"url": f"https://help.gnome.org/users/gnome-help/{folder}/{name}", "text": text,
                          "lang": lang, "kind": "clean", "package": "gnome-user-docs"})
            taken += 1
    return pages


def man_pages(root: Path, model: LanguageModel) -> list[dict]:
    pages = []
    originals = {Path(p).name: p for pkg in MAN_ORIGINALS
                 for p in glob.glob(str(root / pkg / "usr" / "share" / "man" / "man*" / "*.gz"))}
    english_wanted: list[str] = []
    for package, folder, lang in MAN_TRANSLATIONS:
        taken = 0
        for path in sorted(glob.glob(str(root / package / "usr" / "share" / "man" / folder / "man*" / "*.gz"))):
            if taken == PAGES_PER_LANGUAGE:
                break
            name = Path(path).name
            original = originals.get(name)
            text = man_text(path)
            # Without an English original at hand, a length in characters stands in for its words.
            if (words(man_text(original)) if original else len(text) // 6) < MIN_SOURCE_WORDS:
                continue
            if len(text) > MAX_CHARS:  # long pages are cut at a line boundary
                text = text[: text.rfind("\n", 0, MAX_CHARS)]
            found, score = model.predict(text)
            if found != lang or score < MIN_LANGUAGE_SCORE:
                continue
            pages.append({"url": f"man://{folder}/{name.removesuffix('.gz')}", "text": text, "lang": lang,
                          "kind": "clean", "package": package})
            taken += 1
            if package == "manpages-ro" and original:
                english_wanted.append(original)
    for path in english_wanted:
        text = man_text(path)
        if len(text) > MAX_CHARS:
            text = text[: text.rfind("\n", 0, MAX_CHARS)]
        package = Path(path).parts[len(root.parts)]
        pages.append({"url": f"man://en/{Path(path).name.removesuffix('.gz')}", "text": text, "lang": "en",
                      "kind": "clean", "package": package})
    return pages


# ---- planted spam -------------------------------------------------------------------------------


def spam_pages(clean: list[dict], seed: int = SEED) -> list[dict]:
    """Spam in every language of the clean pages, made from that language's own words and lines so
    that language ID still reads it as the language: keyword stuffing, one line repeated, a link
    list of one-to-three-word lines, one paragraph pasted over and over, and a page of
    boilerplate lines each repeated."""
    rng = random.Random(seed)
    by_lang: dict[str, list[dict]] = {}
    for page in clean:
        by_lang.setdefault(page["lang"], []).append(page)
    spam = []
    for lang in sorted(by_lang):
        pages = by_lang[lang]
        lines = [line for page in pages for line in page["text"].split("\n") if 40 <= len(line) <= 300]
        tokens = [w for line in lines for w in line.split() if len(w) > 1]
        for i in range(SPAM_PER_LANGUAGE):
            kind = ("keyword_stuffing", "repeated_line", "link_list", "repeated_paragraph", "boilerplate")[i % 5]
            if kind == "keyword_stuffing":
                keywords = rng.sample(tokens, 4)
                body = [" ".join(rng.choice(keywords) for _ in range(12)) for _ in range(25)]
            elif kind == "repeated_line":
                line = rng.choice(lines)
                body = [line] * rng.randint(15, 30)
            elif kind == "link_list":
                # Menu items are short whatever the script: each token is cut to eight characters.
                body = [" ".join(w[:8] for w in rng.sample(tokens, rng.randint(1, 3)))
                        for _ in range(rng.randint(40, 70))]
            elif kind == "repeated_paragraph":
                paragraph = "\n".join(rng.sample(lines, 3))
                body = [paragraph] * rng.randint(6, 10)
            else:
                block = rng.sample(lines, 4)
                body = [line for _ in range(rng.randint(5, 8)) for line in block]
            spam.append({"url": f"https://spam-{lang}-{i}.example/{kind}", "text": "\n".join(body), "lang": lang,
                         "kind": f"spam/{kind}", "package": None})
    return spam


# ---- output -------------------------------------------------------------------------------------


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    # mtime 0 keeps the gzip bytes the same for the same rows.
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        for row in rows:
            out.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--debs", type=Path, help="folder of already downloaded .debs (default: apt-get download)")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    packages = ["gnome-user-docs", *(p for p, _, _ in MAN_TRANSLATIONS), *MAN_ORIGINALS]
    with tempfile.TemporaryDirectory() as tmp:
        root, versions = unpacked(packages, args.debs, Path(tmp))
        model = LanguageModel()
        clean = gnome_pages(root, model) + man_pages(root, model)
    spam = spam_pages(clean)
    write_jsonl_gz(args.out / "clean.jsonl.gz", clean)
    write_jsonl_gz(args.out / "spam.jsonl.gz", spam)
    counts: dict[str, int] = {}
    for page in clean:
        counts[page["lang"]] = counts.get(page["lang"], 0) + 1
    sources = {
        "packages": {p: {"version": versions[p], "licence": LICENCES[p]} for p in packages},
        "clean_pages_per_language": dict(sorted(counts.items())),
        "spam_pages": len(spam),
        "seed": SEED,
    }
    tmp_path = args.out / "SOURCES.json.tmp"
    tmp_path.write_text(json.dumps(sources, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp_path, args.out / "SOURCES.json")
    print(json.dumps(sources["clean_pages_per_language"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
