"""The order in which one pass reads an entry set: a keyed bijection over [0, N), computed for the
ordinals a chunk consumes, never materialized for the whole set.

The set's N positions are cut into blocks of `BLOCK` consecutive positions (the last one shorter).
Pass `epoch` visits the blocks in a seeded random order, and the positions inside each block in a
seeded random order of their own; the key is (seed, set key, epoch), and a block's inner order adds
the block. So ordinal o of pass e is one position, a pure function of (seed, key, e, o), computed in
O(1) amortized per ordinal with one block permutation (BLOCK entries) held at a time.

What randomness the order keeps, and what it gives up against a full permutation of the set:
- every pass is a permutation (each position exactly once), and passes differ (fresh keys);
- a block's members stay together in every pass: two entries in one block are read within BLOCK
  entries of each other, and the blocks are the same in every pass. The shards under a set were
  globally shuffled by `shuffled_shards`, so a block is a uniform sample of the bucket; the order a
  pass reads blocks in, and entries in a block, is fresh per pass.
- what it buys: a pass reads one block's few shards at a time, so the trainer's bounded shard pool
  and an S3 prefetch window follow the read position instead of touching every shard in every chunk.

`BandedOrder` is the order of a set whose positions are cut into consecutive bands (a phase ordered
by difficulty: refinery/curriculum/bands.py): a pass reads band 0's positions fully, then band 1's,
and so on, each band in a `PassOrder` of its own keyed by (seed, set key, band, epoch). It answers
the same questions as `PassOrder` with slots numbered across the bands, so the sampler reads both
alike; an unbanded set keeps the plain `PassOrder`.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

# 65,536 entries (about 18M tokens at 280 tokens an entry: 4-5 shards of 4M tokens) per block; one
# block permutation is 256-512 KiB.
BLOCK = 1 << 16


def key_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


class PassOrder:
    """Ordinal -> position of one pass over N positions (see the module doc)."""

    def __init__(self, n: int, seed: int, key: str, epoch: int, block: int = BLOCK):
        self.n, self.block, self.epoch = n, block, epoch
        self._key = [seed, key_hash(key), epoch]
        self.blocks = -(-n // block)
        self.block_order = np.random.default_rng(self._key).permutation(self.blocks) if n else np.zeros(0, np.int64)
        last = self.blocks - 1
        # Every block holds `block` positions but the last, which may be shorter: where the pass
        # reads it decides where the ordinals of the blocks after it start.
        self._short_at = int(np.flatnonzero(self.block_order == last)[0]) if n else 0
        self._short = n - last * block if n else 0
        self._inner: dict[int, np.ndarray] = {}
        self._slot_of_block: np.ndarray | None = None  # block -> its slot, built when `ordinals` is first asked

    def block_size(self, b: int) -> int:
        return self._short if b == self.blocks - 1 else self.block

    def inner(self, b: int) -> np.ndarray:
        """Block b's inner order (positions relative to the block's first). The two most recent are
        kept: a chunk reads within at most two blocks unless a set is smaller than a chunk."""
        got = self._inner.get(b)
        if got is None:
            got = np.random.default_rng([*self._key, b]).permutation(self.block_size(b))
            if len(self._inner) >= 2:
                self._inner.pop(next(iter(self._inner)))
            self._inner[b] = got
        return got

    def slot_of(self, ordinals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into block_order, offset inside that block) of each ordinal."""
        o = np.asarray(ordinals, dtype=np.int64)
        B, q, r = self.block, self._short_at, self._short
        before = o < q * B
        after = o >= q * B + r
        shifted = o - (r - B)  # ordinals past the short block, as if it were full
        slot = np.where(before, o // B, np.where(after, shifted // B, q))
        offset = np.where(before, o % B, np.where(after, shifted % B, o - q * B))
        return slot, offset

    def slot_start(self, slot: int) -> int:
        """The first ordinal the pass reads from the block at `slot` of its block order."""
        B, q, r = self.block, self._short_at, self._short
        return slot * B if slot <= q else q * B + r + (slot - q - 1) * B

    def slot_positions(self, slot: int) -> np.ndarray:
        """The positions the pass reads from the block at `slot`, in order (int64)."""
        b = int(self.block_order[slot])
        return b * self.block + self.inner(b).astype(np.int64)

    def positions(self, ordinals: np.ndarray) -> np.ndarray:
        """The set positions (int64) read at `ordinals` of this pass, each in [0, n)."""
        o = np.asarray(ordinals, dtype=np.int64)
        if len(o) and (o.min() < 0 or o.max() >= self.n):
            raise IndexError(f"ordinals outside the pass of {self.n} positions")
        slot, offset = self.slot_of(o)
        blocks = self.block_order[slot]
        out = np.empty(len(o), dtype=np.int64)
        # Ordinals of a chunk are consecutive, so they span few blocks: one permutation lookup each.
        for b in np.unique(blocks).tolist():
            m = blocks == b
            out[m] = b * self.block + self.inner(b)[offset[m]]
        return out

    def ordinals(self, positions: np.ndarray) -> np.ndarray:
        """The ordinals (int64) at which this pass reads `positions`: the inverse of `positions`,
        one inner permutation inverted per block the positions fall in."""
        p = np.asarray(positions, dtype=np.int64)
        if len(p) and (p.min() < 0 or p.max() >= self.n):
            raise IndexError(f"positions outside the pass of {self.n} positions")
        if self._slot_of_block is None:
            self._slot_of_block = np.argsort(self.block_order)
        blocks = p // self.block
        slot = self._slot_of_block[blocks]
        B, q, r = self.block, self._short_at, self._short
        out = np.where(slot <= q, slot * B, q * B + r + (slot - q - 1) * B)
        for b in np.unique(blocks).tolist():
            perm = self.inner(b)
            inverse = np.empty(len(perm), dtype=np.int64)
            inverse[perm] = np.arange(len(perm), dtype=np.int64)
            m = blocks == b
            out[m] += inverse[p[m] - b * B]
        return out

    def spans_from(self, ordinal: int, count: int) -> list[tuple[int, int]]:
        """The position ranges [lo, hi) of the blocks the pass reads from `ordinal` on, `count` of
        them (for prefetching)."""
        if not self.n or ordinal >= self.n:
            return []
        slot = int(self.slot_of(np.array([ordinal]))[0][0])
        return [(b * self.block, b * self.block + self.block_size(b)) for b in self.block_order[slot:slot + count].tolist()]


class BandedOrder:
    """Ordinal -> position of one pass over consecutive bands of `sizes` positions: the bands in
    order, each in its own PassOrder (see the module doc). Slot s is the s-th block of the pass,
    counted across the bands."""

    def __init__(self, sizes: list[int], seed: int, key: str, epoch: int, block: int = BLOCK):
        self.n, self.block, self.epoch = sum(sizes), block, epoch
        self.bands = [PassOrder(size, seed, f"{key}#band{k}", epoch, block) for k, size in enumerate(sizes)]
        self.origin = np.cumsum([0, *sizes])[:-1]  # each band's first position, which is also its first ordinal
        self.first_slot = np.cumsum([0, *(band.blocks for band in self.bands)])[:-1]

    def _band_of_ordinals(self, o: np.ndarray) -> np.ndarray:
        # the last band starting at or before each ordinal: an empty band starts where the next one does
        return np.searchsorted(self.origin, o, side="right") - 1

    def _band_of_slot(self, slot: int) -> int:
        return int(np.searchsorted(self.first_slot, slot, side="right")) - 1

    def slot_of(self, ordinals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        o = np.asarray(ordinals, dtype=np.int64)
        band = self._band_of_ordinals(o)
        slot, offset = np.empty(len(o), dtype=np.int64), np.empty(len(o), dtype=np.int64)
        for k in np.unique(band).tolist():
            m = band == k
            slot[m], offset[m] = self.bands[k].slot_of(o[m] - self.origin[k])
            slot[m] += self.first_slot[k]
        return slot, offset

    def slot_start(self, slot: int) -> int:
        k = self._band_of_slot(slot)
        return int(self.origin[k]) + self.bands[k].slot_start(slot - int(self.first_slot[k]))

    def slot_positions(self, slot: int) -> np.ndarray:
        k = self._band_of_slot(slot)
        return int(self.origin[k]) + self.bands[k].slot_positions(slot - int(self.first_slot[k]))

    def _per_band(self, values: np.ndarray, in_band: Callable[[PassOrder, np.ndarray], np.ndarray],
                  what: str) -> np.ndarray:
        """`in_band` of each value's band, on values (ordinals or positions) relative to the band's
        origin: a band's positions and its ordinals start at the same one."""
        v = np.asarray(values, dtype=np.int64)
        if len(v) and (v.min() < 0 or v.max() >= self.n):
            raise IndexError(f"{what} outside the pass of {self.n} positions")
        band = self._band_of_ordinals(v)
        out = np.empty(len(v), dtype=np.int64)
        for k in np.unique(band).tolist():
            m = band == k
            out[m] = self.origin[k] + in_band(self.bands[k], v[m] - self.origin[k])
        return out

    def positions(self, ordinals: np.ndarray) -> np.ndarray:
        return self._per_band(ordinals, PassOrder.positions, "ordinals")

    def ordinals(self, positions: np.ndarray) -> np.ndarray:
        return self._per_band(positions, PassOrder.ordinals, "positions")

    def spans_from(self, ordinal: int, count: int) -> list[tuple[int, int]]:
        """As PassOrder.spans_from, continuing into the next bands."""
        spans: list[tuple[int, int]] = []
        if ordinal >= self.n:
            return spans
        k = int(self._band_of_ordinals(np.array([ordinal]))[0])
        at = ordinal - int(self.origin[k])
        while len(spans) < count and k < len(self.bands):
            base = int(self.origin[k])
            spans += [(base + lo, base + hi) for lo, hi in self.bands[k].spans_from(at, count - len(spans))]
            k, at = k + 1, 0
        return spans
