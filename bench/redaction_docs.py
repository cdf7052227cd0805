"""PII redaction and the broken-text rule on real documentation, per language, this code against
the code of a git revision (the baseline), in the same run.

- ip: `<IP_ADDRESS>` replacements in each language's pages (the Debian Administrator's Handbook
  and the Debian installation guide, HTML as Debian ships it, text by resiliparse). These pages hold
  no personal data: every replacement is a section, version or figure number, or an example
  address; the documentation ranges (RFC 5737, RFC 3849) are counted apart.
- broken: per language, pages the broken-text rule catches once their UTF-8 is read as Latin-1
  and as cp1252 (of N), and clean pages it flags (of N), with the rule's pattern of this code and
  of the baseline. Pages: the same Debian documentation, plus data/multilingual's clean pages.

    python -m bench.redaction_docs --baseline main [--pages 40]
"""

import argparse
import glob
import gzip
import importlib.util
import json
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
from resiliparse.extract.html2text import extract_plain_text

from refinery.models import quality_features as qf
from refinery.stages import pii
from refinery.stages.pii_context import is_documentation_address
from tests.helpers.texts import mojibake  # the tests' Latin-1 / cp1252 misreading, the same bytes

REPO = Path(__file__).resolve().parents[1]
HANDBOOK = "/usr/share/doc/debian-handbook/html/{}/*.html"
INSTALL_GUIDE = "/usr/share/doc/installation-guide-amd64/{}/*.html"
# language -> (handbook directory, installation guide directory)
LANGUAGES = {"ar": ("ar-MA", None), "fa": ("fa-IR", None), "el": ("el-GR", "el"), "ru": ("ru-RU", "ru"),
             "ja": ("ja-JP", "ja"), "zh": ("zh-CN", "zh_CN"), "ko": ("ko-KR", "ko"), "de": ("de-DE", "de"),
             "fr": ("fr-FR", "fr"), "es": ("es-ES", "es"), "pt": ("pt-BR", "pt"), "it": ("it-IT", "it"),
             "nl": ("nl-NL", "nl"), "pl": ("pl-PL", None), "tr": ("tr-TR", None), "vi": ("vi-VN", "vi"),
             "id": ("id-ID", None), "cs": ("cs-CZ", "cs"), "sv": ("sv-SE", "sv"), "da": ("da-DK", "da"),
             "hr": ("hr-HR", None), "ro": ("ro-RO", None), "en": ("en-US", "en")}


def baseline_module(revision: str, path: str, name: str):
    """`path` as it was at git `revision`, imported as module `name`."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:{path}"], check=True,
                            capture_output=True, text=True).stdout
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def doc_pages(limit: int) -> dict[str, list[str]]:
    pages = {}
    for lang, dirs in LANGUAGES.items():
        files = sorted(glob.glob(HANDBOOK.format(dirs[0])))
        if dirs[1]:
            files += sorted(glob.glob(INSTALL_GUIDE.format(dirs[1])))
        texts = [extract_plain_text(Path(f).read_text(encoding="utf-8", errors="replace"), main_content=True)
                 for f in files]
        texts = [t for t in texts if len(t) >= 500]
        if texts:
            pages[lang] = texts[:limit]
    return pages


def ip_counts(module, texts: list[str], **options) -> tuple[int, int]:
    """(replacements, pages with one) of IP addresses by `module`'s redaction."""
    total = docs = 0
    for text in texts:
        n = module.redact(text, frozenset({"ip"}), **options)[1]["ip"]
        total, docs = total + n, docs + (n > 0)
    return total, docs


def documentation_ips(texts: list[str]) -> int:
    ipv4 = next(p for p in pii.PATTERNS if p.kind == "ip" and p.keep is not None).regex
    return sum(is_documentation_address(m.group(0)) for t in texts for m in ipv4.finditer(t))


def broken(pattern: str, texts: list[str]) -> int:
    """Pages over the broken-text rule with `pattern` as its broken characters."""
    series = pl.Series(texts)
    share = series.str.count_matches(pattern) / (series.str.len_chars() - series.str.count_matches(r"\s")).clip(1)
    return int((share >= qf.BROKEN_RULE).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git revision whose code is the baseline")
    parser.add_argument("--pages", type=int, default=40, help="pages per language and source")
    args = parser.parse_args()
    old_pii = baseline_module(args.baseline, "refinery/stages/pii.py", "baseline_pii")
    old_broken = baseline_module(args.baseline, "refinery/models/quality_features.py", "baseline_qf").BROKEN_CHARS
    pages = doc_pages(args.pages)
    with gzip.open(REPO / "data" / "multilingual" / "clean.jsonl.gz", "rt", encoding="utf-8") as f:
        multilingual = defaultdict(list)
        for line in f:
            page = json.loads(line)
            multilingual[page["lang"]].append(page["text"])
    rows = {}
    for lang, texts in sorted(pages.items()):
        old, new = ip_counts(old_pii, texts), ip_counts(pii, texts)
        row = {"pages": len(texts), "ip_old": old[0], "ip_old_pages": old[1], "ip_new": new[0],
               "ip_new_pages": new[1], "documentation_ips": documentation_ips(texts)}
        corpus = texts + multilingual.get(lang, [])
        row["broken_pages"] = len(corpus)
        row["broken_pages_changed"] = sum(mojibake(t, "latin-1") != t for t in corpus)  # any non-ASCII
        for codec in ("latin-1", "cp1252"):
            garbled = [mojibake(t, codec) for t in corpus]
            row[f"caught_{codec}_old"], row[f"caught_{codec}_new"] = broken(old_broken, garbled), broken(qf.BROKEN_CHARS, garbled)
        row["clean_flagged_old"], row["clean_flagged_new"] = broken(old_broken, corpus), broken(qf.BROKEN_CHARS, corpus)
        rows[lang] = row
    totals = Counter()
    for row in rows.values():
        totals.update(row)
    print(json.dumps({"by_language": rows, "total": dict(totals)}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
