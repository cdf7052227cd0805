"""Main-content extraction against gold snippets: the extract stage's methods and trafilatura, per
language and split, with pages per CPU-second, all in one process.

Pages and gold come from bench/extraction_data.py (trafilatura's tests/eval and tests/evaldata.json).
Scoring is trafilatura's own (tests/eval_common.py `count_item`): after whitespace normalisation a
`with` snippet found in the output is a true positive, one missing a false negative, a `without`
snippet found a false positive. Each page is decoded once (resiliparse's encoding detection), and every
extractor gets the same str. CPU time is time.process_time over the extraction calls alone; each
extractor gets one warm-up page first. trafilatura runs as its evaluation does (include_comments off,
include_tables on, include_formatting off). The dev split is what the method was tuned on; held_out
is reported, not tuned on. Languages with fewer than --min-pages pages are folded into "other".

Then what the next stages see of each extractor's text, per language: the share of pages that
language ID (lid.176 on the whole text, `languages: all` at the default min_score) gives the page's
own language (its gold snippets' language), and the share that then passes the heuristic stage with
its default thresholds for that language. These are good pages, so a higher share is better: an
extractor that keeps boilerplate or drops article lines can cost a page either stage.

    python bench/extraction_data.py --source /work/.mirror/adbar+trafilatura/repo
    python bench/extraction.py --data out/extraction_eval
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402


def norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def counts(row: dict, text: str | None) -> tuple[int, int, int]:
    """(tp, fp, fn) of one page, as trafilatura's evaluation counts them."""
    out = norm(text or "")
    tp = sum(norm(w) in out for w in row["with"])
    fp = sum(norm(w) in out for w in row["without"])
    return tp, fp, len(row["with"]) - tp


def scores(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def extractors() -> dict:
    import trafilatura

    from refinery.stages.html import EXTRACTORS

    def trafilatura_extract(html: str) -> str | None:
        return trafilatura.extract(html, include_comments=False, include_tables=True, include_formatting=False)

    return {**{m: EXTRACTORS[m] for m in ("resiliparse_main", "resiliparse_article")},
            f"trafilatura {trafilatura.__version__}": trafilatura_extract}


def next_stages(rows: list[dict], outputs: list[str | None], group: dict) -> dict[str, tuple[int, int, int]]:
    """Per language group ("all" first): (pages, pages language ID gives their own language, pages
    that also pass the heuristics)."""
    from collections import Counter

    from refinery.config import HeuristicConfig, LanguageConfig
    from refinery.stages import heuristic, language
    from refinery.stages.stats import Drop

    lid = language.LanguageFilter.from_config(LanguageConfig(languages="all"))
    rules = heuristic.HeuristicFilter(HeuristicConfig())
    cells: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for row, text in zip(rows, outputs):
        counters: Counter = Counter()
        found = lid.process({"text": text or ""}, counters)
        same = not isinstance(found, Drop) and found["language"] == row["language"]
        kept = same and not isinstance(rules.process({"text": text, "url": None, "language": found["language"]},
                                                      counters), Drop)
        for key in ("all", group[row["language"]]):
            cell = cells[key]
            cell[0] += 1
            cell[1] += same
            cell[2] += kept
    return {k: tuple(v) for k, v in sorted(cells.items(), key=lambda kv: (kv[0] != "all", kv[0]))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("out/extraction_eval"))
    ap.add_argument("--min-pages", type=int, default=30, help="languages with fewer pages go into 'other'")
    args = ap.parse_args()

    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    rows = [json.loads(line) for line in (args.data / "gold.jsonl").read_text(encoding="utf-8").splitlines()]
    pages = []
    for row in rows:
        raw = (args.data / "pages" / row["file"]).read_bytes()
        pages.append(bytes_to_str(raw, detect_encoding(raw)))
    per_language = defaultdict(int)
    for row in rows:
        per_language[row["language"]] += 1
    group = {lang: lang if n >= args.min_pages else "other" for lang, n in per_language.items()}

    print(f"{len(rows)} pages; languages with >= {args.min_pages}: "
          + ", ".join(f"{lang} {n}" for lang, n in sorted(per_language.items(), key=lambda x: -x[1]) if n >= args.min_pages))
    print("| extractor | split | language | pages | precision | recall | F1 |")
    print("|---|---|---|---:|---:|---:|---:|")
    speed, texts = {}, {}
    for name, extract in extractors().items():
        extract(pages[0])
        start = time.process_time()
        outputs = [extract(page) for page in pages]
        speed[name] = len(pages) / (time.process_time() - start)
        texts[name] = outputs
        cells = defaultdict(lambda: [0, 0, 0, 0])
        for row, text in zip(rows, outputs):
            tp, fp, fn = counts(row, text)
            for key in ((row["split"], "all"), (row["split"], group[row["language"]]), ("all", "all"),
                        ("all", group[row["language"]])):
                cell = cells[key]
                cell[0] += tp
                cell[1] += fp
                cell[2] += fn
                cell[3] += 1
        for (split, lang), (tp, fp, fn, n) in sorted(cells.items(), key=lambda kv: (kv[0][0] != "all", kv[0][0], kv[0][1] != "all", kv[0][1])):
            p, r, f = scores(tp, fp, fn)
            print(f"| {name} | {split} | {lang} | {n} | {p:.3f} | {r:.3f} | {f:.3f} |")
    print("\n| extractor | language | pages | language ID gives its language | and passes the heuristics |")
    print("|---|---|---:|---:|---:|")
    for name, outputs in texts.items():
        for lang, (n, same, kept) in next_stages(rows, outputs, group).items():
            print(f"| {name} | {lang} | {n} | {same / n:.3f} | {kept / n:.3f} |")
    print("\n| extractor | pages per CPU-second | x trafilatura |")
    print("|---|---:|---:|")
    base = next(v for k, v in speed.items() if k.startswith("trafilatura"))
    for name, pps in speed.items():
        print(f"| {name} | {pps:.1f} | {pps / base:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
