"""`heuristic_filtered`: URL blocklist, Gopher quality, Gopher repetition, C4 line rules and FineWeb
quality rules, with the published thresholds as defaults (see the sections of refinery/config.py).

Each document is split into words, lines and paragraphs once (`refinery.stages.text.DocumentText`)
and every rule reads those splits. Rules run cheapest-to-reject first: URL, Gopher quality (which
also bounds document length before the n-gram work), Gopher repetition, C4, FineWeb. A document
failing several rules is reported under the first; `HeuristicFilter.explain` lists every rule it
fails (`refinery funnel --explain`).

Each document is read with the settings of its language (the `language` column of
language_filtered; none reads as English): its word segmenter (refinery/stages/segment.py), its
stop words (refinery/stages/stopwords.py), its thresholds, and the rules switched off for it, for
its source, or stage-wide (`LanguageRules`; the table and the reasons are in docs/languages.md).
English keeps the published values. Gopher rules see the text as extracted; FineWeb
rules see the text after C4's line removal, as in the FineWeb pipeline.

C4 removes lines, not only documents (as datatrove's C4QualityFilter and FineWeb do): lines with a
word over `max_word_length` characters, with fewer than `min_words_per_line` words, mentioning
"javascript", or quoting a cookie/terms policy are dropped from the text, and Wikipedia citation
marks are cut; the document is kept if it still has `min_num_sentences` sentences. Removed lines
are counted under `c4_lines/<rule>` in the stage counters. "lorem ipsum" and "{" drop the whole
document. This keeps pages whose navigation crumbs and cookie banners survived extraction, and
feeds the FineWeb rules the same text FineWeb fed them.

Where our rules differ from datatrove's code: Gopher quality counts whitespace-separated words, as
the paper does (datatrove counts spaCy tokens, so punctuation tokens push clean technical prose
under the alphabetic-words threshold); repetition n-grams are regex tokens, not spaCy's (text.py);
repeated n-grams are compared as word sequences, where datatrove joins words without a separator
(so "ab c" and "a bc" collide there); sentences are counted by terminal punctuation followed by
whitespace rather than by spaCy's sentencizer.

Reasons are `<family>/<rule>` with the measured value in the reject row and the threshold in its
detail: url/blocklisted_domain, url/malformed, url/banned_word, gopher_quality/{min_words, max_words,
min_avg_word_length, max_avg_word_length, hash_ratio, ellipsis_ratio, bullet_lines_ratio,
ellipsis_lines_ratio, alpha_words_ratio, stop_words}, gopher_rep/{dup_para_frac,
dup_para_char_frac, dup_line_frac, dup_line_char_frac, top_<n>_gram, dup_<n>_gram},
c4/{lorem_ipsum, curly_bracket, too_few_sentences}, fineweb/{empty, line_punct_ratio,
short_line_ratio, char_dup_ratio, list_ratio}.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass
from itertools import compress
from operator import not_
from typing import Any, Callable

import numpy as np
import polars as pl

from refinery.stages.base import Drop, Outcome, RecordStage
from refinery.stages.segment import Segmenter, segmenter
from refinery.stages.stopwords import GOPHER_STOP_WORDS, stop_words
from refinery.stages.text import DocumentText
from refinery.stages.urls import blocked_suffix, url_host
from refinery.config import (
    C4Config,
    FineWebQualityConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    HeuristicConfig,
)

STAGE = "heuristic_filtered"

BULLETS = ("•", "-")
ELLIPSES = ("...", "…")

# C4 (Raffel et al. 2020; tensorflow_datasets c4_utils): what a kept line may end with, the marks
# cut from lines, and the policy phrases whose lines are removed.
C4_END_PUNCTUATION = (".", "?", "!", '"', "'")
C4_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
C4_POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
# A sentence ends at terminal punctuation (optionally closed by quotes or brackets) followed by
# spaces and more text on the same line; CJK full stops need no space after them.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*[^\S\n]+(?=\S)|[。！？]+[」』”’）]*(?=\S)")

# Sentence-final marks across scripts (from Unicode's Sentence_Terminal property, the common ones),
# which FineWeb's line-punctuation rule counts as a line ending in punctuation.
TERMINAL_PUNCTUATION = frozenset(
    ".!?‼‽⁇⁈⁉⸮։؟؞؝۔܀܁܂।॥၊။።፧፨᙮។៕᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟。．！？｡︒﹒﹖﹗꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫"
)


def _over(limit: float) -> str:
    return f"> {limit:g}"


def _under(limit: float) -> str:
    return f"< {limit:g}"


# --------------------------------------------------------------------------------------------------
# URL
# --------------------------------------------------------------------------------------------------

_URL_WORD = re.compile(r"[a-z0-9]+")


def url_rules(url: str | None, domains: frozenset[str], banned_words: frozenset[str]) -> Drop | None:
    """Blocklisted domains (and their subdomains), then banned words among the URL's words.
    A document without a URL has nothing to match; one whose host cannot be parsed
    (`http://[bad/x`) is `url/malformed` when there is a blocklist to check it against."""
    if not url:
        return None
    if domains:
        try:
            host = url_host(url)
        except ValueError as err:
            # Without its host the URL cannot be checked against the blocklist, so it is not let
            # through unchecked.
            return Drop("url/malformed", None, f"{err}: {url[:200]}")
        suffix = blocked_suffix(host, domains)
        if suffix is not None:
            return Drop("url/blocklisted_domain", None, suffix)
    if banned_words:
        hit = banned_words.intersection(_URL_WORD.findall(url.lower()))
        if hit:
            return Drop("url/banned_word", float(len(hit)), min(hit))
    return None


# --------------------------------------------------------------------------------------------------
# Verdicts: the first failing rule, or every one (explain mode)
# --------------------------------------------------------------------------------------------------


class Verdict:
    """The rules a document fails, in the order they run. Evaluation stops at the first failure
    unless `every` is set (explain mode); rules named in `off` are never recorded."""

    __slots__ = ("drops", "every", "off")

    def __init__(self, off: frozenset[str] = frozenset(), every: bool = False):
        self.drops: list[Drop] = []
        self.every = every
        self.off = off

    def fail(self, rule: str, value: float | None, detail: str) -> bool:
        """Record a failure; True when the caller should stop evaluating."""
        if rule in self.off:
            return False
        self.drops.append(Drop(rule, value, detail))
        return not self.every

    def first_since(self, start: int) -> Drop | None:
        return self.drops[start] if len(self.drops) > start else None


def rule_family(check: Callable[..., None]) -> Callable[..., Drop | None]:
    """`check(verdict, *args)` recording a family's failures, called as `family(*args,
    verdict=None)`: a fresh verdict when none is given; returns the family's first failure."""

    @functools.wraps(check)
    def run(*args: Any, verdict: Verdict | None = None, **kwargs: Any) -> Drop | None:
        v = Verdict() if verdict is None else verdict
        start = len(v.drops)
        check(v, *args, **kwargs)
        return v.first_since(start)

    return run


# --------------------------------------------------------------------------------------------------
# Gopher quality (Rae et al. 2021, A.1)
# --------------------------------------------------------------------------------------------------


@rule_family
def gopher_quality(
    v: Verdict, doc: DocumentText, cfg: GopherQualityConfig, stop_words: frozenset[str] | None = GOPHER_STOP_WORDS
) -> None:
    """Gopher's quality rules on `doc.words`. `stop_words` None switches the stop-word rule off (a
    language without a list)."""
    words = doc.words
    # Words made only of symbols ("-", "|", "...") are not words for the count and the mean length
    # (datatrove's "non-symbol words"). Only the few words that are not all letters and digits are
    # inspected character by character; `compress` keeps the selection out of the interpreter loop.
    symbols = [w for w in compress(words, map(not_, map(str.isalnum, words))) if not any(map(str.isalnum, w))]
    n = len(words) - len(symbols)
    if n < cfg.min_words and v.fail("gopher_quality/min_words", n, _under(cfg.min_words)):
        return
    if n > cfg.max_words and v.fail("gopher_quality/max_words", n, _over(cfg.max_words)):
        return
    if n:
        avg = (sum(map(len, words)) - sum(map(len, symbols))) / n
        if avg < cfg.min_avg_word_length and v.fail(
            "gopher_quality/min_avg_word_length", avg, _under(cfg.min_avg_word_length)
        ):
            return
        if avg > cfg.max_avg_word_length and v.fail(
            "gopher_quality/max_avg_word_length", avg, _over(cfg.max_avg_word_length)
        ):
            return
    total = len(words)
    if not total:
        return  # no word and no line: nothing else to measure

    text = doc.text
    ratio = text.count("#") / total
    if ratio > cfg.max_symbol_word_ratio and v.fail(
        "gopher_quality/hash_ratio", ratio, _over(cfg.max_symbol_word_ratio)
    ):
        return
    ratio = (text.count("...") + text.count("…")) / total
    if ratio > cfg.max_symbol_word_ratio and v.fail(
        "gopher_quality/ellipsis_ratio", ratio, _over(cfg.max_symbol_word_ratio)
    ):
        return

    lines = doc.lines
    ratio = sum(1 for line in lines if line.lstrip().startswith(BULLETS)) / len(lines)
    if ratio > cfg.max_bullet_lines_ratio and v.fail(
        "gopher_quality/bullet_lines_ratio", ratio, _over(cfg.max_bullet_lines_ratio)
    ):
        return
    ratio = sum(1 for line in lines if line.rstrip().endswith(ELLIPSES)) / len(lines)
    if ratio > cfg.max_ellipsis_lines_ratio and v.fail(
        "gopher_quality/ellipsis_lines_ratio", ratio, _over(cfg.max_ellipsis_lines_ratio)
    ):
        return

    # Whitespace words, as in the paper. datatrove counts spaCy tokens, so every comma and bracket is
    # a non-alphabetic word there; on the sample's documentation pages that alone put clean text at
    # 0.67-0.80, under the 0.8 threshold.
    alpha = sum(map(str.isalpha, words))
    alpha += sum(1 for w in compress(words, map(not_, map(str.isalpha, words))) if any(map(str.isalpha, w)))
    ratio = alpha / total
    if ratio < cfg.min_alpha_words_ratio and v.fail(
        "gopher_quality/alpha_words_ratio", ratio, _under(cfg.min_alpha_words_ratio)
    ):
        return
    if stop_words is not None:
        found = len(stop_words.intersection(words))
        if found < cfg.min_stop_words:
            v.fail("gopher_quality/stop_words", found, _under(cfg.min_stop_words))


# --------------------------------------------------------------------------------------------------
# Gopher repetition (Rae et al. 2021, table A1)
# --------------------------------------------------------------------------------------------------


def repeated(items: list[str]) -> tuple[int, int]:
    """(elements, characters) that repeat an earlier element: every occurrence after the first."""
    counts = Counter(items)
    if len(counts) == len(items):
        return 0, 0
    elements = chars = 0
    for item, c in counts.items():
        if c > 1:
            elements += c - 1
            chars += (c - 1) * len(item)
    return elements, chars


class NGrams:
    """A document's word n-grams as exact integer ids, plus cheap upper bounds that let most
    documents pass the repetition rules without grouping every n.

    Ids are built level by level: the id of an n-gram is the rank of (id of its first n-1 words,
    id of its last word), so equal ids mean equal word sequences, with no hashing and no string
    joins. The bounds rest on two facts: an n-gram occurs at most as often as its rarest word, and
    an n-gram that repeats is made of bigrams that all repeat."""

    def __init__(self, words: list[str] | list[bytes]):
        vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
        self.words = np.fromiter(map(vocab.__getitem__, words), np.int64, len(words))
        self.vocab = max(1, len(vocab))
        self.word_counts = np.bincount(self.words)[self.words] if len(words) else self.words
        lengths = np.fromiter(map(len, words), np.int64, len(words))
        self.lengths = lengths
        self.char_cumsum = np.concatenate(([0], np.cumsum(lengths)))
        self._levels: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._repeat_bounds: dict[int, int] = {}

    def level(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every n-gram position: its id; and per id, its first position and its count."""
        if n not in self._levels:
            if n == 1:
                key = self.words
            else:
                prev = self.level(n - 1)[0]
                key = prev[:-1] * self.vocab + self.words[n - 1 :]
            _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
            self._levels[n] = (inverse, first, counts)
        return self._levels[n]

    def chars(self, positions: np.ndarray | int, n: int) -> np.ndarray | int:
        """Characters of the n words starting at `positions`, without separators."""
        return self.char_cumsum[np.add(positions, n)] - self.char_cumsum[positions]

    def top_bound(self, n: int) -> int:
        """At least the characters of the most frequent n-gram times its count."""
        m = len(self.words) - n + 1
        rarest = self.word_counts[:m]
        for k in range(1, n):
            rarest = np.minimum(rarest, self.word_counts[k : k + m])
        spaced = self.chars(np.arange(m), n) + (n - 1)
        return int((rarest * spaced).max())

    def repeat_bound(self, n: int) -> int:
        """At least the characters of the words inside any n-gram that occurs more than once. It
        never grows with n: a window whose n bigrams all repeat holds two windows of n-1."""
        if n not in self._repeat_bounds:
            m = len(self.words) - n + 1
            ids, _, counts = self.level(2)
            repeated_bigram = np.concatenate(([0], np.cumsum(counts[ids] > 1)))
            candidate = (repeated_bigram[n - 1 : n - 1 + m] - repeated_bigram[:m]) == n - 1
            self._repeat_bounds[n] = self.covered_chars(candidate, n)
        return self._repeat_bounds[n]

    def covered_chars(self, starts: np.ndarray, n: int) -> int:
        """Characters of the words inside any n-gram window starting where `starts` is true."""
        if not starts.any():
            return 0
        m = len(starts)
        csum = np.concatenate(([0], np.cumsum(starts)))
        pos = np.arange(m + n - 1)
        covered = csum[np.minimum(pos + 1, m)] - csum[np.maximum(pos - n + 1, 0)] > 0
        return int(self.lengths[covered].sum())


def top_ngram_chars(grams: NGrams, n: int, limit: float) -> int:
    """Characters covered by the most frequent n-gram (joined with spaces) times its count; ties go
    to the n-gram seen first, as `Counter.most_common` does in datatrove. When a cheap upper bound
    is within `limit`, the bound is returned instead (never above `limit` when the exact value is
    not)."""
    bound = grams.top_bound(n)
    if bound <= limit:
        return bound
    ids, first, counts = grams.level(n)
    top = int(counts.max())
    pos = int(first[counts == top].min())
    return (int(grams.chars(pos, n)) + n - 1) * top


def duplicate_ngram_chars(grams: NGrams, n: int, limit: float) -> int:
    """Characters in n-grams that repeat an earlier n-gram, scanning left to right and jumping past
    each repeat (Gopher's definition, so overlapping repeats are not double counted).

    The scan is sequential, so it runs only when two vectorized upper bounds exceed `limit`: words
    inside n-grams whose bigrams all repeat, then words inside n-grams that do repeat. Below
    `limit` a bound is returned instead: 0 exactly when no n-gram repeats, and never above `limit`
    when the exact count is not."""
    bound = grams.repeat_bound(n)
    if bound <= limit:
        return bound
    ids, first, _ = grams.level(n)
    m = len(ids)
    bound = grams.covered_chars(first[ids] < np.arange(m), n)
    if bound <= limit:
        return bound
    seen: set[int] = set()
    idx, chars = 0, 0
    id_list = ids.tolist()
    while idx < m:
        g = id_list[idx]
        if g in seen:
            chars += int(grams.chars(idx, n))
            idx += n
        else:
            seen.add(g)
            idx += 1
    return chars


@rule_family
def gopher_repetition(v: Verdict, doc: DocumentText, cfg: GopherRepetitionConfig) -> None:
    text_len = max(1, len(doc.text))
    for unit, items in (("para", doc.paragraphs), ("line", doc.line_runs)):
        dup, chars = repeated(items)
        for rule, ratio in ((f"dup_{unit}_frac", dup / len(items)), (f"dup_{unit}_char_frac", chars / text_len)):
            limit = getattr(cfg, rule)
            if ratio > limit and v.fail(f"gopher_rep/{rule}", ratio, _over(limit)):
                return

    words = doc.token_keys
    grams = NGrams(words)
    for n, frac in cfg.top_n_grams:
        n = int(n)
        if len(words) < n:
            continue
        ratio = top_ngram_chars(grams, n, frac * text_len) / text_len
        if ratio > frac and v.fail(f"gopher_rep/top_{n}_gram", ratio, _over(frac)):
            return
    dup_rules = sorted((int(n), frac) for n, frac in cfg.dup_n_grams)
    for i, (n, frac) in enumerate(dup_rules):
        if len(words) < n or grams.repeat_bound(n) <= min(f for _, f in dup_rules[i:]) * text_len:
            break  # the bound only shrinks as n grows, so every remaining rule passes too
        ratio = duplicate_ngram_chars(grams, n, frac * text_len) / text_len
        if ratio > frac and v.fail(f"gopher_rep/dup_{n}_gram", ratio, _over(frac)):
            return


# --------------------------------------------------------------------------------------------------
# C4 line rules (Raffel et al. 2020, section 2.2)
# --------------------------------------------------------------------------------------------------


def c4_lines(
    doc: DocumentText, cfg: C4Config, removed: Counter, verdict: Verdict | None = None
) -> tuple[str | None, Drop | None, int | None]:
    """(text with C4's failing lines removed, None, its word count) or (None, the drop, None);
    removed lines are counted by rule. The word count is given only for a segmented document
    (None: count the text's whitespace words), so FineWeb's rules need not segment again.

    In explain mode (`verdict.every`) a document-level failure is recorded and the lines go on
    being checked, so every failing rule is reported."""
    v = Verdict() if verdict is None else verdict
    start = len(v.drops)
    off = v.off
    max_len = cfg.max_word_length
    check_long = "c4_lines/too_long_word" not in off
    check_few = "c4_lines/too_few_words" not in off
    check_js = cfg.filter_javascript and "c4_lines/javascript" not in off
    check_policy = cfg.filter_policy and "c4_lines/policy" not in off
    check_lorem, check_curly = cfg.filter_lorem_ipsum, cfg.filter_curly_bracket
    line_words = doc.line_words if doc.segment is not None else None
    kept: list[str] = []
    kept_words = 0
    for i, raw_line in enumerate(doc.lines):
        line = raw_line.strip()
        segments = line_words[i] if line_words is not None else None
        # A line no longer than max_word_length cannot hold a longer word; most lines skip the check.
        if check_long and len(line) > max_len and any(len(w) > max_len for w in (segments or line.split())):
            removed["c4_lines/too_long_word"] += 1
            continue
        words = len(segments) if segments is not None else len(line.split(None, cfg.min_words_per_line))
        line = C4_CITATION.sub("", line) if "[" in line else line
        if cfg.filter_no_terminal_punct and (not line.endswith(C4_END_PUNCTUATION) or line.endswith("...")):
            removed["c4_lines/no_terminal_punct"] += 1
            continue
        if check_few and words < cfg.min_words_per_line:
            removed["c4_lines/too_few_words"] += 1
            continue
        lower = line.lower()
        if check_lorem and "lorem ipsum" in lower:
            if v.fail("c4/lorem_ipsum", None, "'lorem ipsum' in a line"):
                return None, v.drops[start], None
            check_lorem = False
        if check_js and "javascript" in lower:
            removed["c4_lines/javascript"] += 1
            continue
        if check_curly and "{" in line:
            if v.fail("c4/curly_bracket", None, "'{' in a line"):
                return None, v.drops[start], None
            check_curly = False  # explain mode: reported once
        if check_policy and any(p in lower for p in C4_POLICY_PHRASES):
            removed["c4_lines/policy"] += 1
            continue
        kept.append(line)
        kept_words += words
    text = "\n".join(kept)
    # Every kept line holds at least one sentence, so counting is needed only for a few lines.
    if len(kept) < cfg.min_num_sentences:
        sentences = len(kept) + len(_SENTENCE_END.findall(text))
        if sentences < cfg.min_num_sentences:
            v.fail("c4/too_few_sentences", sentences, _under(cfg.min_num_sentences))
    first = v.first_since(start)
    if first is not None:
        return None, first, None
    return text.strip(), None, (kept_words if line_words is not None else None)


# --------------------------------------------------------------------------------------------------
# FineWeb quality (Penedo et al. 2024, section 3.3; datatrove FineWebQualityFilter)
# --------------------------------------------------------------------------------------------------


@rule_family
def fineweb_quality(v: Verdict, text: str, cfg: FineWebQualityConfig, words: int | None = None) -> None:
    """FineWeb's rules on C4's edited text; `words` is its word count when the caller has it (a
    segmented document), else its whitespace words are counted."""
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        v.fail("fineweb/empty", 0, "no non-blank line")
        return
    ratio = sum(1 for line in lines if line[-1] in TERMINAL_PUNCTUATION) / len(lines)
    if ratio < cfg.line_punct_thr and v.fail("fineweb/line_punct_ratio", ratio, _under(cfg.line_punct_thr)):
        return
    ratio = sum(1 for line in lines if len(line) <= cfg.short_line_length) / len(lines)
    if ratio > cfg.short_line_thr and v.fail("fineweb/short_line_ratio", ratio, _over(cfg.short_line_thr)):
        return
    ratio = repeated(lines)[1] / max(1, len(text) - text.count("\n"))
    if ratio > cfg.char_duplicates_ratio and v.fail("fineweb/char_dup_ratio", ratio, _over(cfg.char_duplicates_ratio)):
        return
    newlines = text.count("\n")
    if newlines:
        ratio = newlines / max(1, len(text.split()) if words is None else words)
        if ratio > cfg.new_line_ratio:
            v.fail("fineweb/list_ratio", ratio, _over(cfg.new_line_ratio))


# --------------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LanguageRules:
    """Everything the rules read for one language: its thresholds, stop words, word splitter, and
    the rules switched off (stage-wide, for the source, and for the language)."""

    language: str
    gopher_quality: GopherQualityConfig
    gopher_repetition: GopherRepetitionConfig
    c4: C4Config
    fineweb: FineWebQualityConfig
    stop_words: frozenset[str] | None
    segment: Segmenter | None
    off: frozenset[str]

    @classmethod
    def resolve(cls, cfg: HeuristicConfig, language: str | None, source_off: frozenset[str]) -> "LanguageRules":
        settings = cfg.language_heuristics(language)
        language = language or "en"

        def section(name: str, base: Any) -> Any:
            override = getattr(settings, name)
            return type(base).model_validate({**base.model_dump(), **override}) if override else base

        return cls(
            language=language,
            gopher_quality=section("gopher_quality", cfg.gopher_quality),
            gopher_repetition=section("gopher_repetition", cfg.gopher_repetition),
            c4=section("c4", cfg.c4),
            fineweb=section("fineweb", cfg.fineweb),
            stop_words=stop_words(language, settings.stop_words),
            segment=None if settings.segmenter == "whitespace" else segmenter(settings.segmenter),
            off=frozenset(cfg.rules_off) | source_off | frozenset(settings.rules_off),
        )


class HeuristicFilter(RecordStage):
    """Every heuristic rule over each document, read with the settings of the document's language
    (the `language` column); kept documents carry C4's line-filtered text. `rules_off` names rules
    switched off for this filter's source (SourceConfig.rules_off)."""

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
        self._rules: dict[str | None, LanguageRules] = {}

    def rules_for(self, language: str | None) -> LanguageRules:
        rules = self._rules.get(language)
        if rules is None:
            rules = self._rules[language] = LanguageRules.resolve(self.cfg, language, self.rules_off)
        return rules

    def _evaluate(self, text: str | None, url: str | None, removed: Counter, language: str | None,
                  verdict: Verdict) -> str | None:
        """The kept text, or None with the failures in `verdict`."""
        drop = url_rules(url, self.domains, self.banned_words)
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
        if edited is None:  # explain mode: a document C4 drops is still measured by FineWeb, unedited
            edited, words = doc.text, (len(doc.words) if doc.segment is not None else None)
            fineweb_quality(edited, rules.fineweb, words, verdict=verdict)
            return None
        fineweb_quality(edited, rules.fineweb, words, verdict=verdict)
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
        edited, drop = self.apply(record["text"], record["url"], counters, record.get("language"))
        return drop if drop is not None else {"text": edited}

    def config_summary(self) -> dict[str, Any]:
        return {**self.cfg.model_dump(mode="json"), "source_rules_off": sorted(self.rules_off)}
