"""The `heuristic_filtered` stage: every rule family over each document, in the order
cheapest-to-reject first, read with the rule set of the document's language."""

from __future__ import annotations

from collections import Counter
from typing import Any

import polars as pl

from refinery.config import HeuristicConfig
from refinery.stages.base import Outcome, RecordStage
from refinery.stages.heuristic.c4 import c4_lines
from refinery.stages.heuristic.fineweb import fineweb_quality
from refinery.stages.heuristic.gopher_quality import gopher_quality
from refinery.stages.heuristic.gopher_repetition import gopher_repetition
from refinery.stages.heuristic.language_rules import LanguageRules, resolve_rules
from refinery.stages.heuristic.urls import url_rules
from refinery.stages.heuristic.verdict import Verdict
from refinery.stages.line_kinds import option_entries
from refinery.stages.stats import Drop
from refinery.stages.text import DocumentText

STAGE = "heuristic_filtered"


class HeuristicFilter(RecordStage):
    """Every heuristic rule over each document, read with the settings of the document's language
    (the `language` column); kept documents carry C4's line-filtered text (unchanged when every
    C4 line rule is off). `rules_off` names rules, document and line rules alike, switched off for
    this filter's source (SourceConfig.rules_off)."""

    name = STAGE
    family = "heuristic"
    skip_key = "heuristic"
    reads = ("text", "url")
    optional_reads = ("language",)
    writes = {"text": pl.String()}

    def __init__(self, cfg: HeuristicConfig, rules_off: list[str] | tuple[str, ...] = ()):
        cfg.check_rule_names(list(rules_off), "rules_off")
        self.cfg = cfg
        self.rules_off = frozenset(rules_off)
        self.domains = frozenset(d.lower().strip(".") for d in cfg.url_blocklist)
        self.banned_words = frozenset(w.lower() for w in cfg.url_banned_words)
        self.banned_whole_words = frozenset(w.lower() for w in cfg.url_banned_whole_words)
        self._rules: dict[str | None, LanguageRules] = {}

    def rules_for(self, language: str | None) -> LanguageRules:
        """The rule set for documents of `language`, with this filter's source's rules off too:
        resolved on the language's first document, then reused."""
        rules = self._rules.get(language)
        if rules is None:
            rules = self._rules[language] = resolve_rules(self.cfg, language).with_rules_off(self.rules_off)
        return rules

    def _evaluate(self, text: str | None, url: str | None, removed: Counter, language: str | None,
                  verdict: Verdict) -> str | None:
        """The kept text, or None with the failures in `verdict`."""
        drop = url_rules(url, self.domains, self.banned_whole_words, substrings=self.banned_words)
        if drop is not None and verdict.fail(drop.rule, drop.value, drop.detail):
            return None
        rules = self.rules_for(language)
        doc = DocumentText(text or "", rules.segment)
        if gopher_quality(doc, rules.gopher_quality, rules.stop_words, verdict=verdict) and not verdict.every:
            return None
        if gopher_repetition(doc, rules.gopher_repetition, verdict=verdict) and not verdict.every:
            return None
        edited, drop, words = c4_lines(doc, rules.c4, removed, verdict)
        if drop is not None and not verdict.every:
            return None
        # The option lists are found in the page as it came: C4 cuts an entry's bare term line.
        entries = option_entries(doc.lines) if rules.fineweb.line_punct_prose_only else frozenset()
        if edited is None:  # explain mode: a document C4 drops is still measured by FineWeb, unedited
            edited, words = doc.text, (len(doc.words) if doc.segment is not None else None)
            fineweb_quality(edited, rules.fineweb, words, entries, verdict=verdict)
            return None
        fineweb_quality(edited, rules.fineweb, words, entries, verdict=verdict)
        return edited if not verdict.drops else None

    def apply(
        self, text: str | None, url: str | None, removed: Counter, language: str | None = None
    ) -> tuple[str | None, Drop | None]:
        """(text to keep, None) or (None, the first rule that drops the document)."""
        verdict = Verdict(self.rules_for(language).off)
        edited = self._evaluate(text, url, removed, language, verdict)
        return edited, verdict.first_since(0)

    def explain(self, text: str | None, url: str | None, language: str | None = None) -> list[Drop]:
        """Every rule the document fails, in the order the rules run (not only the first)."""
        verdict = Verdict(self.rules_for(language).off, every=True)
        self._evaluate(text, url, Counter(), language, verdict)
        return verdict.drops

    def process(self, record: dict[str, Any], counters: Counter) -> Outcome:
        """The kept text, or the first rule that drops the document with every other rule it fails:
        a dropped document (a few in ten) is measured again in explain mode, so the stage's counters
        stay those of the first failure while its reject lists them all."""
        edited, drop = self.apply(record["text"], record["url"], counters, record.get("language"))
        if drop is None:
            return {"text": edited}
        every = self.explain(record["text"], record["url"], record.get("language"))
        others = [f for f in every if f.rule != drop.rule]
        return drop._replace(others=tuple((f.rule, f.value) for f in others))

    def config_summary(self) -> dict[str, Any]:
        return {**self.cfg.model_dump(mode="json"), "source_rules_off": sorted(self.rules_off)}
