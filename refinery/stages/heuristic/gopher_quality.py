"""Gopher quality (Rae et al. 2021, A.1; datatrove GopherQualityFilter): word count, mean word
length, symbol ratios, bullet and ellipsis lines, alphabetic words, stop words
(`gopher_quality/<rule>`), on the document's whitespace words.

Where we differ from datatrove's code: words are whitespace-separated, as the paper counts them
(datatrove counts spaCy tokens, so punctuation tokens push clean technical prose under the
alphabetic-words threshold). A language written without spaces reads its segmenter's words.
"""

from __future__ import annotations

from itertools import compress
from operator import not_

from refinery.config import GopherQualityConfig
from refinery.stages.heuristic.verdict import Verdict, over, rule_family, under
from refinery.stages.stopwords import GOPHER_STOP_WORDS
from refinery.stages.text import DocumentText

BULLETS = ("•", "-")
ELLIPSES = ("...", "…")


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
    if n < cfg.min_words and v.fail("gopher_quality/min_words", n, under(cfg.min_words)):
        return
    if n > cfg.max_words and v.fail("gopher_quality/max_words", n, over(cfg.max_words)):
        return
    if n:
        avg = (sum(map(len, words)) - sum(map(len, symbols))) / n
        if avg < cfg.min_avg_word_length and v.fail(
            "gopher_quality/min_avg_word_length", avg, under(cfg.min_avg_word_length)
        ):
            return
        if avg > cfg.max_avg_word_length and v.fail(
            "gopher_quality/max_avg_word_length", avg, over(cfg.max_avg_word_length)
        ):
            return
    total = len(words)
    if not total:
        return  # no word and no line: nothing else to measure

    text = doc.text
    ratio = text.count("#") / total
    if ratio > cfg.max_symbol_word_ratio and v.fail(
        "gopher_quality/hash_ratio", ratio, over(cfg.max_symbol_word_ratio)
    ):
        return
    ratio = (text.count("...") + text.count("…")) / total
    if ratio > cfg.max_symbol_word_ratio and v.fail(
        "gopher_quality/ellipsis_ratio", ratio, over(cfg.max_symbol_word_ratio)
    ):
        return

    lines = doc.lines
    ratio = sum(1 for line in lines if line.lstrip().startswith(BULLETS)) / len(lines)
    if ratio > cfg.max_bullet_lines_ratio and v.fail(
        "gopher_quality/bullet_lines_ratio", ratio, over(cfg.max_bullet_lines_ratio)
    ):
        return
    ratio = sum(1 for line in lines if line.rstrip().endswith(ELLIPSES)) / len(lines)
    if ratio > cfg.max_ellipsis_lines_ratio and v.fail(
        "gopher_quality/ellipsis_lines_ratio", ratio, over(cfg.max_ellipsis_lines_ratio)
    ):
        return

    # Whitespace words, as in the paper. datatrove counts spaCy tokens, so every comma and bracket is
    # a non-alphabetic word there; on the sample's documentation pages that alone put clean text at
    # 0.67-0.80, under the 0.8 threshold.
    alpha = sum(map(str.isalpha, words))
    alpha += sum(1 for w in compress(words, map(not_, map(str.isalpha, words))) if any(map(str.isalpha, w)))
    ratio = alpha / total
    if ratio < cfg.min_alpha_words_ratio and v.fail(
        "gopher_quality/alpha_words_ratio", ratio, under(cfg.min_alpha_words_ratio)
    ):
        return
    if stop_words is not None:
        found = len(stop_words.intersection(words))
        if found < cfg.min_stop_words:
            v.fail("gopher_quality/stop_words", found, under(cfg.min_stop_words))
