"""Two data roots written by the heuristic stage itself (no Dagster) over one table of documents,
with one threshold apart: what `refinery compare` summarises for an experiment. Each root holds the
stage's stats and rejects as the funnel writes them (refinery/layout.py keys)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from refinery.config import HeuristicConfig
from refinery.layout import rejects_key, stats_key
from refinery.stages.heuristic.filter import STAGE, HeuristicFilter
from refinery.stages.stats import StageStats
from refinery.storage import LocalDataRoot

from helpers.texts import PROSE

SENTENCES = PROSE.split(". ")
# doc -> text: prose every rule keeps; two sentences of it (under min_words at 50; at 5, C4's
# sentence count takes it over); a line of symbols (fails min_words and several other rules); five
# short sentences (under min_words at 50, kept at 5).
TEXTS = {
    "web/0": PROSE,
    "web/1": ". ".join(SENTENCES[:2]) + ".",
    "web/2": "#### #### #### #### ####",
    "web/3": "The boats came in at dawn. The nets were full of fish. The market was loud by noon. "
             "The whole town was glad of it. The lamps were lit in the evening.",
}


def documents() -> pl.DataFrame:
    ids = list(TEXTS)
    return pl.DataFrame({"doc_id": ids, "url": [f"https://mill.example/{i}" for i in ids], "source": ["web"] * 4,
                         "bucket": ["web"] * 4, "text": list(TEXTS.values()), "language": ["en"] * 4})


def write_heuristic_root(folder: Path, min_words: int) -> tuple[Path, StageStats]:
    """The heuristic stage at `gopher_quality.min_words` over `documents()`, written under `folder`."""
    cfg = HeuristicConfig.model_validate({"gopher_quality": {"min_words": min_words}})
    out = HeuristicFilter(cfg).run(documents())
    root = LocalDataRoot(str(folder))
    root.write_json(stats_key(STAGE, "web-00"), out.stats.to_dict())
    root.write_parquet(rejects_key(STAGE, "web-00"), out.rejects)
    return folder, out.stats
