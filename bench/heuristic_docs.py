"""Heuristics on labelled real pages, per language: clean recall of real documentation against the
removal rate of real low-value and spam pages, C4 as published against this checkout's rules.

Clean pages are data/heuristic_docs's documentation and man pages (code samples, option lists and
commands left in); junk is its low-value pages (generated indexes, word lists, catalogues, changelogs,
copyright files) and data/labelled's low and spam pages. Every page goes through language ID as the
default config runs it (`min_score` 0.65, a page kept only when lid.176 reads it as its labelled
language) and then `HeuristicFilter` with the page's language, under each variant:

- `published`: `c4.curly_bracket_skip_code: false` (any `{` drops the page, as C4 does);
- `this`: the defaults of this checkout.

Prints, per variant and language, clean kept / clean pages and junk removed / junk pages, and the
first failing rule of every clean page lost (a page failing several rules is counted under the
first, as the stage reports it).

    python bench/heuristic_docs.py [--json]
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

from refinery.config import C4Config, HeuristicConfig, LanguageConfig  # noqa: E402
from refinery.stages.heuristic import HeuristicFilter  # noqa: E402
from refinery.stages.language import LanguageFilter, load_language_model  # noqa: E402

HERE = Path(sys.path[0])
VARIANTS = {"published": HeuristicConfig(c4=C4Config(curly_bracket_skip_code=False)), "this": HeuristicConfig()}


def pages() -> list[dict]:
    rows = []
    for path in (HERE / "data/heuristic_docs/docs.jsonl.gz", HERE / "data/labelled/labelled.jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows += [r for r in map(json.loads, f) if r["label"] in ("clean", "low", "spam")]
    return rows


def language_drop(language: LanguageFilter, page: dict) -> str | None:
    """The language-ID reason the page is lost for, or None when lid.176 keeps it as its language."""
    found, score = language.model.predict(page["text"])
    if found != page["lang"]:
        return "language/other_language"
    return "language/low_score" if score < language.cfg.min_score else None


def measure(rows: list[dict]) -> dict:
    language = LanguageFilter(LanguageConfig(languages="all"), load_language_model(None))
    lid = [language_drop(language, page) for page in rows]
    out = {}
    for name, cfg in VARIANTS.items():
        stage = HeuristicFilter(cfg)
        table: dict[str, Counter] = {}
        lost: dict[str, Counter] = {}
        for page, reason in zip(rows, lid):
            if reason is None:
                drop = stage.apply(page["text"], page["url"], Counter(), page["lang"])[1]
                reason = drop.rule if drop is not None else None
            counts = table.setdefault(page["lang"], Counter())
            clean = page["label"] == "clean"
            counts["clean" if clean else "junk"] += 1
            counts["clean_kept" if clean else "junk_removed"] += (reason is None) if clean else (reason is not None)
            if clean and reason is not None:
                lost.setdefault(page["lang"], Counter())[reason] += 1
        out[name] = {lang: {**table[lang], "clean_lost_by": dict(lost.get(lang, {}))} for lang in sorted(table)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(pages())
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print("| language | clean pages | junk pages | " + " | ".join(
        f"{v} clean kept | {v} junk removed" for v in VARIANTS) + " | lost clean pages (this), first rule |")
    print("| --- " * (3 + 2 * len(VARIANTS) + 1) + "|")
    for lang, base in result["this"].items():
        cells = []
        for v in VARIANTS:
            c = result[v][lang]
            cells.append(f"{c.get('clean_kept', 0) / c['clean']:.3f}" if c.get("clean") else "-")
            cells.append(f"{c.get('junk_removed', 0) / c['junk']:.3f}" if c.get("junk") else "-")
        why = ", ".join(f"{r} {n}" for r, n in sorted(base["clean_lost_by"].items(), key=lambda kv: -kv[1]))
        print(f"| {lang} | {base.get('clean', 0)} | {base.get('junk', 0)} | " + " | ".join(cells) + f" | {why} |")
    for v in VARIANTS:
        totals = Counter()
        for c in result[v].values():
            totals.update({k: n for k, n in c.items() if isinstance(n, int)})
            totals.update({f"lost {r}": n for r, n in c["clean_lost_by"].items()})
        print(v, dict(totals))


if __name__ == "__main__":
    main()
