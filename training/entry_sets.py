"""Entry sets: the entries a bucket serves in a phase, and the token stream read through them.

Each bucket is read through an *entry set*: the bucket's entries (all of them, or a phase's quality
selection), less the held-out ones, in an order (uniform, or difficulty bands read band by band:
`training.pass_order.BandedOrder`). The sets holding the same entries in any order form a *group*,
which owns one cursor in its token stream: pass 0's entries, then pass 1's, and so on up to
`max_epochs` passes. A pass's order is computed, not stored (`training.pass_order`: a keyed block
permutation), so the cursor is (stream position, pass, ordinal in the reading set's order, tokens into
that entry), and lengths are read only for the entries a chunk consumes. A row of seq_len L takes the
next L tokens of its group's stream, so an entry longer than L continues in the next row, and entries
are packed back to back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.pass_order import BandedOrder, PassOrder
from training.shard_pool import BucketIndex


@dataclass
class Pieces:
    """Where rows come from, one piece per (row, entry) run: tokens [a, b) of `entry`."""

    row: np.ndarray
    set_index: np.ndarray
    epoch: np.ndarray
    entry: np.ndarray
    a: np.ndarray
    b: np.ndarray
    shard: np.ndarray  # the entry's shard, by position in its bucket
    start: np.ndarray  # the entry's first token within that shard
    overlap: np.ndarray  # the entry's overlap prefix (tokens masked out of the loss)

    @classmethod
    def concat(cls, parts: list["Pieces"]) -> "Pieces":
        """The parts joined in row order; within a row the parts keep their given order."""
        if not parts:
            return cls(*(np.zeros(0, dtype=np.int64) for _ in cls.__dataclass_fields__))
        if len(parts) == 1:
            return parts[0]
        joined = cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))
        order = np.argsort(joined.row, kind="stable")
        return cls(*(getattr(joined, f)[order] for f in cls.__dataclass_fields__))


@dataclass(frozen=True)
class Cursor:
    """How far an entry set's stream was read: `position` tokens in all, the next token being token
    `offset` of the entry at `ordinal` of pass `epoch`'s order (ordinal == set size: the pass is done)."""

    position: int = 0
    epoch: int = 0
    ordinal: int = 0
    offset: int = 0

    def to_list(self) -> list[int]:
        return [self.position, self.epoch, self.ordinal, self.offset]


@dataclass
class StreamWindow:
    """Consecutive entries of an entry set's stream: those a chunk reads, the first perhaps begun
    before it. `start` is each entry's first token as a stream position."""

    entry: np.ndarray  # global entry ids of the bucket
    epoch: np.ndarray
    ordinal: np.ndarray
    start: np.ndarray
    length: np.ndarray
    shard: np.ndarray  # where each entry's tokens are (BucketIndex.table), read once for planning and gathering
    shard_start: np.ndarray
    overlap: np.ndarray

    @property
    def end(self) -> np.ndarray:
        return self.start + self.length

    def pieces(self, starts: np.ndarray, length: int, set_index: int, rows: np.ndarray) -> Pieces:
        """The pieces of rows that read `length` tokens from stream positions `starts`, in row order
        (`rows` ascending) and stream order within a row."""
        end = self.end
        k0 = np.searchsorted(end, starts, side="right")  # the first entry ending after the row starts
        n = np.searchsorted(self.start, starts + length, side="left") - k0  # entries starting before it ends
        k = np.repeat(k0, n) + ordinals(n)
        lo, hi = np.repeat(starts, n), np.repeat(starts + length, n)
        a = np.maximum(lo - self.start[k], 0)
        b = np.minimum(hi - self.start[k], self.length[k])
        return Pieces(np.repeat(rows, n), np.full(len(k), set_index), self.epoch[k], self.entry[k], a, b,
                      self.shard[k], self.shard_start[k], self.overlap[k])

    def cursor_table(self, positions: np.ndarray) -> np.ndarray:
        """int64 (len(positions), 4): the cursor (position, pass, ordinal, offset) at each stream
        position inside the window or at its end (past every entry: the next one)."""
        positions = np.asarray(positions, dtype=np.int64)
        k = np.searchsorted(self.end, positions, side="right")
        inside = k < len(self.end)
        at = np.minimum(k, len(self.end) - 1)
        return np.stack([positions, self.epoch[at], np.where(inside, self.ordinal[at], self.ordinal[at] + 1),
                         np.where(inside, positions - self.start[at], 0)], axis=1).astype(np.int64)

    def cursor_at(self, position: int) -> Cursor:
        return Cursor(*self.cursor_table(np.array([position]))[0].tolist())


