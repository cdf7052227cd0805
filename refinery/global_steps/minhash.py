"""MinHash signatures, vectorised with numpy and bit-for-bit compatible with datasketch 2.x.

A document's shingles are its word `shingle_size`-grams (a document with fewer words than that is
one shingle of all its words; one with no words has no shingles and the empty signature, all
0xFFFFFFFF). Each shingle is hashed to 32 bits by `shingle_hash32`; the signature then follows
datasketch's default `affine32` scheme exactly: the 32-bit hash is pre-mixed with the MurmurHash3
finalizer and permutation k maps it to `a_k * h + b_k mod 2^32`, with (a, b) drawn from
`np.random.RandomState(seed)` the way `datasketch.MinHash(num_perm, seed)` draws them. So

    datasketch.MinHash(num_perm, seed, hashfunc=shingle_hash32).update_batch(shingles(words))

holds the same `hashvalues` as our row (tests/test_minhash.py checks it).

Why not datasketch's default sha1 per shingle: a Python-level hash call per shingle caps the whole
stage at about 1,000 documents/s. `shingle_hash32` is defined so that it vectorises: a polynomial
hash of each word's UTF-8 bytes mod 2^64 (computed for a whole batch at once from prefix sums),
mixed with the 64-bit MurmurHash3 finalizer, then a polynomial over the shingle's word hashes,
mixed again, keeping the top 32 bits. Words are found without building Python strings: runs of one
character class over the bytes (ASCII batches) or the UTF-32 code points (any other batch).
"""

from __future__ import annotations

import functools
import re
from typing import Iterator, Sequence

import numpy as np

from refinery.hashing import fmix64 as _fmix64
from refinery.hashing import fmix64_int as _fmix64_int
from refinery.stages.text import split_words

MASK64 = (1 << 64) - 1
# Odd multipliers, so they are invertible mod 2^64 (the prefix-sum trick divides by powers of P).
WORD_P = 0x9E3779B97F4A7C15
SHINGLE_Q = 0xC2B2AE3D27D4EB4F
WORD_P_INV = pow(WORD_P, -1, 1 << 64)
EMPTY_HASH = np.uint32(0xFFFFFFFF)
# Rows of the (shingles x permutations) matrix computed at once: 32k x 128 x 4 B = 16 MiB.
CHUNK_SHINGLES = 32_768


def shingle_words(text: str) -> list[str]:
    """The words a document is shingled on: the heuristics' words (`refinery.stages.text`), of the
    lowercased text. NUL characters are dropped first: the vectorised hash separates words by NUL."""
    return split_words(text.replace("\x00", "").lower())


# ---- reference (pure Python) definition of the shingle hash ---------------------------------------


def word_hash64(word: str) -> int:
    h = 0
    for byte in word.encode("utf-8"):
        h = (h * WORD_P + byte) & MASK64
    return _fmix64_int(h)


def shingle_hash32(shingle: Sequence[str]) -> int:
    """The 32-bit hash of one shingle (a sequence of words); the `hashfunc` to give datasketch."""
    h = 0
    for word in shingle:
        h = (h * SHINGLE_Q + word_hash64(word)) & MASK64
    return _fmix64_int(h) >> 32


def shingles(words: Sequence[str], size: int) -> list[tuple[str, ...]]:
    """The word `size`-grams of `words`; fewer words than `size` make one shingle of them all."""
    if not words:
        return []
    if len(words) < size:
        return [tuple(words)]
    return [tuple(words[i : i + size]) for i in range(len(words) - size + 1)]


# ---- vectorised ------------------------------------------------------------------------------------


def _fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


_POWERS: dict[int, np.ndarray] = {}


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) mod 2^64, from a cache that grows by doubling."""
    cached = _POWERS.get(base)
    if cached is None or cached.size < n:
        size = max(n, 2 * (cached.size if cached is not None else 1 << 16))
        seq = np.full(size, base, dtype=np.uint64)
        seq[0] = 1
        cached = _POWERS[base] = np.cumprod(seq, dtype=np.uint64)
    return cached[:n]


def _range_hashes(weighted: np.ndarray, after: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """`word_hash64` of the tokens [starts, ends) of a sequence of units (bytes or code points), from
    one prefix sum: `weighted[i]` is unit i's bytes' Horner hash times P^(bytes after unit i) in the
    whole sequence, and `after[t]` is the number of bytes after token t. Over a token, the sum of
    `weighted` is P^after times the token's Horner hash."""
    prefix = np.zeros(weighted.size + 1, dtype=np.uint64)
    np.cumsum(weighted, out=prefix[1:])
    return _fmix64((prefix[ends] - prefix[starts]) * _powers(WORD_P_INV, int(after.max(initial=0)) + 1)[after])


