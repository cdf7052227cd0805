"""Explain mode: every rule one document fails, not only the first one the stage reports
(`refinery funnel --explain`), so a user sees what a threshold change would buy.

The document is read as heuristic_filtered reads it: every heuristic rule with its source's and
language's settings (`HeuristicFilter.explain`), then the config's custom filters, on the text the
rules keep (C4 may drop lines; on a document the rules drop, its own text), each failure with the
measured value, the threshold, and where in the text to look (`offending_excerpt`): on a chapter of
a thousand lines, "line punctuation ratio 0.08" alone leaves the user hunting for the lines.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, NamedTuple

import polars as pl

from refinery.config import RefineryConfig, SourceConfig
from refinery.stages.custom import build_custom_filter, in_family
from refinery.stages.heuristic.c4 import excerpt
from refinery.stages.heuristic.filter import HeuristicFilter
from refinery.stages.heuristic.fineweb import TERMINAL_PUNCTUATION
from refinery.stages.heuristic.gopher_quality import BULLETS, ELLIPSES
from refinery.stages.heuristic.language_rules import LanguageRules


class Explanation(NamedTuple):
    failures: list[tuple[str, float | None, str, str | None]]  # (rule, value, threshold, excerpt), in run order
    rules_off: list[str]  # the rules switched off for the document's source and language


def _first_line(lines: list[str], wanted: Callable[[str], bool], what: str) -> str | None:
    for number, line in enumerate(lines, 1):
        if line.strip() and wanted(line.strip()):
            return f"{what} (line {number}): {excerpt(line.strip())!r}"
    return None


def _most_repeated(items: list[str], what: str) -> str | None:
    counts = Counter(item.strip() for item in items if item.strip())
    if not counts:
        return None
    item, times = counts.most_common(1)[0]
    return f"{what} ({times} times): {excerpt(item)!r}" if times > 1 else None


def _top_ngram(text: str, n: int) -> str | None:
    words = text.split()
    counts = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    if not counts:
        return None
    gram, times = counts.most_common(1)[0]
    return f"most common {n}-gram ({times} times): {' '.join(gram)!r}"


def offending_excerpt(rule: str, text: str, rules: LanguageRules) -> str | None:
    """Where a failed rule's value comes from, for a person: the first line a line rule counts
    against the document (its number from 1), the most repeated line or paragraph, the commonest
    n-gram, and for a rule measured on the whole text, its start. None where the rule's detail
    already quotes the line (C4's curly bracket) or there is no text."""
    lines = text.split("\n")
    found = None
    if rule == "c4/curly_bracket" or not text.strip():
        return None
    if rule == "c4/lorem_ipsum":
        found = _first_line(lines, lambda line: "lorem ipsum" in line.lower(), "first line with 'lorem ipsum'")
    elif rule == "fineweb/line_punct_ratio":
        found = _first_line(lines, lambda line: line[-1] not in TERMINAL_PUNCTUATION, "first line without end punctuation")
    elif rule == "fineweb/short_line_ratio":
        found = _first_line(lines, lambda line: len(line) <= rules.fineweb.short_line_length, "first short line")
    elif rule == "gopher_quality/bullet_lines_ratio":
        found = _first_line(lines, lambda line: line.startswith(BULLETS), "first bullet line")
    elif rule == "gopher_quality/ellipsis_lines_ratio":
        found = _first_line(lines, lambda line: line.endswith(ELLIPSES), "first line ending in an ellipsis")
    elif rule == "gopher_quality/hash_ratio":
        found = _first_line(lines, lambda line: "#" in line, "first line with '#'")
    elif rule in ("fineweb/char_dup_ratio", "gopher_rep/dup_line_frac", "gopher_rep/dup_line_char_frac"):
        found = _most_repeated(lines, "most repeated line")
    elif rule in ("gopher_rep/dup_para_frac", "gopher_rep/dup_para_char_frac"):
        found = _most_repeated(re.split(r"\n\s*\n", text), "most repeated paragraph")
    elif m := re.fullmatch(r"gopher_rep/(?:top|dup)_(\d+)_gram", rule):
        found = _top_ngram(text, int(m.group(1)))
    return found or f"text starts: {excerpt(' '.join(text.split()))!r}"


def explain_record(cfg: RefineryConfig, frame: pl.DataFrame, source: SourceConfig) -> Explanation:
    """Every heuristic rule and custom filter the one document of `frame` (a language_filtered row,
    with every column a custom filter may read) fails; `source` is its source's config."""
    row = frame.row(0, named=True)
    heuristic = HeuristicFilter(cfg.stages.heuristic, source.rules_off)
    rules = heuristic.rules_for(row["language"])
    failures = [(d.rule, d.value, d.detail, offending_excerpt(d.rule, row["text"] or "", rules))
                for d in heuristic.explain(row["text"], row["url"], row["language"])]
    if cfg.stages.custom_filters:
        kept, _ = heuristic.apply(row["text"], row["url"], Counter(), row["language"])
        custom_input = frame.with_columns(pl.lit(row["text"] if kept is None else kept).alias("text"))
    for spec in cfg.stages.custom_filters:
        stage = build_custom_filter(spec, cfg.base_dir)
        stage.record_timeout_s = cfg.stages.record_timeout_s
        rejects = in_family(stage.run(custom_input), spec.name).rejects
        failures += [(*r, None) for r in rejects.select("rule", "value", "detail").rows()]
    return Explanation(failures, sorted(heuristic.rules_for(row["language"]).off))