@dataclass
class BlockTable:
    """One block of one pass, in the pass's order, less the entries earlier readers of the pass took
    (see `Handover`): each entry's ordinal, id, shard location and length, and the cumulative token
    count (len + 1) from the block's first entry."""

    end_ordinal: int  # the ordinal after the block's last, kept or not
    ordinal: np.ndarray  # int64, ascending
    ids: np.ndarray  # int64 global entry ids
    shard: np.ndarray  # int32 shard position in the bucket
    start: np.ndarray  # int64 first token within the shard
    length: np.ndarray  # int32
    overlap: np.ndarray  # int32
    cum: np.ndarray  # int64


class EntrySet:
    """The entries one bucket serves in a phase: the bucket's global entry ids, or a selection of
    them (sorted; memory-mapped), less the held-out ones. Set positions 0..size-1 name them in
    ascending id order; a pass reads the positions in the order of `order(epoch)`.

    An ordered set (a phase with `order`) is given its band file as the selection and the bands'
    sizes: the file is sorted within each band only, set positions run band by band, and each pass
    reads the bands in order, shuffled within each (`training.pass_order.BandedOrder`).

    Sets of one `group` hold the same entries in other orders (the bucket's entries, or one quality
    selection, read uniformly or by difficulty): they share one stream and its passes, so a pass
    begun in one order is finished in another (`Handover`)."""

    def __init__(self, key: str, bucket: str, index: BucketIndex, pass_tokens: int, max_epochs: float, seed: int,
                 selection: np.ndarray | None = None, heldout: np.ndarray | None = None,
                 band_sizes: list[int] | None = None, group: str | None = None):
        self.key, self.bucket, self.index = key, bucket, index
        self.group = key if group is None else group
        self.selection = selection
        self.max_epochs, self.seed = max_epochs, seed
        held = np.zeros(0, dtype=np.int64) if heldout is None else np.asarray(heldout, dtype=np.int64)
        self.band_sizes: list[int] | None = None
        if selection is not None:
            bounds = [0, len(selection)] if band_sizes is None else np.cumsum([0, *band_sizes]).tolist()
            found, removed, per_band = [], [], []
            needles = held.astype(selection.dtype)  # searching with another dtype would copy the file's ids
            for lo, hi in zip(bounds[:-1], bounds[1:]):  # a binary search per band: the file is never read whole
                at = np.searchsorted(selection[lo:hi], needles)
                inside = at < hi - lo
                inside[inside] = np.asarray(selection[lo + at[inside]]) == held[inside]
                found.append(held[inside])  # the held-out ids the band has, and their positions
                removed.append(lo + at[inside])
                per_band.append(hi - lo - int(inside.sum()))
            held, removed = np.concatenate(found), np.sort(np.concatenate(removed))
            base = len(selection)
            if band_sizes is not None:
                self.band_sizes = per_band
        else:
            bounds, removed, base = [0, index.total_entries], held, index.total_entries
        self._bounds = bounds  # where each band starts in the file (one band: the whole selection)
        self._removed = removed
        # Set position p is base position p + #{j : removed_j - j <= p}: the removed ones skipped.
        self._skip = removed - np.arange(len(removed), dtype=np.int64)
        self.size = base - len(removed)
        self.pass_tokens = int(pass_tokens) - (int(index.lengths(held).sum()) if len(held) else 0)
        self.limit = int(max_epochs * self.pass_tokens)
        self._orders: dict[int, PassOrder | BandedOrder] = {}
        self._blocks: dict[tuple[int, int], BlockTable] = {}

    def ids_at(self, positions: np.ndarray) -> np.ndarray:
        """Global entry ids (int64) at set positions."""
        base = np.asarray(positions, dtype=np.int64) + np.searchsorted(self._skip, positions, side="right")
        return base if self.selection is None else np.asarray(self.selection[base], dtype=np.int64)

    def positions_of(self, ids: np.ndarray) -> np.ndarray:
        """Set positions (int64) of global entry ids of the set: the inverse of `ids_at`, a binary
        search per band of the memory-mapped file (none without a selection)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.selection is None:
            base = ids
        else:
            base = np.full(len(ids), -1, dtype=np.int64)
            needles = ids.astype(self.selection.dtype)
            for lo, hi in zip(self._bounds[:-1], self._bounds[1:]):
                at = np.searchsorted(self.selection[lo:hi], needles)
                inside = at < hi - lo
                inside[inside] = np.asarray(self.selection[lo + at[inside]]) == ids[inside]
                base[inside] = lo + at[inside]
            if (base < 0).any():
                raise KeyError(f"entry set {self.key}: entries {ids[base < 0][:5].tolist()} are not in it")
        return base - np.searchsorted(self._removed, base)

    def ordinals_of(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """The ordinals at which pass `epoch` of this set's order reads global entry ids `ids`."""
        return self.order(epoch).ordinals(self.positions_of(ids))

    @property
    def ids(self) -> np.ndarray:
        """Every id of the set, ascending: O(size), for inspection; planning never calls it."""
        return self.ids_at(np.arange(self.size, dtype=np.int64))

    def order(self, epoch: int) -> PassOrder | BandedOrder:
        """Pass `epoch`'s order (the current and the previous pass are kept: a chunk crosses at most one
        pass boundary unless the set is smaller than a chunk, and then an order is cheap)."""
        got = self._orders.get(epoch)
        if got is None:
            got = (PassOrder(self.size, self.seed, self.key, epoch) if self.band_sizes is None
                   else BandedOrder(self.band_sizes, self.seed, self.key, epoch))
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders), None)
            self._orders[epoch] = got
        return got

    def block(self, epoch: int, slot: int, taken: tuple[tuple["EntrySet", int], ...] = ()) -> "BlockTable":
        """The entries pass `epoch` reads from the block at `slot` of its block order, with their
        shard locations and lengths, looked up once for the whole block (4 most recent kept). With
        `taken` ((set, n): set read the first n ordinals of its order in this pass), the entries
        those read are left out: a set's n-th ordinal is computed per entry, nothing is stored."""
        key = (epoch, slot, tuple((es.key, n) for es, n in taken))
        got = self._blocks.get(key)
        if got is None:
            order = self.order(epoch)
            ids = self.ids_at(order.slot_positions(slot))
            first = order.slot_start(slot)
            ordinal = first + np.arange(len(ids), dtype=np.int64)
            if taken:
                gone = np.zeros(len(ids), dtype=bool)
                for es, n in taken:
                    gone |= (ordinal if es is self else es.ordinals_of(epoch, ids)) < n
                ids, ordinal = ids[~gone], ordinal[~gone]
            shard, start, length, overlap = self.index.table(ids)
            cum = np.zeros(len(ids) + 1, dtype=np.int64)
            np.cumsum(length, out=cum[1:])
            got = BlockTable(first + len(gone) if taken else first + len(ids), ordinal, ids, shard.astype(np.int32),
                             start, length.astype(np.int32), overlap.astype(np.int32), cum)
            if len(self._blocks) >= 4:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[key] = got
        return got

    def window(self, cursor: Cursor, tokens: int, taken: tuple[tuple["EntrySet", int], ...] = (),
               carry: int | None = None) -> StreamWindow:
        """The entries the stream reads from `cursor` for `tokens` tokens, block by block. `taken`
        (see `block`) applies to the cursor's pass; `carry` is the entry the cursor is inside when a
        handover left it mid-way (read to its end first, under the cursor's ordinal)."""
        end = cursor.position + tokens
        epoch, ordinal, start = cursor.epoch, cursor.ordinal, cursor.position - cursor.offset
        parts: list[tuple[np.ndarray, ...]] = []
        if carry is not None:
            shard, first, length, overlap = self.index.table(np.array([carry], dtype=np.int64))
            parts.append((np.array([carry]), np.array([epoch]), np.array([ordinal]), np.array([start]), length, shard,
                          first, overlap))
            start, ordinal = start + int(length[0]), ordinal + 1
        while not parts or start < end:
            if ordinal >= self.size:
                if start != (epoch + 1) * self.pass_tokens:
                    raise ValueError(
                        f"entry set {self.key}: pass {epoch} holds {start - epoch * self.pass_tokens} tokens, the "
                        f"manifest says {self.pass_tokens}; rebuild phase_manifests"
                    )
                epoch, ordinal, taken = epoch + 1, 0, ()
            slot = int(self.order(epoch).slot_of(np.array([ordinal]))[0][0])
            blk = self.block(epoch, slot, taken)
            offset = int(np.searchsorted(blk.ordinal, ordinal))  # the first entry left at or after `ordinal`
            base = start - int(blk.cum[offset])  # stream position of the block's first token
            # entries through the first one that reaches `end` (or to the block's end)
            last = min(int(np.searchsorted(blk.cum, end - base, side="left")), len(blk.ids))
            sel = slice(offset, min(max(last, offset + 1), len(blk.ids)) if end > start else offset)
            n = sel.stop - sel.start
            parts.append((blk.ids[sel], np.full(n, epoch), blk.ordinal[sel], base + blk.cum[sel],
                          blk.length[sel].astype(np.int64), blk.shard[sel].astype(np.int64), blk.start[sel],
                          blk.overlap[sel].astype(np.int64)))
            if last < len(blk.ids) or base + int(blk.cum[-1]) >= end:
                break
            start, ordinal = base + int(blk.cum[-1]), blk.end_ordinal
        return StreamWindow(*(np.concatenate(column) for column in zip(*parts)))

    def upcoming_entries(self, cursor: Cursor, blocks: int = 2) -> list[tuple[int, int]]:
        """Global id ranges of the next `blocks` blocks the stream reads (to prefetch their shards)."""
        spans = []
        for lo, hi in self.order(cursor.epoch).spans_from(max(cursor.ordinal, 0), blocks):
            # a block's ids ascend (a band's file segment is sorted), so its first and last bound it
            first, last = self.ids_at(np.array([lo, hi - 1]))
            spans.append((int(first), int(last) + 1))
        return spans


def ordinals(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each c in `counts`, concatenated."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)

