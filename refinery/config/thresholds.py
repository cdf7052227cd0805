"""The heuristic filter's published thresholds, one section per rule family (Gopher quality and
repetition, C4, FineWeb), and the names of the rules a config may switch off."""

from __future__ import annotations

from pydantic import Field

from refinery.config.section import Section


class GopherQualityConfig(Section):
    """Rae et al. 2021 (Gopher), table A1; datatrove GopherQualityFilter defaults."""

    min_words: int = 50
    max_words: int = 100_000
    min_avg_word_length: float = 3.0
    max_avg_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    min_alpha_words_ratio: float = 0.8  # fraction of words that contain a letter
    min_stop_words: int = 2


class GopherRepetitionConfig(Section):
    """Gopher repetition thresholds (Rae et al. 2021, table A1)."""

    dup_line_frac: float = 0.3
    dup_para_frac: float = 0.3
    dup_line_char_frac: float = 0.2
    dup_para_char_frac: float = 0.2
    top_n_grams: list[list[float]] = Field(default_factory=lambda: [[2, 0.2], [3, 0.18], [4, 0.16]])
    dup_n_grams: list[list[float]] = Field(
        default_factory=lambda: [[5, 0.15], [6, 0.14], [7, 0.13], [8, 0.12], [9, 0.11], [10, 0.10]]
    )


class C4Config(Section):
    """C4 (Raffel et al. 2020) line rules; FineWeb turns the terminal-punctuation rule off."""

    filter_no_terminal_punct: bool = False
    min_num_sentences: int = 5
    min_words_per_line: int = 3
    max_word_length: int = 1000
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True


class FineWebQualityConfig(Section):
    """FineWeb quality rules (Penedo et al. 2024, "FineWeb: decanting the web", custom filters):
    lines ending in punctuation >= 0.12, lines of <= 30 characters <= 0.67, characters in
    duplicated lines < 0.1. datatrove's FineWebQualityFilter code defaults the duplicated-line
    ratio to 0.01, which drops clean documentation pages that repeat one code line; we keep the
    published 0.1. `new_line_ratio` (newlines per word) is datatrove's list-page rule."""

    line_punct_thr: float = 0.12
    short_line_thr: float = 0.67
    short_line_length: int = 30
    char_duplicates_ratio: float = 0.1
    new_line_ratio: float = 0.3


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
