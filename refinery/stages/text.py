"""Splitting a document into lines, paragraphs and words, once, for every rule that needs them.

Two word splits, each for its users:

- `DocumentText.words` is `str.split()`: whitespace-separated words with punctuation attached, the
  unit the Gopher paper states its quality rules in (word count, mean length, alphabetic words,
  stop words). It is about six times faster than the regex below. For a language written without
  spaces the document carries a segmenter (refinery/stages/segment.py) instead: each line is
  segmented once (`line_words`, which C4's words-per-line rule reads too), and `words` and
  `token_keys` are those segments.
- `split_words` / `DocumentText.token_keys` are runs of word characters or runs of punctuation
  (`\\w+|[^\\w\\s]+`), so "Hello, world." is `Hello , world .`, as datatrove's spaCy tokenizer
  splits ordinary prose. Gopher's repetition rules count n-grams of these tokens, which keeps
  their verdicts on datatrove's side of a threshold, and MinHash shingles them
  (refinery/global_steps/minhash.py).
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Callable

WORD = re.compile(r"\w+|[^\w\s]+")
# WORD over ASCII bytes. str's \s also matches the separators \x1c-\x1f, bytes' does not: listed.
_ASCII_WORD = re.compile(rb"\w+|[^\w\s\x1c-\x1f]+")
_PARAGRAPH_BREAK = re.compile(r"\n{2,}")
_HAS_WORD_CHAR = re.compile(r"[^\W_]").search


def split_words(text: str) -> list[str]:
    """Word and punctuation tokens, in order."""
    return WORD.findall(text)


class DocumentText:
    """One document's text and its splits, each computed on first use and then shared."""

    def __init__(self, text: str, segment: Callable[[str], list[str]] | None = None):
        self.text = text
        self.segment = segment

    @cached_property
    def line_segments(self) -> list[list[str]]:
        """Each line's segments from the segmenter, punctuation included (whitespace words without one)."""
        split = self.segment or str.split
        return [split(line) for line in self.lines]

    @cached_property
    def line_words(self) -> list[list[str]]:
        """Each line's words: its segments less those of punctuation only, which a whitespace split
        would have attached to a neighbouring word."""
        if self.segment is None:
            return self.line_segments
        return [[w for w in line if _HAS_WORD_CHAR(w)] for line in self.line_segments]

    @cached_property
    def words(self) -> list[str]:
        """Whitespace-separated words, punctuation attached; the segmenter's words with one."""
        if self.segment is None:
            return self.text.split()
        return [w for line in self.line_words for w in line]

    @cached_property
    def token_keys(self) -> list[str] | list[bytes]:
        """The `split_words` tokens, for counting and comparing only: ASCII text is split as bytes,
        which gives the same tokens (with the same lengths) about twice as fast. A segmented
        document's tokens are its segments, which already split punctuation off."""
        if self.segment is not None:
            return [w for line in self.line_segments for w in line]
        if self.text.isascii():
            return _ASCII_WORD.findall(self.text.encode("ascii"))
        return split_words(self.text)

    @cached_property
    def lines(self) -> list[str]:
        """`str.splitlines()`: every line, empty ones included."""
        return self.text.splitlines()

    @cached_property
    def line_runs(self) -> list[str]:
        """The text split on runs of newlines (Gopher's line unit for repetition), as
        `re.split(r"\\n+", text)` gives it: empty pieces only at the ends."""
        parts = self.text.split("\n")
        if len(parts) <= 2:
            return parts
        return [parts[0], *filter(None, parts[1:-1]), parts[-1]]

    @cached_property
    def paragraphs(self) -> list[str]:
        """The stripped text split on blank lines (Gopher's paragraph unit)."""
        text = self.text.strip()
        # str.split is exact when no run of newlines is longer than two, and several times faster.
        return _PARAGRAPH_BREAK.split(text) if "\n\n\n" in text else text.split("\n\n")