def _token_hashes(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """`word_hash64` of the byte ranges [starts, ends) of `buf`."""
    n = buf.size
    return _range_hashes(buf.astype(np.uint64) * _powers(WORD_P, n)[::-1], n - ends, starts, ends)


def word_hashes(words: list[str]) -> np.ndarray:
    """`word_hash64` of every word at once (uint64)."""
    if not words:
        return np.zeros(0, dtype=np.uint64)
    buf = np.frombuffer("\x00".join(words).encode("utf-8"), dtype=np.uint8)
    seps = np.flatnonzero(buf == 0)
    return _token_hashes(buf, np.concatenate(([0], seps + 1)), np.concatenate((seps, [buf.size])))


WHITESPACE, WORD_CHAR, PUNCTUATION = 0, 1, 2
STR_LOWER_ONLY = np.uint8(32)  # a flag bit above a code point's class and UTF-8 length


def _ascii_classes() -> np.ndarray:
    """Per ASCII byte: its class as `split_words` sees it."""
    classes = np.zeros(128, dtype=np.int8)
    for code in range(128):
        char = chr(code)
        if split_words(char):
            classes[code] = WORD_CHAR if split_words(char + "a") == [char + "a"] else PUNCTUATION
    return classes


_ASCII_CLASS = _ascii_classes()


def _code_point_classes(chars: str) -> np.ndarray:
    """Per character of `chars`: its class for `split_words`, read off the same regex classes (`\\w`
    and `\\s` of str patterns) run over them (a class belongs to one character, whatever its
    neighbours)."""
    classes = np.full(len(chars), PUNCTUATION, dtype=np.uint8)
    for pattern, cls in ((r"\w+", WORD_CHAR), (r"\s+", WHITESPACE)):
        for m in re.finditer(pattern, chars):
            classes[m.start() : m.end()] = cls
    return classes


# str.lower() maps every code point to exactly one, except U+0130 (to "i" and a combining dot) and
# U+03A3, whose lowercase depends on its neighbours (final sigma). Texts holding either, or a NUL
# (dropped, which moves the code points after it), are lowered by str.lower() itself.
_STR_LOWER_ONLY = ("\x00", "\u0130", "\u03a3")


def _lowercase(codes: np.ndarray) -> np.ndarray:
    """Per code point of `codes` (uint32): its lowercase as str.lower() gives it (U+0130 and U+03A3
    map to themselves; see _STR_LOWER_ONLY). Lowercase code points map to themselves, so a text
    already lowered by str.lower() passes through unchanged."""
    # U+0130 is swapped for a letter first so that every code point lowers to exactly one; final
    # sigma, the one lowercase that reads neighbours, is set apart below.
    chars = codes.tobytes().decode("utf-32-le", "surrogatepass").replace("\u0130", "a").lower()
    lowered = np.frombuffer(chars.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).copy()
    apart = (codes == 0x130) | (codes == 0x3A3)
    lowered[apart] = codes[apart]
    return lowered


def _utf8_terms(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per code point of `codes`: its UTF-8 length in bytes, and the Horner hash of those bytes mod
    2^64 (the term it adds to `word_hash64`), computed arithmetically from the UTF-8 bit layout."""
    c = codes.astype(np.uint64)
    length = (1 + (c >= 0x80).astype(np.uint8) + (c >= 0x800) + (c >= 0x10000)).astype(np.uint8)
    cont = np.uint64(0x80)
    six = np.uint64(0x3F)
    p = np.uint64(WORD_P)
    term = c.copy()  # one byte: the code point itself
    for size, lead in ((2, 0xC0), (3, 0xE0), (4, 0xF0)):
        sel = length == size
        cs = c[sel]
        h = np.uint64(lead) | (cs >> np.uint64(6 * (size - 1)))
        for shift in range(size - 2, -1, -1):
            h = h * p + (cont | ((cs >> np.uint64(6 * shift)) & six))
        term[sel] = h
    return length, term


@functools.cache
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The process's code-point tables (`_lowered_tables`) and which code points they hold yet:
    10 MB at most, filled only for the code points the batches meet (a whole-Unicode fill cost
    0.2 CPU-s in every process that hashed one non-ASCII batch)."""
    return np.zeros(0x110000, np.uint8), np.zeros(0x110000, np.uint64), np.zeros(0x110000, bool)


def _lowered_tables(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per code point c, of its lowercase l: l's `split_words` class, plus 4 times l's UTF-8 length,
    plus STR_LOWER_ONLY for the code points of _STR_LOWER_ONLY (uint8, one lookup for all three);
    and the Horner term of l's bytes (uint64). Indexed by code point; filled for every code point
    of `points` (uint32), and for those of earlier calls."""
    info, term, known = _tables()
    wanted = np.zeros(0x110000, bool)
    wanted[points] = True
    new = np.flatnonzero(wanted & ~known).astype(np.uint32)
    if new.size:
        lower = _lowercase(new)
        length, lower_term = _utf8_terms(lower)
        classes = _code_point_classes(lower.tobytes().decode("utf-32-le", "surrogatepass"))
        flags = np.isin(new, [ord(c) for c in _STR_LOWER_ONLY]).astype(np.uint8) * STR_LOWER_ONLY
        info[new] = classes | (length << 2) | flags
        term[new] = lower_term
        known[new] = True
    return info, term


def _runs(cls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[starts, ends) of the maximal runs of one non-whitespace class: the `split_words` tokens."""
    edge = np.concatenate(([True], cls[1:] != cls[:-1]))
    starts = np.flatnonzero(edge & (cls != WHITESPACE))
    ends = np.flatnonzero(np.concatenate((edge[1:], [True])) & (cls != WHITESPACE)) + 1
    return starts, ends


def _tokens_per_doc(texts: Sequence[str], starts: np.ndarray) -> np.ndarray:
    """How many of the token `starts` (positions in the texts joined by one space) each text holds."""
    doc_starts = np.cumsum([0] + [len(t) + 1 for t in texts[:-1]])
    return np.bincount(np.searchsorted(doc_starts, starts, side="right") - 1, minlength=len(texts)).astype(np.int64)


def _ascii_word_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Word hashes of prepared ASCII texts without building word strings, found on the bytes."""
    buf = np.frombuffer(" ".join(texts).encode("ascii"), dtype=np.uint8)
    starts, ends = _runs(_ASCII_CLASS.take(buf))  # take: about twice as fast as indexing here
    return _token_hashes(buf, starts, ends), _tokens_per_doc(texts, starts)


def _unicode_word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The same for any text, on its code points (UTF-32) without a UTF-8 copy: lowercased,
    classified and hashed by table. A code point's bytes enter the hash as one term
    (`_utf8_terms`), weighted by the bytes after it, so the hashes are those of the UTF-8 bytes."""
    prepared = texts
    points = np.frombuffer(" ".join(prepared).encode("utf-32-le"), dtype=np.uint32)
    info, term = _lowered_tables(points)
    unit = info.take(points)  # take: about twice as fast as indexing with uint32 positions
    if unit.max(initial=0) >= STR_LOWER_ONLY:
        prepared = [t.replace("\x00", "").lower() if any(c in t for c in _STR_LOWER_ONLY) else t for t in texts]
        points = np.frombuffer(" ".join(prepared).encode("utf-32-le"), dtype=np.uint32)
        info, term = _lowered_tables(points)  # str.lower() may give code points not met before
        unit = info.take(points)  # str.lower() leaves no flagged code point, so unit >> 2 is the length
    starts, ends = _runs(unit & np.uint8(3))
    byte_end = np.cumsum(unit >> np.uint8(2), dtype=np.int64)
    n = int(byte_end[-1]) if byte_end.size else 0
    weighted = term.take(points) * _powers(WORD_P, n + 1)[::-1][byte_end]  # P^(n - byte_end)
    return _range_hashes(weighted, n - byte_end[ends - 1], starts, ends), _tokens_per_doc(prepared, starts)


def document_word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The hashes of every document's `shingle_words`, concatenated in order, and per-document counts.
    ASCII documents are split on their bytes, the others on their code points; both give the
    `split_words` tokens (tests/test_minhash.py checks it)."""
    if all(t.isascii() for t in texts):
        return _ascii_word_hashes([t.replace("\x00", "").lower() for t in texts])
    return _unicode_word_hashes(texts)


def _window_hashes(fw: np.ndarray, size: int) -> np.ndarray:
    """For every start i with a full window, sum_t fw[i+t] Q^(size-1-t), mixed, top 32 bits."""
    count = fw.size - size + 1
    acc = np.zeros(count, dtype=np.uint64)
    q = np.uint64(SHINGLE_Q)
    for t in range(size):
        acc *= q
        acc += fw[t : t + count]
    return (_fmix64(acc) >> np.uint64(32)).astype(np.uint32)


def _permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch 2.x `affine32` parameters: odd a and any b, drawn in its order from RandomState(seed)."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


class MinHasher:
    """Signatures for batches of texts: `signatures(texts) -> uint32[len(texts), num_perm]`."""

    scheme = "affine32"

    def __init__(self, num_perm: int = 128, seed: int = 1, shingle_size: int = 5):
        if num_perm < 1 or shingle_size < 1:
            raise ValueError(f"num_perm ({num_perm}) and shingle_size ({shingle_size}) must be positive")
        self.num_perm = num_perm
        self.seed = seed
        self.shingle_size = shingle_size
        self.a, self.b = _permutations(num_perm, seed)

    def _batch_shingle_hashes(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """All shingle hashes of a batch, concatenated, and each document's count of them."""
        fw, counts = document_word_hashes(texts)
        k = self.shingle_size
        word_starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        per_doc = np.where(counts >= k, counts - k + 1, np.minimum(counts, 1))
        if fw.size < k:
            windows = np.zeros(0, np.uint32)
        else:
            windows = _window_hashes(fw, k)
        full = counts >= k
        # Windows that start inside a document and end inside it are that document's shingles.
        idx = np.repeat(word_starts[full], per_doc[full]) + _ranges(per_doc[full])
        out = np.empty(int(per_doc.sum()), dtype=np.uint32)
        out_starts = np.concatenate(([0], np.cumsum(per_doc)[:-1]))
        out[np.repeat(full, per_doc)] = windows[idx]
        for d in np.flatnonzero(~full & (counts > 0)):
            out[out_starts[d]] = _window_hashes(fw[word_starts[d] : word_starts[d] + counts[d]], int(counts[d]))[0]
        return out, per_doc

    def _permuted(self, hashes: np.ndarray) -> np.ndarray:
        """(num_perm, len(hashes)): permutations along rows, so the per-document minimum runs over
        contiguous memory (about 6x faster than reducing the transposed layout along axis 0)."""
        out = np.multiply(self.a[:, None], _fmix32(hashes)[None, :])
        out += self.b[:, None]
        return out

    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        """One signature row per text. Texts must be strings; callers decide what a null means."""
        return self.sketch(texts, 0)[0]

    def sketch(self, texts: Sequence[str], bottom_k: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """Signatures, and each text's bottom-k sketch: its `bottom_k` smallest distinct shingle
        hashes, sorted (the whole shingle-hash set when it has at most `bottom_k` members)."""
        sigs = np.full((len(texts), self.num_perm), EMPTY_HASH, dtype=np.uint32)
        bottoms: list[np.ndarray] = []
        for lo, hi in _batches(texts, 4 * CHUNK_SHINGLES):
            hashes, per_doc = self._batch_shingle_hashes(texts[lo:hi])
            self._reduce_into(sigs[lo:hi], hashes, per_doc)
            if bottom_k:
                bottoms.extend(_bottom_k(hashes, per_doc, bottom_k))
        return sigs, bottoms

    def _reduce_into(self, out: np.ndarray, hashes: np.ndarray, per_doc: np.ndarray) -> None:
        """Row-wise minimum of each document's permuted shingle hashes, at most CHUNK_SHINGLES
        rows of the permuted matrix at a time; a document longer than that is folded in chunks."""
        ends = np.cumsum(per_doc)
        starts = ends - per_doc
        d, n = 0, per_doc.size
        while d < n:
            if per_doc[d] > CHUNK_SHINGLES:
                acc = out[d]
                for c in range(starts[d], ends[d], CHUNK_SHINGLES):
                    np.minimum(acc, self._permuted(hashes[c : min(c + CHUNK_SHINGLES, ends[d])]).min(axis=1), out=acc)
                d += 1
                continue
            last = max(d + 1, int(np.searchsorted(ends, starts[d] + CHUNK_SHINGLES, side="right")))
            group = d + np.flatnonzero(per_doc[d:last] > 0)
            if group.size:
                block = self._permuted(hashes[starts[d] : ends[last - 1]])
                out[group] = np.minimum.reduceat(block, starts[group] - starts[d], axis=1).T
            d = last

    def to_datasketch(self, signature: np.ndarray):
        """A datasketch.MinHash holding `signature` (for use with datasketch's own LSH and tools)."""
        from datasketch import MinHash

        return MinHash(
            seed=self.seed, hashfunc=shingle_hash32, hashvalues=signature, permutations=(self.a, self.b),
            scheme=self.scheme,
        )


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """Concatenated aranges: [0..l0), [0..l1), ..."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts


def _batches(texts: Sequence[str], max_words: int) -> Iterator[tuple[int, int]]:
    """Consecutive [lo, hi) slices holding about `max_words` words each (estimated as characters
    / 6, so a batch is cut before splitting); a long text gets a batch of its own."""
    lo, budget = 0, 0
    for i, t in enumerate(texts):
        est = len(t) // 6 + 1
        if i > lo and budget + est > max_words:
            yield lo, i
            lo, budget = i, 0
        budget += est
    if lo < len(texts):
        yield lo, len(texts)


def _bottom_k(hashes: np.ndarray, per_doc: np.ndarray, k: int) -> list[np.ndarray]:
    """Per document, its k smallest distinct hashes, sorted; one sort for the whole batch."""
    doc = np.repeat(np.arange(per_doc.size, dtype=np.uint64), per_doc)
    # Sort then drop repeats: numpy 2's np.unique hashes first and is about 10x slower here.
    combined = np.sort((doc << np.uint64(32)) | hashes.astype(np.uint64))
    combined = combined[np.concatenate(([True], combined[1:] != combined[:-1]))]
    owner = (combined >> np.uint64(32)).astype(np.int64)
    distinct = np.bincount(owner, minlength=per_doc.size)
    first = np.cumsum(distinct) - distinct
    rank = np.arange(combined.size) - first[owner]
    kept = rank < k
    values = (combined[kept] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return np.split(values, np.cumsum(np.minimum(distinct, k))[:-1])


def bottom_k_jaccard(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """Jaccard of two sets from their bottom-k sketches (sorted, distinct): exact when both sets
    have at most k members, otherwise the bottom-k estimate (standard error sqrt(J(1-J)/k))."""
    union = np.union1d(a, b)[:k]
    if union.size == 0:
        return 1.0
    both = np.intersect1d(a, b, assume_unique=True)
    return float(np.isin(union, both, assume_unique=True).sum() / union.size)


@functools.lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int, false_positive_weight: float, false_negative_weight: float) -> tuple[int, int]:
    """(bands, rows) minimising the weighted false positive and negative areas, as datasketch's
    `MinHashLSH` optimiser picks them: the same integrals over the same candidates in the same
    order (bands, then rows), the first minimum kept. Integrated here by Gauss-Legendre quadrature
    rather than by importing datasketch.lsh, whose scipy import costs about 0.4 CPU-s in every
    process that dedups: the integrands are polynomials of degree bands x rows <= num_perm, which
    num_perm / 2 + 1 nodes integrate exactly. tests/test_minhash.py compares with datasketch."""
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)], dtype=np.float64)
    bands, rows = pairs[:, :1], pairs[:, 1:]
    nodes, weights = np.polynomial.legendre.leggauss(num_perm // 2 + 1)

    def area(lo: float, hi: float, miss: bool) -> np.ndarray:
        """Per candidate, the integral over [lo, hi] of P(not a candidate pair) (miss) or of P(a candidate pair)."""
        s = (hi - lo) / 2 * nodes + (hi + lo) / 2
        never = (1 - s**rows) ** bands
        return (hi - lo) / 2 * ((never if miss else 1 - never) @ weights)

    error = area(0.0, threshold, False) * false_positive_weight + area(threshold, 1.0, True) * false_negative_weight
    b, r = pairs[int(np.argmin(error))]
    return int(b), int(r)
