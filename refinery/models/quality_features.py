"""The quality classifier's features: hashed word n-grams and text-shape signals of a batch of
texts, in CSR form (docs/quality.md).

Lower-cased `\\w+` words, their unigrams and bigrams (up to `ngram`), each hashed into one of
`num_features` buckets, plus SHAPE_SIGNALS signals of the text's shape that do not depend on its
language or script (words a line, lines ending a sentence, repeated lines, distinct words, the
commonest word's share, letters, digits, length, short lines, broken characters), each binned into
one of SHAPE_BINS rows after the n-gram buckets.

Hashing is our own (blake2b of each distinct word, then a fixed 64-bit mix for n-grams), never
Python's salted `hash()` or a library hash that may change between versions, so a saved model
scores the same features in any process.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from refinery.hashing import GOLDEN_GAMMA, splitmix64_finalizer

WORD_PATTERN = r"\w+"
# The shape signals count a Han, Hiragana or Katakana character as a word (those scripts write no
# spaces), any other run of word characters as one word, so words a line mean the same in any script.
SHAPE_WORD = r"[\p{Han}\p{Hiragana}\p{Katakana}]|\w+"
# A line ending a sentence, in Latin, Cyrillic, Greek and CJK punctuation (closing quotes allowed).
SENTENCE_END = r"[.!?;:\u3002\uff01\uff1f\uff1b\uff1a\u2026][\"'\u201d\u2019\u00bb)\]\u300d\u300f\uff09]*$"
# A UTF-8 continuation byte (0x80-0xBF) read as Latin-1 (U+0080-U+00BF) or as cp1252 (the same
# from 0xA0; 0x80-0x9F are these letters and marks, or a C1 control where cp1252 leaves the byte
# undefined, as browsers decode it).
_CONTINUATION = ("[\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u02c6\u02dc\u2013\u2014"
                 "\u2018-\u201a\u201c-\u201e\u2020-\u2022\u2026\u2030\u2039\u203a\u20ac\u2122]")
# A replacement character, or a whole UTF-8 sequence read as Latin-1 / cp1252, in any script: a lead
# byte read as a letter, then as many continuations as it announces. Two-byte leads 0xC2-0xDD are
# Latin accents ("Ã©"), symbols ("Â "), Greek ("Î±"), Cyrillic ("Ð¿"), Hebrew, Arabic and Persian
# ("Ø§Ù„"); three-byte leads 0xE0-0xEF are CJK ("ä¸­", "ã\u0081\u0082"), Indic, Thai, punctuation
# ("â€™"); four-byte leads 0xF0-0xF4 are emoji. Leads 0xDE-0xDF (Thaana, NKo) are left out: they read
# as Icelandic "Þ" and German "ß", which clean text puts before a closing quote ("Fuß“"). Clean
# text in a Latin-1 language has a lead letter followed by a continuation almost never; and "â€"
# alone is a quote whose last byte was lost.
BROKEN_CHARS = (f"\ufffd|[\u00c2-\u00dd]{_CONTINUATION}|[\u00e0-\u00ef]{_CONTINUATION}{{2}}"
                f"|[\u00f0-\u00f4]{_CONTINUATION}{{3}}|\u00e2\u20ac")
SHAPE_SIGNALS = 10
SHAPE_BINS = 8
SHAPE_ROWS = SHAPE_SIGNALS * SHAPE_BINS
BROKEN_SIGNAL = 9  # the signal holding the broken-character share
# The rule before the classifier: a text whose broken characters are at least 0.2% of its
# non-space characters scores 0. Clean text has none; UTF-8 read as Latin-1 turns every accented
# letter into a pair (German prose: about 1% of its characters) and every letter of Greek, Cyrillic,
# Arabic or CJK into a sequence (most of the text); one stray U+FFFD in a page stays under it.
BROKEN_RULE = 0.002

_MIX_MUL = np.uint64(GOLDEN_GAMMA)


@dataclass(frozen=True)
class Features:
    """Hashed n-gram buckets of a batch of documents in CSR form: document i owns
    `indices[indptr[i]:indptr[i+1]]`."""

    indices: np.ndarray  # bucket ids: int64, or int32 as read back from a FeatureSpill
    indptr: np.ndarray  # int64, len = documents + 1

    @property
    def num_docs(self) -> int:
        return len(self.indptr) - 1

    def rows(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The `(indices, offsets, per_sample_weights)` a sum-mode EmbeddingBag takes, for the
        documents `docs` in that order: each document's SHAPE_SIGNALS shape rows weigh 1, its n-grams
        1/n each (their mean)."""
        starts, ends = self.indptr[docs], self.indptr[docs + 1]
        lengths = ends - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        parts = [self.indices[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
        indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        position = np.arange(len(indices), dtype=np.int64) - np.repeat(offsets, lengths)
        grams = np.repeat(np.maximum(lengths - SHAPE_SIGNALS, 1), lengths).astype(np.float32)
        weights = np.where(position < SHAPE_SIGNALS, np.float32(1.0), np.float32(1.0) / grams)
        return indices.astype(np.int64, copy=False), offsets, weights.astype(np.float32, copy=False)

    def broken(self) -> np.ndarray:
        """True for documents over the broken-text rule, read from their broken-character shape row."""
        row = self.indices[self.indptr[:-1] + BROKEN_SIGNAL].astype(np.int64)
        return row % SHAPE_BINS >= BROKEN_RULE_BIN


def _word_hashes(words: pl.Series) -> np.ndarray:
    """A stable 64-bit hash per word; each distinct word is hashed once."""
    frame = words.to_frame("w")
    distinct = frame.unique(maintain_order=True).with_row_index("wid")
    ids = frame.join(distinct, on="w", how="left", maintain_order="left")["wid"].to_numpy()
    table = np.fromiter(
        (int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little") for w in distinct["w"]),
        dtype=np.uint64,
        count=distinct.height,
    )
    return table[ids]


def _bins(values: np.ndarray, edges: list[float]) -> np.ndarray:
    return np.searchsorted(np.asarray(edges, dtype=np.float64), values, side="right").astype(np.int64)


# Bin edges of each shape signal (SHAPE_BINS - 1 edges each; signal BROKEN_SIGNAL's bin 3 starts
# at BROKEN_RULE).
_FRACTION_EDGES = [0.05, 0.15, 0.3, 0.5, 0.7, 0.85, 0.95]
_SHAPE_EDGES = [
    [1.5, 2.5, 4, 6, 9, 14, 22],  # words a line
    _FRACTION_EDGES,  # share of lines ending a sentence
    [0.001, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7],  # share of lines repeating an earlier line
    [0.1, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8],  # distinct words / words
    [0.02, 0.04, 0.07, 0.1, 0.15, 0.25, 0.4],  # the commonest word's share of words
    [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95],  # letters / non-space characters
    [0.01, 0.03, 0.06, 0.1, 0.15, 0.25, 0.4],  # digits / non-space characters
    [20, 50, 100, 200, 400, 800, 1600],  # words
    _FRACTION_EDGES,  # share of lines of at most three words
    [1e-9, 0.001, BROKEN_RULE, 0.01, 0.03, 0.1, 0.3],  # broken characters / non-space characters
]
BROKEN_RULE_BIN = 3


def shape_rows(texts: pl.Series, num_features: int, max_chars: int) -> np.ndarray:
    """[documents, SHAPE_SIGNALS] feature rows (after the `num_features` n-gram buckets) of the
    binned shape signals of each text's first `max_chars` characters."""
    text = texts.cast(pl.String).fill_null("").str.slice(0, max_chars)
    lines = text.str.split("\n").list.eval(pl.element().str.strip_chars().filter(pl.element().str.strip_chars() != ""))
    words = text.str.to_lowercase().str.extract_all(SHAPE_WORD)
    columns = {
        "n_lines": lines.list.len(),
        "ends": lines.list.eval(pl.element().str.contains(SENTENCE_END)).list.sum(),
        "repeats": lines.list.eval(pl.element().is_first_distinct().not_()).list.sum(),
        "short": lines.list.eval(pl.element().str.count_matches(SHAPE_WORD) <= 3).list.sum(),
        "n_words": words.list.len(),
        "distinct": words.list.n_unique(),
        "top": words.list.eval(pl.element().value_counts().struct.field("count").max()).list.first(),
        # Letters and non-space characters are most of a text: counted as what is left once the
        # rest is removed, or by subtraction, not match by match (2-3x less CPU).
        "letters": text.str.replace_all(r"[^\p{L}]+", "").str.len_chars(),
        "digits": text.str.count_matches(r"\d"),
        "nonspace": text.str.len_chars() - text.str.count_matches(r"\s"),
        "broken": text.str.count_matches(BROKEN_CHARS),
    }
    f = {c: v.fill_null(0).to_numpy().astype(np.float64) for c, v in columns.items()}
    lines_n, words_n, chars_n = np.maximum(f["n_lines"], 1), np.maximum(f["n_words"], 1), np.maximum(f["nonspace"], 1)
    signals = [f["n_words"] / lines_n, f["ends"] / lines_n, f["repeats"] / lines_n, f["distinct"] / words_n,
               f["top"] / words_n, f["letters"] / chars_n, f["digits"] / chars_n, f["n_words"],
               f["short"] / lines_n, f["broken"] / chars_n]
    rows = np.stack([num_features + k * SHAPE_BINS + _bins(v, _SHAPE_EDGES[k]) for k, v in enumerate(signals)], axis=1)
    return rows.reshape(len(texts), SHAPE_SIGNALS)


def hash_features(texts: pl.Series, num_features: int, ngram: int, max_chars: int) -> Features:
    """Each text's SHAPE_SIGNALS shape rows (`shape_rows`), then its word 1..ngram-grams (null
    counts as empty, only the first `max_chars` characters are read) hashed into `num_features`
    buckets."""
    words_per_doc = (
        texts.cast(pl.String).fill_null("").str.slice(0, max_chars).str.to_lowercase().str.extract_all(WORD_PATTERN)
    )
    lengths = words_per_doc.list.len().fill_null(0).to_numpy().astype(np.int64)
    words = words_per_doc.explode().drop_nulls()
    hashes = _word_hashes(words) if len(words) else np.zeros(0, dtype=np.uint64)
    doc_of_word = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)

    num_docs = len(lengths)
    docs_parts, bucket_parts = [], []
    with np.errstate(over="ignore"):
        for n in range(1, ngram + 1):
            count = len(hashes) - n + 1
            if count <= 0:
                break
            same_doc = doc_of_word[:count] == doc_of_word[n - 1 :]
            gram = hashes[:count].copy()
            for k in range(1, n):
                gram = gram * _MIX_MUL + hashes[k : k + count]
            # The finalizer spreads the combined hash over all 64 bits before the modulo.
            gram = splitmix64_finalizer(gram ^ np.uint64(n))[same_doc]
            docs_parts.append(doc_of_word[:count][same_doc])
            bucket_parts.append(_bucket(gram, num_features))
    # Each part is already in document order; place it after the earlier parts' n-grams of the
    # same document (unigrams, then bigrams, ...) instead of sorting the concatenation.
    part_counts = [np.bincount(d, minlength=num_docs) for d in docs_parts]
    counts = np.sum(part_counts, axis=0) if part_counts else np.zeros(num_docs, dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(counts + SHAPE_SIGNALS)]).astype(np.int64)
    indices = np.empty(int(indptr[-1]), dtype=np.int64)
    shape_at = indptr[:-1, None] + np.arange(SHAPE_SIGNALS)
    indices[shape_at.ravel()] = shape_rows(texts, num_features, max_chars).ravel()
    filled = indptr[:-1] + SHAPE_SIGNALS
    for doc_ids, buckets, part in zip(docs_parts, bucket_parts, part_counts):
        first_in_part = np.cumsum(part) - part
        indices[filled[doc_ids] + np.arange(len(doc_ids)) - first_in_part[doc_ids]] = buckets
        filled += part
    return Features(indices=indices, indptr=indptr)


def _bucket(h: np.ndarray, num_features: int) -> np.ndarray:
    if num_features & (num_features - 1) == 0:
        return (h & np.uint64(num_features - 1)).astype(np.int64)
    return (h % np.uint64(num_features)).astype(np.int64)
