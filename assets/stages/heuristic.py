"""`heuristic_filtered`: URL blocklist, Gopher quality, Gopher repetition, C4 line rules and FineWeb
quality rules, with the published thresholds as defaults (see the sections of refinery/config.py).

Each document is split into words, lines and paragraphs once (`assets.stages.text.DocumentText`)
and every rule reads those splits. Rules run cheapest-to-reject first: URL, Gopher quality (which
also bounds document length before the n-gram work), Gopher repetition, C4, FineWeb. A document
failing several rules is reported under the first. Gopher rules see the text as extracted; FineWeb
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

import re
from collections import Counter
from itertools import compress
from operator import not_
from typing import Any

import numpy as np
import polars as pl

from assets.stages.base import Drop, Outcome, RecordStage
from assets.stages.text import DocumentText
from assets.stages.urls import blocked_suffix, url_host
from refinery.config import (
    C4Config,
    FineWebQualityConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    HeuristicConfig,
)

STAGE = "heuristic_filtered"

# Gopher's stop words (Rae et al. 2021, A.1): a document needs `min_stop_words` distinct ones.
STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
BULLETS = ("•", "-")
ELLIPSES = ("...", "…")

# C4 (Raffel et al. 2020; tensorflow_datasets c4_utils): what a kept line may end with, the marks
# cut from lines, and the policy phrases whose lines are removed.
C4_END_PUNCTUATION = (".", "?", "!", '"', "'")
C4_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
C4_POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
# A sentence ends at terminal punctuation (optionally closed by quotes or brackets) followed by
# spaces and more text on the same line.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*[^\S\n]+(?=\S)")

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
# Gopher quality (Rae et al. 2021, A.1)
# --------------------------------------------------------------------------------------------------


def gopher_quality(doc: DocumentText, cfg: GopherQualityConfig) -> Drop | None:
    words = doc.words
    # Words made only of symbols ("-", "|", "...") are not words for the count and the mean length
    # (datatrove's "non-symbol words"). Only the few words that are not all letters and digits are
    # inspected character by character; `compress` keeps the selection out of the interpreter loop.
    symbols = [w for w in compress(words, map(not_, map(str.isalnum, words))) if not any(map(str.isalnum, w))]
    n = len(words) - len(symbols)
    if n < cfg.min_words:
        return Drop("gopher_quality/min_words", n, _under(cfg.min_words))
    if n > cfg.max_words:
        return Drop("gopher_quality/max_words", n, _over(cfg.max_words))
    avg = (sum(map(len, words)) - sum(map(len, symbols))) / n
    if avg < cfg.min_avg_word_length:
        return Drop("gopher_quality/min_avg_word_length", avg, _under(cfg.min_avg_word_length))
    if avg > cfg.max_avg_word_length:
        return Drop("gopher_quality/max_avg_word_length", avg, _over(cfg.max_avg_word_length))

    text, total = doc.text, len(words)
    ratio = text.count("#") / total
    if ratio > cfg.max_symbol_word_ratio:
        return Drop("gopher_quality/hash_ratio", ratio, _over(cfg.max_symbol_word_ratio))
    ratio = (text.count("...") + text.count("…")) / total
    if ratio > cfg.max_symbol_word_ratio:
        return Drop("gopher_quality/ellipsis_ratio", ratio, _over(cfg.max_symbol_word_ratio))

    lines = doc.lines
    ratio = sum(1 for line in lines if line.lstrip().startswith(BULLETS)) / len(lines)
    if ratio > cfg.max_bullet_lines_ratio:
        return Drop("gopher_quality/bullet_lines_ratio", ratio, _over(cfg.max_bullet_lines_ratio))
    ratio = sum(1 for line in lines if line.rstrip().endswith(ELLIPSES)) / len(lines)
    if ratio > cfg.max_ellipsis_lines_ratio:
        return Drop("gopher_quality/ellipsis_lines_ratio", ratio, _over(cfg.max_ellipsis_lines_ratio))

    # Whitespace words, as in the paper. datatrove counts spaCy tokens, so every comma and bracket is
    # a non-alphabetic word there; on the sample's documentation pages that alone put clean text at
    # 0.67-0.80, under the 0.8 threshold.
    alpha = sum(map(str.isalpha, words))
    alpha += sum(1 for w in compress(words, map(not_, map(str.isalpha, words))) if any(map(str.isalpha, w)))
    ratio = alpha / total
    if ratio < cfg.min_alpha_words_ratio:
        return Drop("gopher_quality/alpha_words_ratio", ratio, _under(cfg.min_alpha_words_ratio))
    found = len(STOP_WORDS.intersection(words))
    if found < cfg.min_stop_words:
        return Drop("gopher_quality/stop_words", found, _under(cfg.min_stop_words))
    return None


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


def gopher_repetition(doc: DocumentText, cfg: GopherRepetitionConfig) -> Drop | None:
    text_len = max(1, len(doc.text))
    paragraphs = doc.paragraphs
    dup, chars = repeated(paragraphs)
    if dup / len(paragraphs) > cfg.dup_para_frac:
        return Drop("gopher_rep/dup_para_frac", dup / len(paragraphs), _over(cfg.dup_para_frac))
    if chars / text_len > cfg.dup_para_char_frac:
        return Drop("gopher_rep/dup_para_char_frac", chars / text_len, _over(cfg.dup_para_char_frac))
    lines = doc.line_runs
    dup, chars = repeated(lines)
    if dup / len(lines) > cfg.dup_line_frac:
        return Drop("gopher_rep/dup_line_frac", dup / len(lines), _over(cfg.dup_line_frac))
    if chars / text_len > cfg.dup_line_char_frac:
        return Drop("gopher_rep/dup_line_char_frac", chars / text_len, _over(cfg.dup_line_char_frac))

    words = doc.token_keys
    grams = NGrams(words)
    for n, frac in cfg.top_n_grams:
        n = int(n)
        if len(words) < n:
            continue
        ratio = top_ngram_chars(grams, n, frac * text_len) / text_len
        if ratio > frac:
            return Drop(f"gopher_rep/top_{n}_gram", ratio, _over(frac))
    dup_rules = sorted((int(n), frac) for n, frac in cfg.dup_n_grams)
    for i, (n, frac) in enumerate(dup_rules):
        if len(words) < n or grams.repeat_bound(n) <= min(f for _, f in dup_rules[i:]) * text_len:
            break  # the bound only shrinks as n grows, so every remaining rule passes too
        chars = duplicate_ngram_chars(grams, n, frac * text_len)
        if chars / text_len > frac:
            return Drop(f"gopher_rep/dup_{n}_gram", chars / text_len, _over(frac))
    return None


# --------------------------------------------------------------------------------------------------
# C4 line rules (Raffel et al. 2020, section 2.2)
# --------------------------------------------------------------------------------------------------


def c4_lines(doc: DocumentText, cfg: C4Config, removed: Counter) -> tuple[str | None, Drop | None]:
    """The text with C4's failing lines removed, or the drop; removed lines are counted by rule."""
    kept: list[str] = []
    for raw_line in doc.lines:
        line = raw_line.strip()
        # A line no longer than max_word_length cannot hold a longer word; most lines skip the check.
        if len(line) > cfg.max_word_length and any(len(w) > cfg.max_word_length for w in line.split()):
            removed["c4_lines/too_long_word"] += 1
            continue
        words = len(line.split(None, cfg.min_words_per_line))
        line = C4_CITATION.sub("", line) if "[" in line else line
        if cfg.filter_no_terminal_punct and (not line.endswith(C4_END_PUNCTUATION) or line.endswith("...")):
            removed["c4_lines/no_terminal_punct"] += 1
            continue
        if words < cfg.min_words_per_line:
            removed["c4_lines/too_few_words"] += 1
            continue
        lower = line.lower()
        if cfg.filter_lorem_ipsum and "lorem ipsum" in lower:
            return None, Drop("c4/lorem_ipsum", None, "'lorem ipsum' in a line")
        if cfg.filter_javascript and "javascript" in lower:
            removed["c4_lines/javascript"] += 1
            continue
        if cfg.filter_curly_bracket and "{" in line:
            return None, Drop("c4/curly_bracket", None, "'{' in a line")
        if cfg.filter_policy and any(p in lower for p in C4_POLICY_PHRASES):
            removed["c4_lines/policy"] += 1
            continue
        kept.append(line)
    text = "\n".join(kept)
    # Every kept line holds at least one sentence, so counting is needed only for a few lines.
    if len(kept) < cfg.min_num_sentences:
        sentences = len(kept) + len(_SENTENCE_END.findall(text))
        if sentences < cfg.min_num_sentences:
            return None, Drop("c4/too_few_sentences", sentences, _under(cfg.min_num_sentences))
    return text.strip(), None


