"""How the heuristics read each language: the per-language settings section and the built-in
per-language defaults (docs/languages.md has the table and the reasons)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from refinery.config.section import Section
from refinery.config.thresholds import RULE_SECTIONS


class LanguageHeuristics(Section):
    """How the heuristics read one language (docs/languages.md has the table and the reasons).

    `segmenter` splits words: `whitespace` (the published rules' unit), `jieba` (Chinese) or
    `script_runs` (runs of one script or character class: the offline fallback for Japanese, Thai
    and other scripts written without spaces). `stop_words`: `gopher` (the paper's eight English
    words), `stopwordsiso` (the stopwords-iso list of the language), or `none` (the rule is off).
    The four sections override single thresholds of the stage-wide sections; `rules_off` switches
    rules that have no calibration for the language off."""

    segmenter: Literal["whitespace", "jieba", "script_runs"] = "whitespace"
    stop_words: Literal["gopher", "stopwordsiso", "none"] = "stopwordsiso"
    gopher_quality: dict[str, float] = Field(default_factory=dict)
    gopher_repetition: dict[str, Any] = Field(default_factory=dict)
    c4: dict[str, float | bool] = Field(default_factory=dict)
    fineweb: dict[str, float] = Field(default_factory=dict)
    rules_off: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_thresholds(self) -> "LanguageHeuristics":
        for section, model in RULE_SECTIONS.items():
            unknown = sorted(set(getattr(self, section)) - set(model.model_fields))
            if unknown:
                raise ValueError(
                    f"{section}: unknown threshold(s) {unknown}; valid ones are {sorted(model.model_fields)}"
                )
        return self


def default_language_heuristics() -> dict[str, LanguageHeuristics]:
    """Built-in per-language settings; any other language reads as whitespace-split text with its
    stopwords-iso list (or no stop-word rule without one) and the published thresholds.

    Gopher's mean-word-length band (3-10 characters) is about 0.6x-2x English's typical mean word
    length (~5 characters); languages whose words are much shorter get the same ratios around their
    own typical mean (median over data/multilingual's clean pages: ja 3.7 with script runs, ko 3.2,
    zh 2.4 with jieba). Chinese has no lower bound: prose dense in one-character words averages
    about 1.5. A short line is about five words, as FineWeb's 30 characters are in English. See
    docs/languages.md for the table and the reasons."""
    cjk_lines = {"short_line_length": 10}
    # Segmented Chinese and Japanese words are about half as long as English tokens, so n-grams of
    # twice as many of them span about as much text as Gopher's n-grams do in English.
    cjk_ngrams = {"top_n_grams": [[4, 0.2], [6, 0.18], [8, 0.16]],
                  "dup_n_grams": [[10, 0.15], [12, 0.14], [14, 0.13], [16, 0.12], [18, 0.11], [20, 0.10]]}
    no_word_units = ["gopher_quality/min_avg_word_length", "gopher_quality/max_avg_word_length"]
    return {
        "en": LanguageHeuristics(stop_words="gopher"),
        "zh": LanguageHeuristics(segmenter="jieba", gopher_quality={"max_avg_word_length": 5.0},
                                 gopher_repetition=cjk_ngrams, fineweb=cjk_lines,
                                 rules_off=["gopher_quality/min_avg_word_length"]),
        "ja": LanguageHeuristics(segmenter="script_runs", gopher_quality={"min_avg_word_length": 2.0,
                                 "max_avg_word_length": 7.5}, gopher_repetition=cjk_ngrams, fineweb=cjk_lines),
        "ko": LanguageHeuristics(gopher_quality={"min_avg_word_length": 2.0, "max_avg_word_length": 6.5},
                                 fineweb={"short_line_length": 15}),
        # Runs of these scripts are phrases, not words (refinery/stages/segment.py): no word-length or
        # stop-word rule can be calibrated on them.
        **{lang: LanguageHeuristics(segmenter="script_runs", stop_words="none", rules_off=no_word_units)
           for lang in ("th", "lo", "km", "my", "bo")},
    }
