"""A stage a test adds to the registry and nothing else: its module (this one: the stage and its
recipe), its registry line (`with_first_word_filter`), and no config section of its own. It drops
a document whose text starts with one of `FIRST_WORDS` (about a quarter of the verdict corpus's
documents, helpers/verdict_corpus.py), rule `first_word/listed`."""

from __future__ import annotations

import dataclasses
from typing import Any

from refinery.stage_recipes import StageBuild
from refinery.stages.base import Filter
from refinery.stages.registry import FunnelStage, Verdict
from refinery.stages.stats import Drop

NAME = "first_word_filtered"
FIRST_WORDS = frozenset({"river", "stone", "lantern", "harbour", "meadow", "copper"})


def listed(text: str) -> bool:
    return bool(text.strip()) and text.split(maxsplit=1)[0].lower() in FIRST_WORDS


class FirstWordFilter(Filter):
    name = NAME
    family = "first_word"

    def check(self, record: dict[str, Any]) -> Drop | None:
        return Drop("first_word/listed") if listed(record["text"]) else None


def build_first_word_filter(build: StageBuild) -> FirstWordFilter:
    """Drops a document whose first word is listed."""
    return FirstWordFilter()


RECORD = FunnelStage(NAME, "quality_scored", False, ("sources",), (Verdict(NAME, ("first_word",)),),
                     build=f"{__name__}:build_first_word_filter")


def with_first_word_filter(stages: tuple[FunnelStage, ...]) -> tuple[FunnelStage, ...]:
    """`stages` with RECORD between quality_scored and pii_redacted, which now reads it."""
    return with_first_word_filter_built_by(stages, RECORD.build)


def with_first_word_filter_built_by(stages: tuple[FunnelStage, ...], build: str | None) -> tuple[FunnelStage, ...]:
    """`with_first_word_filter` with RECORD's recipe named `build`."""
    at = [s.name for s in stages].index("pii_redacted")
    record = dataclasses.replace(RECORD, build=build)
    return (*stages[:at], record, dataclasses.replace(stages[at], upstream=NAME), *stages[at + 1:])
