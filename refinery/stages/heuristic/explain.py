"""Explain mode: every rule one document fails, not only the first one the stage reports
(`refinery funnel --explain`), so a user sees what a threshold change would buy.

The document is read as heuristic_filtered reads it: every heuristic rule with its source's and
language's settings (`HeuristicFilter.explain`), then the config's custom filters, on the text the
rules keep (C4 may drop lines; on a document the rules drop, its own text), each failure with the
measured value and the threshold.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import polars as pl

from refinery.config import RefineryConfig, SourceConfig
from refinery.stages.custom import build_custom_filter, in_family
from refinery.stages.heuristic.filter import HeuristicFilter


class Explanation(NamedTuple):
    failures: list[tuple[str, float | None, str]]  # (rule, value, threshold), in the order they run
    rules_off: list[str]  # the rules switched off for the document's source and language


def explain_record(cfg: RefineryConfig, frame: pl.DataFrame, source: SourceConfig) -> Explanation:
    """Every heuristic rule and custom filter the one document of `frame` (a language_filtered row,
    with every column a custom filter may read) fails; `source` is its source's config."""
    row = frame.row(0, named=True)
    heuristic = HeuristicFilter(cfg.stages.heuristic, source.rules_off)
    failures = [(d.rule, d.value, d.detail) for d in heuristic.explain(row["text"], row["url"], row["language"])]
    if cfg.stages.custom_filters:
        kept, _ = heuristic.apply(row["text"], row["url"], Counter(), row["language"])
        custom_input = frame.with_columns(pl.lit(row["text"] if kept is None else kept).alias("text"))
    for spec in cfg.stages.custom_filters:
        stage = build_custom_filter(spec, cfg.base_dir)
        stage.record_timeout_s = cfg.stages.record_timeout_s
        rejects = in_family(stage.run(custom_input), spec.name).rejects
        failures += rejects.select("rule", "value", "detail").rows()
    return Explanation(failures, sorted(heuristic.rules_for(row["language"]).off))
