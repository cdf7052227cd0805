"""Per-language rule sets: what the heuristic rules read for documents of one language, resolved once.

The config declares the values: the stage-wide sections (`stages.heuristic.gopher_quality`,
`gopher_repetition`, `c4`, `fineweb`, `rules_off`), the built-in per-language settings
(`default_language_heuristics`, docs/languages.md) and the config's own `stages.heuristic.languages`
entries. `resolve_rules` is the one place they meet: a language's own entry wins over its built-in
one field by field, their threshold dicts merge key by key (the own entry's keys win) over the
stage-wide sections, and the rules switched off stage-wide, built in and by the entry add up. A
document without a language reads as English, which keeps the published values. The result is a
frozen `LanguageRules`, which the rule families read and nothing writes back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from refinery.config import (
    C4Config,
    FineWebQualityConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    HeuristicConfig,
    LanguageHeuristics,
    default_language_heuristics,
)
from refinery.stages.segment import Segmenter, segmenter
from refinery.stages.stopwords import stop_words


@dataclass(frozen=True)
class LanguageRules:
    """Everything the rules read for one language: its thresholds, stop words, word splitter, and
    the rules switched off (stage-wide, for the language, and for the source when a filter adds its
    source's with `with_rules_off`)."""

    language: str
    gopher_quality: GopherQualityConfig
    gopher_repetition: GopherRepetitionConfig
    c4: C4Config
    fineweb: FineWebQualityConfig
    stop_words: frozenset[str] | None
    segment: Segmenter | None
    off: frozenset[str]

    def with_rules_off(self, rules_off: frozenset[str]) -> "LanguageRules":
        """These rules with `rules_off` (a source's `rules_off`) switched off too."""
        return replace(self, off=self.off | rules_off) if rules_off else self


def resolve_rules(cfg: HeuristicConfig, language: str | None) -> LanguageRules:
    """The rule set for documents of `language` (None: English) under the stage's config."""
    language = language or "en"
    builtin = default_language_heuristics().get(language, LanguageHeuristics())
    own = cfg.languages.get(language)
    declared = [builtin] if own is None else [builtin, own]

    def setting(name: str) -> Any:
        return getattr(own if own is not None and name in own.model_fields_set else builtin, name)

    segmenter_name = setting("segmenter")
    return LanguageRules(
        language=language,
        gopher_quality=cfg.language_section(language, "gopher_quality"),
        gopher_repetition=cfg.language_section(language, "gopher_repetition"),
        c4=cfg.language_section(language, "c4"),
        fineweb=cfg.language_section(language, "fineweb"),
        stop_words=stop_words(language, setting("stop_words")),
        segment=None if segmenter_name == "whitespace" else segmenter(segmenter_name),
        off=frozenset(cfg.rules_off).union(*(settings.rules_off for settings in declared)),
    )
