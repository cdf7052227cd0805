"""Language ID and heuristics on labelled real pages, per language: clean recall of real
documentation against the removal of real low-value and spam pages, FineWeb and C4 as published
against this checkout's rules, and each changed rule alone.

Clean pages are data/heuristic_docs's documentation and man pages (code samples, option lists and
commands left in); junk is its low-value pages (generated indexes, word lists, catalogues, changelogs,
copyright files) and data/labelled's low and spam pages. A third of those pages (by a hash of the
url) is held out: the rules were tuned on the other two thirds, and data/multilingual (GNOME help
and man pages in ten languages, and planted spam) was not looked at while tuning. Every page goes
through language ID with `languages: all` (`min_score` 0.65, kept only when lid.176 reads it as its
labelled language) and then `HeuristicFilter` with the page's language, under each variant:

- `published`: FineWeb's and C4's reading: lid.176 on the whole text and its top label's own score
  (`prose_lines: false`, `macrolanguages: false`), every line in FineWeb's line-punctuation ratio
  (`fineweb.line_punct_prose_only: false`), any `{` drops the page (`c4.curly_bracket_skip_code: false`);
- `this`: the defaults of this checkout.

Prints, per variant and language, clean kept / clean pages and junk removed / junk pages and the
first failing rule of every clean page lost (a page failing several rules is counted under the
first, as the stage reports it); then, for each changed rule alone (a heuristic rule on every page,
in explain mode, whatever else it fails), per language: its recall (clean pages it passes) and its
precision (junk pages among those it removes); then the totals per split, and language ID's time
under each variant (the same pages, one process, so the ratio is what the prose reading costs).

With `--quality-root DATA_ROOT` it also scores the text the heuristics keep (tuned and held-out
pages) with that data root's published quality model: per junk kind, and whether the page is in
data/labelled (which a config with `labelled_set` trains on), the pages at or above the clean pages'
upper quartile and the ROC AUC of the clean pages against them.

    python bench/heuristic_docs.py [--json] [--quality-root DATA_ROOT]
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import gzip  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

from refinery.config import C4Config, FineWebQualityConfig, HeuristicConfig, LanguageConfig  # noqa: E402
from refinery.stages.heuristic import HeuristicFilter  # noqa: E402
from refinery.stages.language import LanguageFilter, load_language_model  # noqa: E402

HERE = Path(sys.path[0])
VARIANTS = {
    "published": (LanguageConfig(languages="all", prose_lines=False, macrolanguages=False),
                  HeuristicConfig(c4=C4Config(curly_bracket_skip_code=False),
                                  fineweb=FineWebQualityConfig(line_punct_prose_only=False))),
    "this": (LanguageConfig(languages="all"), HeuristicConfig()),
}
# The rules this checkout departs from; "language" is language ID's two reasons together.
CHANGED_RULES = ("language", "c4/curly_bracket", "fineweb/line_punct_ratio")
HELD_OUT = 3  # one page in three, by the url's hash


def split_of(url: str) -> str:
    return "held-out" if int(hashlib.sha256(url.encode()).hexdigest(), 16) % HELD_OUT == 0 else "tuned"


def _read(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return list(map(json.loads, f))


def pages() -> list[dict]:
    """Every labelled page with its split: data/heuristic_docs and data/labelled (tuned or
    held-out), data/multilingual (unseen)."""
    rows = []
    for path in (HERE / "data/heuristic_docs/docs.jsonl.gz", HERE / "data/labelled/labelled.jsonl.gz"):
        rows += [{**r, "split": split_of(r["url"])} for r in _read(path) if r["label"] in ("clean", "low", "spam")]
    for name, label in (("clean", "clean"), ("spam", "spam")):
        rows += [{**r, "label": label, "split": "unseen"} for r in _read(HERE / f"data/multilingual/{name}.jsonl.gz")]
    return rows


def language_drop(language: LanguageFilter, page: dict) -> str | None:
    """The language-ID reason the page is lost for, or None when lid.176 keeps it as its language."""
    found, score = language.identify(page["text"])
    if found != page["lang"]:
        return "language/other_language"
    return "language/low_score" if score < language.cfg.min_score else None


def _tally(table: dict, key: str, clean: bool, removed: bool) -> None:
    counts = table.setdefault(key, Counter())
    counts["clean" if clean else "junk"] += 1
    counts["clean_kept" if clean else "junk_removed"] += (not removed) if clean else removed


def measure(rows: list[dict]) -> dict:
    model = load_language_model(None)
    out: dict = {}
    for name, (language_cfg, heuristic_cfg) in VARIANTS.items():
        language, stage = LanguageFilter(language_cfg, model), HeuristicFilter(heuristic_cfg)
        funnel: dict[str, Counter] = {}
        splits: dict[str, Counter] = {}
        lost: dict[str, Counter] = {}
        alone = {rule: {} for rule in CHANGED_RULES}
        seconds = 0.0
        for page in rows:
            clean = page["label"] == "clean"
            start = time.perf_counter()
            reason = lid_reason = language_drop(language, page)
            seconds += time.perf_counter() - start
            fails = {f.rule for f in stage.explain(page["text"], page["url"], page["lang"])}
            if reason is None:
                drop = stage.apply(page["text"], page["url"], Counter(), page["lang"])[1]
                reason = drop.rule if drop is not None else None
            if page["split"] != "unseen":
                _tally(funnel, page["lang"], clean, reason is not None)
                if clean and reason is not None:
                    lost.setdefault(page["lang"], Counter())[reason] += 1
                for rule in CHANGED_RULES:
                    hit = lid_reason is not None if rule == "language" else rule in fails
                    _tally(alone[rule], page["lang"], clean, hit)
            _tally(splits, page["split"], clean, reason is not None)
            _tally(splits, f"{page['split']} {page['lang']}", clean, reason is not None)
        out[name] = {
            "funnel": {lang: {**funnel[lang], "clean_lost_by": dict(lost.get(lang, {}))} for lang in sorted(funnel)},
            "rules": {rule: {lang: dict(c) for lang, c in sorted(t.items())} for rule, t in alone.items()},
            "splits": {k: dict(c) for k, c in sorted(splits.items())},
            "language_id_seconds": seconds,
        }
    return out


def _share(c: dict, part: str, whole: str) -> str:
    return f"{c.get(part, 0) / c[whole]:.3f}" if c.get(whole) else "-"


def rule_cells(c: dict) -> list[str]:
    """Recall (clean pages the rule passes) and precision (junk among the pages it removes)."""
    removed_clean = c.get("clean", 0) - c.get("clean_kept", 0)
    removed = removed_clean + c.get("junk_removed", 0)
    return [_share(c, "clean_kept", "clean"), f"{c.get('junk_removed', 0) / removed:.3f}" if removed else "-",
            f"{removed_clean}/{c.get('junk_removed', 0)}"]


def quality_ranks(rows: list[dict], root: str) -> list[str]:
    """Lines of text: the published quality model of `root` on the pages this checkout keeps."""
    import numpy as np
    import polars as pl

    from refinery.models import quality_metrics as qm
    from refinery.models.quality_training import load_published_model
    from refinery.storage import open_data_root

    model = load_published_model(open_data_root(root))[0]
    language_cfg, heuristic_cfg = VARIANTS["this"]
    language, stage = LanguageFilter(language_cfg, load_language_model(None)), HeuristicFilter(heuristic_cfg)
    trained_on = {r["url"] for r in _read(HERE / "data/labelled/labelled.jsonl.gz")}
    kept = []
    for page in rows:
        if page["split"] != "unseen" and language_drop(language, page) is None:
            text, drop = stage.apply(page["text"], page["url"], Counter(), page["lang"])
            if drop is None:
                kept.append((page, text))
    scores = model.score(pl.Series([text for _, text in kept], dtype=pl.String))
    clean = np.array([s for (page, _), s in zip(kept, scores) if page["label"] == "clean"])
    top = float(np.quantile(clean, 0.75))
    out = [f"quality: {len(clean)} clean pages kept, median {np.median(clean):.3f}, upper quartile {top:.3f}, "
           f"{int((clean < 0.5).sum())} below 0.5"]
    groups: dict[tuple[str, bool], list[float]] = {}
    for (page, _), s in zip(kept, scores):
        if page["label"] != "clean":
            groups.setdefault((page["kind"], page["url"] in trained_on), []).append(float(s))
    for (kind, labelled), junk in sorted(groups.items()):
        auc = qm.roc_auc(np.concatenate([clean, junk]), np.concatenate([np.ones(len(clean)), np.zeros(len(junk))]))
        out.append(f"  {kind} ({'in data/labelled' if labelled else 'not in data/labelled'}): {len(junk)} kept, "
                   f"median {np.median(junk):.3f}, {sum(s >= top for s in junk)} at or above the clean upper "
                   f"quartile, {sum(s < 0.5 for s in junk)} below 0.5, AUC clean vs these {auc:.3f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quality-root", help="a data root whose published quality model scores the kept pages")
    args = ap.parse_args()
    rows = pages()
    result = measure(rows)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print("| language | clean pages | junk pages | " + " | ".join(
        f"{v} clean kept | {v} junk removed" for v in VARIANTS) + " | lost clean pages (this), first rule |")
    print("| --- " * (3 + 2 * len(VARIANTS) + 1) + "|")
    for lang, base in result["this"]["funnel"].items():
        cells = [cell for v in VARIANTS for cell in (_share(result[v]["funnel"][lang], "clean_kept", "clean"),
                                                      _share(result[v]["funnel"][lang], "junk_removed", "junk"))]
        why = ", ".join(f"{r} {n}" for r, n in sorted(base["clean_lost_by"].items(), key=lambda kv: -kv[1]))
        print(f"| {lang} | {base.get('clean', 0)} | {base.get('junk', 0)} | " + " | ".join(cells) + f" | {why} |")
    for rule in CHANGED_RULES:
        print(f"\n{rule} alone: recall (clean passed), precision (junk among removed), clean/junk removed")
        print("| language | " + " | ".join(f"{v} recall | {v} precision | {v} removed" for v in VARIANTS) + " |")
        print("| --- " * (1 + 3 * len(VARIANTS)) + "|")
        for lang in result["this"]["rules"][rule]:
            cells = [cell for v in VARIANTS for cell in rule_cells(result[v]["rules"][rule][lang])]
            print(f"| {lang} | " + " | ".join(cells) + " |")
    print("\n| split | " + " | ".join(f"{v} clean kept | {v} junk removed | {v} languages below 0.85" for v in VARIANTS)
          + " |")
    print("| --- " * (1 + 3 * len(VARIANTS)) + "|")
    for split in ("tuned", "held-out", "unseen"):
        cells = []
        for v in VARIANTS:
            c = result[v]["splits"][split]
            below = [f"{k.split()[1]} {s['clean_kept']}/{s['clean']}" for k, s in result[v]["splits"].items()
                     if k.startswith(split + " ") and s.get("clean") and s["clean_kept"] / s["clean"] < 0.85]
            cells += [f"{c['clean_kept']}/{c['clean']} ({c['clean_kept'] / c['clean']:.3f})",
                      f"{c['junk_removed']}/{c['junk']} ({c['junk_removed'] / c['junk']:.3f})", ", ".join(below) or "none"]
        print(f"| {split} | " + " | ".join(cells) + " |")
    base, this = (result[v]["language_id_seconds"] for v in VARIANTS)
    print(f"\nlanguage ID on {len(rows)} pages: published {base:.2f} s, this {this:.2f} s ({this / base:.2f}x)")
    if args.quality_root:
        print("\n" + "\n".join(quality_ranks(rows, args.quality_root)))


if __name__ == "__main__":
    main()