# --------------------------------------------------------------------------------------------------
# FineWeb quality (Penedo et al. 2024, section 3.3; datatrove FineWebQualityFilter)
# --------------------------------------------------------------------------------------------------


def fineweb_quality(text: str, cfg: FineWebQualityConfig) -> Drop | None:
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return Drop("fineweb/empty", 0, "no non-blank line")
    ratio = sum(1 for line in lines if line[-1] in TERMINAL_PUNCTUATION) / len(lines)
    if ratio < cfg.line_punct_thr:
        return Drop("fineweb/line_punct_ratio", ratio, _under(cfg.line_punct_thr))
    ratio = sum(1 for line in lines if len(line) <= cfg.short_line_length) / len(lines)
    if ratio > cfg.short_line_thr:
        return Drop("fineweb/short_line_ratio", ratio, _over(cfg.short_line_thr))
    ratio = repeated(lines)[1] / max(1, len(text) - text.count("\n"))
    if ratio > cfg.char_duplicates_ratio:
        return Drop("fineweb/char_dup_ratio", ratio, _over(cfg.char_duplicates_ratio))
    newlines = text.count("\n")
    if newlines:
        ratio = newlines / max(1, len(text.split()))
        if ratio > cfg.new_line_ratio:
            return Drop("fineweb/list_ratio", ratio, _over(cfg.new_line_ratio))
    return None


