"""Splitting a document into lines, paragraphs and words, once, for every rule that needs them.

Words are runs of word characters or runs of punctuation (`\\w+|[^\\w\\s]+`): "Hello, world." gives
`Hello , world .`, which is what datatrove's spaCy word tokenizer gives for ordinary prose, at
regex speed (spaCy splitting is about 85% of datatrove's filter cost, see ANCHORS). The near-dedup
stage shingles the same words, so the two stages agree on what a word is.
"""

from __future__ import annotations

import re
from functools import cached_property

WORD = re.compile(r"\w+|[^\w\s]+")
_LINE_RUNS = re.compile(r"\n+")
_PARAGRAPH_BREAK = re.compile(r"\n{2,}")


def split_words(text: str) -> list[str]:
    """Word and punctuation tokens, in order."""
    return WORD.findall(text)


class DocumentText:
    """One document's text and its splits, each computed on first use and then shared."""

    def __init__(self, text: str):
        self.text = text

    @cached_property
    def words(self) -> list[str]:
        return split_words(self.text)

    @cached_property
    def alnum_words(self) -> list[str]:
        """Tokens that are not pure punctuation (datatrove's "non-symbol words"). A token is either
        all word characters or all punctuation, and `\\w` is `str.isalnum()` plus "_", so the first
        character decides."""
        return [w for w in self.words if w[0].isalnum() or w[0] == "_"]

    @cached_property
    def whitespace_words(self) -> list[str]:
        """`str.split()`: words as the Gopher paper counts them, punctuation attached."""
        return self.text.split()

    @cached_property
    def lines(self) -> list[str]:
        """`str.splitlines()`: every line, empty ones included."""
        return self.text.splitlines()

    @cached_property
    def line_runs(self) -> list[str]:
        """The text split on runs of newlines (Gopher's line unit for repetition)."""
        return _LINE_RUNS.split(self.text)

    @cached_property
    def paragraphs(self) -> list[str]:
        """The stripped text split on blank lines (Gopher's paragraph unit)."""
        return _PARAGRAPH_BREAK.split(self.text.strip())
