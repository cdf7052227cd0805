"""The heuristic filter's published thresholds, one section per rule family (Gopher quality and
repetition, C4, FineWeb), and the names of the rules a config may switch off."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from refinery.config.section import Section


# A threshold that is a fraction (of words, lines or characters) lies in [0, 1]; a count or a length
# is never negative. Outside those bounds a rule drops every document or none (C4's max_word_length
# -1 dropped all of them), which no published setting does.
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Count = Annotated[int, Field(ge=0)]


def _ordered(section: Section, low: str, high: str) -> None:
    if getattr(section, low) > getattr(section, high):
        raise ValueError(f"{low} {getattr(section, low)} is above {high} {getattr(section, high)}, so every "
                         f"document would be dropped; give {low} <= {high}")


class GopherQualityConfig(Section):
    """Rae et al. 2021 (Gopher), table A1; datatrove GopherQualityFilter defaults."""

    min_words: Count = 50
    max_words: Count = 100_000
    min_avg_word_length: float = Field(default=3.0, ge=0.0)
    max_avg_word_length: float = Field(default=10.0, ge=0.0)
    max_symbol_word_ratio: float = Field(default=0.1, ge=0.0)  # symbols per word: may pass 1
    max_bullet_lines_ratio: Fraction = 0.9
    max_ellipsis_lines_ratio: Fraction = 0.3
    min_alpha_words_ratio: Fraction = 0.8  # fraction of words that contain a letter
    min_stop_words: Count = 2

    @model_validator(mode="after")
    def _bands(self) -> "GopherQualityConfig":
        _ordered(self, "min_words", "max_words")
        _ordered(self, "min_avg_word_length", "max_avg_word_length")
        return self


def _ngram_thresholds(v: list[list[float]]) -> list[list[float]]:
    """Each entry is [n, fraction]: n a whole number of words >= 1, the fraction in [0, 1]."""
    for i, entry in enumerate(v):
        if len(entry) != 2:
            raise ValueError(f"item {i}, {entry}, is not a pair [n, fraction]")
        n, frac = entry
        if n != int(n) or n < 1:
            raise ValueError(f"item {i}: n {n} is not a whole number of words >= 1")
        if not 0.0 <= frac <= 1.0:
            raise ValueError(f"item {i}: fraction {frac} is not between 0 and 1")
    return v


class GopherRepetitionConfig(Section):
    """Gopher repetition thresholds (Rae et al. 2021, table A1). The n-gram rules are [n, fraction] pairs."""

    dup_line_frac: Fraction = 0.3
    dup_para_frac: Fraction = 0.3
    dup_line_char_frac: Fraction = 0.2
    dup_para_char_frac: Fraction = 0.2
    top_n_grams: list[list[float]] = Field(default_factory=lambda: [[2, 0.2], [3, 0.18], [4, 0.16]])
    dup_n_grams: list[list[float]] = Field(
        default_factory=lambda: [[5, 0.15], [6, 0.14], [7, 0.13], [8, 0.12], [9, 0.11], [10, 0.10]]
    )

    _n_gram_pairs = field_validator("top_n_grams", "dup_n_grams")(_ngram_thresholds)


class C4Config(Section):
    """C4 (Raffel et al. 2020) line rules; FineWeb turns the terminal-punctuation rule off."""

    filter_no_terminal_punct: bool = False
    min_num_sentences: Count = 5
    min_words_per_line: Count = 3
    max_word_length: int = Field(default=1000, ge=1)  # characters; C4's own is 1000
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    # False: C4 as published, any `{` drops the page. True: a `{` in a code line (fenced, or a line
    # that opens, closes or ends a block or statement) does not (refinery/stages/heuristic/c4.py).
    curly_bracket_skip_code: bool = True
    filter_policy: bool = True


class FineWebQualityConfig(Section):
    """FineWeb quality rules (Penedo et al. 2024, "FineWeb: decanting the web", custom filters):
    lines ending in punctuation >= 0.12, lines of <= 30 characters <= 0.67, characters in
    duplicated lines < 0.1. datatrove's FineWebQualityFilter code defaults the duplicated-line
    ratio to 0.01, which drops clean documentation pages that repeat one code line; we keep the
    published 0.1. `new_line_ratio` (newlines per word) is datatrove's list-page rule."""

    line_punct_thr: Fraction = 0.12
    # True: the line-punctuation ratio counts prose lines, not code lines nor an option list's
    # entries (refinery/stages/line_kinds.py). False: every line, as FineWeb publishes it.
    line_punct_prose_only: bool = True
    short_line_thr: Fraction = 0.67
    short_line_length: int = Field(default=30, ge=1)
    char_duplicates_ratio: Fraction = 0.1
    new_line_ratio: float = Field(default=0.3, ge=0.0)  # newlines per word: may pass 1


# The drop reasons a config may switch off (per source, per language, or for the whole stage);
# the repetition n-gram rules are named per configured n (HeuristicConfig.rule_names).
HEURISTIC_RULES = (
    "gopher_quality/min_words",
    "gopher_quality/max_words",
    "gopher_quality/min_avg_word_length",
    "gopher_quality/max_avg_word_length",
    "gopher_quality/hash_ratio",
    "gopher_quality/ellipsis_ratio",
    "gopher_quality/bullet_lines_ratio",
    "gopher_quality/ellipsis_lines_ratio",
    "gopher_quality/alpha_words_ratio",
    "gopher_quality/stop_words",
    "gopher_rep/dup_para_frac",
    "gopher_rep/dup_para_char_frac",
    "gopher_rep/dup_line_frac",
    "gopher_rep/dup_line_char_frac",
    "c4/lorem_ipsum",
    "c4/curly_bracket",
    "c4/too_few_sentences",
    "c4_lines/too_long_word",
    "c4_lines/too_few_words",
    "c4_lines/javascript",
    "c4_lines/policy",
    "fineweb/line_punct_ratio",
    "fineweb/short_line_ratio",
    "fineweb/char_dup_ratio",
    "fineweb/list_ratio",
)
RULE_SECTIONS = {
    "gopher_quality": GopherQualityConfig,
    "gopher_repetition": GopherRepetitionConfig,
    "c4": C4Config,
    "fineweb": FineWebQualityConfig,
}