# --------------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------------


class HeuristicFilter(RecordStage):
    """Every heuristic rule over each document; kept documents carry C4's line-filtered text."""

    name = STAGE
    family = "heuristic"
    skip_key = "heuristic"
    reads = ("text", "url")
    writes = {"text": pl.String()}

    def __init__(self, cfg: HeuristicConfig):
        self.cfg = cfg
        self.domains = frozenset(d.lower().strip(".") for d in cfg.url_blocklist)
        self.banned_words = frozenset(w.lower() for w in cfg.url_banned_words)

    def apply(self, text: str | None, url: str | None, removed: Counter) -> tuple[str | None, Drop | None]:
        """(text to keep, None) or (None, the first rule that drops the document)."""
        drop = url_rules(url, self.domains, self.banned_words)
        if drop is not None:
            return None, drop
        doc = DocumentText(text or "")
        drop = gopher_quality(doc, self.cfg.gopher_quality) or gopher_repetition(doc, self.cfg.gopher_repetition)
        if drop is not None:
            return None, drop
        edited, drop = c4_lines(doc, self.cfg.c4, removed)
        if drop is not None:
            return None, drop
        drop = fineweb_quality(edited, self.cfg.fineweb)
        return (None, drop) if drop is not None else (edited, None)

    def process(self, record: dict[str, Any], counters: Counter) -> Outcome:
        edited, drop = self.apply(record["text"], record["url"], counters)
        return drop if drop is not None else {"text": edited}

    def config_summary(self) -> dict[str, Any]:
        return self.cfg.model_dump(mode="json")
