"""Gopher repetition (Rae et al. 2021, table A1; datatrove GopherRepetitionFilter): duplicate
paragraphs and lines (by count and by characters), the most frequent 2-4-grams, and characters in
duplicated 5-10-grams (`gopher_rep/<rule>`, the n-gram rules named per n: `top_<n>_gram`,
`dup_<n>_gram`).

Where we differ from datatrove's code: n-grams are of regex tokens (words and runs of punctuation,
refinery/stages/text.py), not spaCy's; repeated n-grams are compared as word sequences, where
datatrove joins words without a separator (so "ab c" and "a bc" collide there).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from refinery.config import GopherRepetitionConfig
from refinery.stages.heuristic.verdict import Verdict, over, rule_family
from refinery.stages.text import DocumentText


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
        self._repeated_bigrams: np.ndarray | None = None  # prefix counts of bigrams that repeat

    def level(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every n-gram position: its id; and per id, its first position and its count.

        Words already carry ids numbered in order of first occurrence. An n-gram can occur twice
        only if the (n-1)-grams at its start and one word later both do, so only those positions
        are grouped (sorted); every other n-gram occurs once and gets an id of its own. Ids are
        labels: the rules compare them, count them and read first positions, never their values."""
        if n not in self._levels:
            if n == 1:
                words = self.words
                seen = np.maximum.accumulate(words[:-1]) if len(words) > 1 else words[:0]
                first = np.flatnonzero(np.concatenate((words[:1] >= 0, words[1:] > seen)))
                self._levels[1] = (words, first, np.bincount(words, minlength=len(first)))
            else:
                prev, _, prev_counts = self.level(n - 1)
                repeats = prev_counts[prev] > 1
                maybe = np.flatnonzero(repeats[:-1] & repeats[1:])
                once = np.flatnonzero(~(repeats[:-1] & repeats[1:]))
                key = prev[maybe] * self.vocab + self.words[maybe + (n - 1)]
                _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True,
                                                      return_counts=True)
                ids = np.empty(len(prev) - 1, dtype=np.int64)
                ids[maybe] = inverse.reshape(-1)
                ids[once] = np.arange(len(counts), len(counts) + len(once))
                self._levels[n] = (ids, np.concatenate((maybe[first], once)),
                                   np.concatenate((counts, np.ones(len(once), dtype=counts.dtype))))
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
            if self._repeated_bigrams is None:
                ids, _, counts = self.level(2)
                self._repeated_bigrams = np.concatenate(([0], np.cumsum(counts[ids] > 1)))
            repeated_bigram = self._repeated_bigrams
            candidate = (repeated_bigram[n - 1 : n - 1 + m] - repeated_bigram[:m]) == n - 1
            self._repeat_bounds[n] = self.covered_chars(candidate, n)
        return self._repeat_bounds[n]

    def covered_chars(self, starts: np.ndarray, n: int) -> int:
        """Characters of the words inside any n-gram window starting where `starts` is true."""
        if not starts.any():
            return 0
        m = len(starts)
        # Each window adds one from its first word and takes it back after its last: a word is
        # covered where the running sum is positive.
        edges = np.zeros(m + n, dtype=np.int32)
        edges[:m] += starts
        edges[n:] -= starts
        covered = np.cumsum(edges[: m + n - 1]) > 0
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
    ids, first, counts = grams.level(n)
    m = len(ids)
    bound = grams.covered_chars(first[ids] < np.arange(m), n)
    if bound <= limit:
        return bound
    # An n-gram that occurs once is never a repeat, and stepping over it changes nothing else, so
    # the scan visits only the positions of n-grams that occur more than once.
    maybe = np.flatnonzero(counts[ids] > 1)
    cum = grams.char_cumsum.tolist()
    seen: set[int] = set()
    idx, chars = 0, 0
    for pos, g in zip(maybe.tolist(), ids[maybe].tolist()):
        if pos < idx:
            continue  # inside the repeat just counted
        if g in seen:
            chars += cum[pos + n] - cum[pos]
            idx = pos + n
        else:
            seen.add(g)
    return chars


@rule_family
def gopher_repetition(v: Verdict, doc: DocumentText, cfg: GopherRepetitionConfig) -> None:
    text_len = max(1, len(doc.text))
    for unit, items in (("para", doc.paragraphs), ("line", doc.line_runs)):
        dup, chars = repeated(items)
        for rule, ratio in ((f"dup_{unit}_frac", dup / len(items)), (f"dup_{unit}_char_frac", chars / text_len)):
            limit = getattr(cfg, rule)
            if ratio > limit and v.fail(f"gopher_rep/{rule}", ratio, over(limit)):
                return

    words = doc.token_keys
    grams = NGrams(words)
    for n, frac in cfg.top_n_grams:
        n = int(n)
        if len(words) < n:
            continue
        ratio = top_ngram_chars(grams, n, frac * text_len) / text_len
        if ratio > frac and v.fail(f"gopher_rep/top_{n}_gram", ratio, over(frac)):
            return
    dup_rules = sorted((int(n), frac) for n, frac in cfg.dup_n_grams)
    for i, (n, frac) in enumerate(dup_rules):
        if len(words) < n or grams.repeat_bound(n) <= min(f for _, f in dup_rules[i:]) * text_len:
            break  # the bound only shrinks as n grows, so every remaining rule passes too
        ratio = duplicate_ngram_chars(grams, n, frac * text_len) / text_len
        if ratio > frac and v.fail(f"gopher_rep/dup_{n}_gram", ratio, over(frac)):
            return
