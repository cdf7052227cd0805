"""The phase-aware, exactly-once sampler: one global order of rows, independent of world size and
worker count, plus the state that says how far it got.

How a row is chosen (OLMo-core's "global order plus a consumed count", made phase-aware):

- Exact mixtures. Each step's rows are allocated to buckets deterministically so that, at the end of
  every step, each bucket's rows in the phase so far stay within one row of its planned share
  (the sum of each step's mixture, boundary blending included). The allocation is earliest-deadline-
  first over "tickets": a bucket's j-th row falls due at the first step whose plan reaches j rows and
  may be served once the plan exceeds j - 1; each step takes the tickets that are due, then the
  earliest-due released ones (Megatron's blended dataset picks the largest sampling error row by row;
  deadlines give the same bound for mixtures that change from step to step). Plans are integers
  (weights quantised to 2^-32 of a row) so the bound holds exactly. The allocation is a pure function
  of the manifests, the global batch and the exhaustion drops, computed per chunk from the state at
  the chunk's start, so every rank and worker derives the same one without shared state.
- Within a step, the rows' slots are shuffled by a counter-based PRNG (splitmix64 of (seed, row)), so
  every rank's slice carries the mixture too.
- Each bucket is read through an *entry set*: the bucket's entries (all of them, or a phase's
  quality selection), less the held-out ones, in an order (uniform, or difficulty bands read band by
  band: `training.pass_order.BandedOrder`). The sets holding the same entries in any order form a
  *group*, which owns one cursor in its token stream: pass 0's entries, then pass 1's, and so on up
  to `max_epochs` passes. A pass's order is computed, not stored (`training.pass_order`: a keyed
  block permutation), so the cursor is (stream position, pass, ordinal in the reading set's order,
  tokens into that entry), and lengths are read only for the entries a chunk consumes. A row of
  seq_len L takes the next L tokens of its group's stream, so an entry longer than L continues in
  the next row, and entries are packed back to back.
- Cursors belong to groups, not phases: a bucket served in phase 1 continues in phase 2 from where
  it stopped (gpt-simple restarted it). A phase with a quality selection reads a different group
  with its own cursor, so the anneal slice gets its own passes; two phases with the same selection
  share one cursor, whatever their orders. A phase that reads the group in another order than the
  phase before goes on with the pass under way (`Handover`): the entries the pass took are left out
  of the new order, computed from their ordinals in the earlier orders, nothing stored per entry.
- A step that would run a set past its allowed passes raises `BucketExhausted` before anything is
  consumed; with exhaustion allowed, the bucket is dropped from that step on, the remaining weights
  renormalized, and the allocation restarts from the rows served so far.

Planning is per chunk (`plan_steps`): the row allocation of the chunk's steps from the state at its
start (rows served in the phase, the plan's offset from them), with deadlines read ahead as far as
they need; then each used set's stream is walked over the tokens the chunk takes. Every quantity a
state holds is per bucket or per entry set, so a resumed sampler continues without replaying.
The sampler only plans (which set, which stream position per row, which entries); `training.data`
reads tokens.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from refinery.hashing import splitmix64
from training.accounting import mixture_report
from training.pass_order import BandedOrder, PassOrder
from training.schedule import StepSchedule
from training.shard_pool import BucketIndex

# Version 4: cursors belong to groups of entry sets (one per bucket and selection, whatever the
# order), and `handovers` says what a pass begun in another order took. Version 3 (cursors per set)
# is read when it holds no ordered set's cursor: there the two mean the same. Version 3 computed
# pass orders block by block, version 2 held each pass as a full permutation, version 1 drew each
# row's bucket at random.
SAMPLER_STATE_VERSION = 4
# Plans count rows in units of 2^-32 of a row: exact integers, so "within one row" holds exactly.
PLAN_SCALE = 1 << 32
# Steps of the mixture read past a chunk's end for the allocation's deadlines; a deadline further
# out is searched for block by block, only when the order of the rows depends on it.
HORIZON_STEPS = 256
QUOTA_BLOCK = 4096  # steps of the quantized mixture computed at a time and shared by the chunks in them


class BucketExhausted(Exception):
    """A bucket has fewer tokens left (within its allowed passes) than the step asks of it."""

    def __init__(self, bucket: str, step: int, needed: int, left: int):
        self.bucket, self.step, self.needed, self.left = bucket, step, needed, left
        super().__init__(
            f"bucket {bucket!r} ran dry at step {step}: the step needs {needed} tokens, {left} are left within its "
            f"max_epochs; set curriculum.allow_bucket_exhaustion: true to drop it and renormalize, or raise "
            f"curriculum.buckets.{bucket}.max_epochs and rebuild the manifests"
        )


class SamplerStateError(ValueError):
    """A saved sampler state that does not fit this run; the message says what changed."""


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def row_keys(seed: int, rows: np.ndarray) -> np.ndarray:
    """One pseudo-random uint64 per global row index, a pure function of (seed, row)."""
    with np.errstate(over="ignore"):
        return splitmix64(splitmix64(np.uint64(stable_hash(f"seed:{seed}")) ^ rows.astype(np.uint64)))


# --------------------------------------------------------------------------------------------------
# Exact mixtures
# --------------------------------------------------------------------------------------------------


def quantize_rows(weights: np.ndarray, rows_per_step: int) -> np.ndarray:
    """Each step's planned rows per bucket in units of 1/PLAN_SCALE row, (steps, buckets) int64:
    proportional to `weights` (rows renormalized), each step summing exactly to rows_per_step rows.
    A step without any weight plans nothing."""
    total = rows_per_step * PLAN_SCALE
    sums = weights.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        exact = np.where(sums > 0, weights / sums * total, 0.0)
    q = np.floor(exact).astype(np.int64)
    short = np.where(sums[:, 0] > 0, total - q.sum(axis=1), 0)
    # The units floor() left over go to the largest remainders (at most one per bucket); a bucket
    # without weight ranks last, so float rounding never hands it a share.
    remainder = np.where(weights > 0, exact - q, -1.0)
    rank = np.argsort(np.argsort(-remainder, axis=1, kind="stable"), axis=1, kind="stable")
    return q + (rank < short[:, None])


def allocate_rows(quota: np.ndarray, rows_per_step: int, offset: np.ndarray | None = None, steps: int | None = None,
                  beyond: Callable[[int, int], int] | None = None) -> np.ndarray:
    """Rows per (step, bucket) for the first `steps` steps of `quota` (default all) such that after
    every step each bucket's rows A and plan P satisfy floor(P) <= A <= ceil(P): within one row.
    Everything is relative to the rows served before the first step: `offset` is each bucket's plan
    minus those rows, in 1/PLAN_SCALE units (within one row; default 0), and P adds the cumulative
    `quota`.

    Earliest deadline first: bucket b's j-th row is released once P_b > j - 1 and due at the first
    step where P_b >= j. Each step takes every due row, then fills the step with released rows by
    deadline (ties: the larger shortfall, then the lower bucket). Tijdeman's chairman assignment
    theorem says some order keeps every bucket within one row even when the mixture changes per step;
    EDF finds one whenever one exists, so the step is never over-full and never short.

    `quota` may run past `steps` so that the deadlines are seen; `beyond(b, units)`, when given,
    finds a deadline past the quota's end (the index, counted from the quota's first step, of the
    first step whose plan reaches `units`; the phase's length when none does). Without it a deadline
    past the end ties with every other one there, as at a phase's end."""
    horizon, n = quota.shape
    steps = horizon if steps is None else steps
    plan = np.cumsum(quota, axis=0)
    if offset is not None:
        plan += np.asarray(offset, dtype=np.int64)
    # Python ints and lists in the loop: for a handful of buckets a numpy call per step costs more.
    columns = [plan[:, b].tolist() for b in range(n)]  # for bisect
    targets = plan[:steps].tolist()
    rows = [0] * n
    served = []
    for s in range(steps):
        target = targets[s]
        need = [max(a, t // PLAN_SCALE) for a, t in zip(rows, target)]
        free = sum(rows) + rows_per_step - sum(need)
        if free:
            released = [b for b in range(n) if need[b] * PLAN_SCALE < target[b]]
            deadline = {b: bisect.bisect_left(columns[b], (need[b] + 1) * PLAN_SCALE, s + 1) for b in released}
            if beyond is not None and sum(d < horizon for d in deadline.values()) < free:
                # The rows go to deadlines past the quota too: their order decides which.
                deadline.update({b: beyond(b, (need[b] + 1) * PLAN_SCALE) for b, d in deadline.items() if d >= horizon})
            due = sorted(released, key=lambda b: (deadline[b], need[b] * PLAN_SCALE - target[b], b))
            if not 0 <= free <= len(due):
                raise AssertionError(f"row allocation infeasible at step {s}: {free} rows for {len(due)} buckets")
            for b in due[:free]:
                need[b] += 1
        served.append(need)
        rows = need
    cumulative = np.array(served, dtype=np.int64).reshape(steps, n)
    return np.diff(cumulative, axis=0, prepend=np.zeros((1, n), dtype=np.int64))


@dataclass
class PhaseAllocation:
    """Rows per (step, bucket) of one whole phase, with the drops taken (for inspection and reports)."""

    counts: np.ndarray  # int64 (steps of the phase, buckets)

    def __post_init__(self) -> None:
        self.used = np.flatnonzero(self.counts.any(axis=0))  # buckets the phase serves at all


# --------------------------------------------------------------------------------------------------
# Entry sets, cursors and pieces
# --------------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Handover:
    """Which set's order a group's stream follows (`reader`), and, when the pass under way was begun
    in other orders, what they took of it: `taken` holds (set key, n) for each set that read the
    first n ordinals of its order in pass `epoch` (the entries it skipped as taken are taken too), so
    whether an entry was read in the pass is computed from its ordinal in each of those orders, never
    stored. `carry` is the entry the last handover left mid-way (-1: none): the reader finishes it
    first, while its cursor's ordinal is `carry_at` (one before the reader's first ordinal not
    known taken). A group whose stream follows its own unordered set, with nothing taken, has none."""

    reader: str
    epoch: int
    taken: tuple[tuple[str, int], ...] = ()
    carry: int = -1
    carry_at: int = -1

    def in_carry(self, cursor: Cursor) -> bool:
        return self.carry >= 0 and cursor.epoch == self.epoch and cursor.ordinal == self.carry_at

    def to_dict(self) -> dict[str, Any]:
        return {"reader": self.reader, "epoch": self.epoch, "taken": dict(self.taken), "carry": [self.carry, self.carry_at]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Handover":
        return cls(str(d["reader"]), int(d["epoch"]), tuple(sorted((str(k), int(n)) for k, n in d["taken"].items())),
                   int(d["carry"][0]), int(d["carry"][1]))


def settle(group: str, handover: Handover | None, cursor: Cursor) -> Handover | None:
    """`handover` as it stands with the group's cursor at `cursor`: what it says of a pass the cursor
    has left is dropped, and so is the handover once it says nothing (the group's own set reads)."""
    if handover is None:
        return None
    if cursor.epoch != handover.epoch:
        handover = Handover(handover.reader, cursor.epoch)
    if handover.reader == group and not handover.taken and handover.carry < 0:
        return None
    return handover


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
class ChunkStates:
    """The sampler state after each step of one chunk, held as arrays; `state(i)` builds step i's
    dict. A checkpoint asks for one state in hundreds of steps, so the loader passes these along
    instead of a dict per step."""

    first_step: int  # the chunk's first step, 0-based: state(i) is the state after step first_step + i
    shared: dict[str, Any]  # what every step's state holds alike
    keys: list[str]  # group keys, sorted
    cursors: np.ndarray  # int64 (steps, keys, 4)
    phase: str
    buckets: list[str]
    served: np.ndarray  # int64 (steps, buckets): rows served in the chunk's phase
    plan_offset: np.ndarray  # int64 (steps, buckets)
    handovers: dict[str, Handover]  # of the groups the chunk did not read, and of those it read as at its start

    def __len__(self) -> int:
        return len(self.cursors)

    def state(self, i: int) -> dict[str, Any]:
        cursors = dict(zip(self.keys, self.cursors[i].tolist()))
        handovers = {g: settle(g, h, Cursor(*cursors[g])) for g, h in self.handovers.items()}
        return {**self.shared, "step": self.first_step + i + 1, "cursors": cursors,
                "handovers": {g: h.to_dict() for g, h in sorted(handovers.items()) if h is not None},
                "served": {**self.shared["served"], self.phase: dict(zip(self.buckets, self.served[i].tolist()))},
                "plan_offset": dict(zip(self.buckets, self.plan_offset[i].tolist())),
                "dropped": [list(d) for d in self.shared["dropped"]]}


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


# --------------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------------


@dataclass
class ChunkPlan:
    """Consecutive steps of one phase: every row's entry set and stream start, the entries each set's
    stream reads, and what the state is after each step."""

    step: int  # 0-based index of the first step
    phase: int
    seq_len: int
    row_set: np.ndarray  # int (steps, global_batch), index into `sets`
    row_start: np.ndarray  # int64 (steps, global_batch) stream position of each row in its set
    sets: list[EntrySet]
    windows: list[StreamWindow]  # per set: the entries its rows read
    cursors: np.ndarray  # int64 (steps, len(sets)): each set's stream position after each step
    cursors_before: dict[str, Cursor]  # every group's cursor before the first step
    handovers: dict[str, Handover]  # every group's, the chunk's sets' as they read from its first step
    served: np.ndarray  # int64 (steps, buckets): rows served in the phase after each step
    plan_offset: np.ndarray  # int64 (steps, buckets): the plan minus those rows, 1/PLAN_SCALE units
    dropped: list[str]  # buckets dropped for exhaustion at the first step

    @property
    def steps(self) -> int:
        return len(self.row_set)

    def pieces(self, rows: slice, steps: np.ndarray | None = None) -> Pieces:
        """Pieces of global rows `rows` (a rank's slice) of the chosen steps (indices into this chunk,
        ascending; default all). `row` counts the selected rows step-major from 0."""
        steps = np.arange(self.steps) if steps is None else steps
        row_set = self.row_set[steps, rows].reshape(-1)
        row_start = self.row_start[steps, rows].reshape(-1)
        parts = []
        for si, window in enumerate(self.windows):
            picked = np.flatnonzero(row_set == si)
            if len(picked):
                parts.append(window.pieces(row_start[picked], self.seq_len, si, picked))
        return Pieces.concat(parts)

    def step_plan(self, i: int) -> "StepPlan":
        return StepPlan(self.step + i, self.phase, self.seq_len, self.row_set[i], self.row_start[i], self.sets,
                        self.dropped if i == 0 else [], self)


@dataclass
class StepPlan:
    """One optimizer step of the global order: every row's entry set and stream start."""

    step: int
    phase: int
    seq_len: int
    row_set: np.ndarray  # int, index into `sets`
    row_start: np.ndarray  # int64 stream position of each row in its set
    sets: list[EntrySet]
    dropped: list[str]  # buckets dropped for exhaustion at this step
    chunk: ChunkPlan = field(repr=False)

    def pieces(self, rows: slice) -> Pieces:
        """Pieces of global rows `rows` (a rank's slice), with `row` relative to `rows.start`."""
        return self.chunk.pieces(rows, np.array([self.step - self.chunk.step]))


class CurriculumSampler:
    """Plans steps of the global order in sequence; `state_dict` is everything needed to continue."""

    def __init__(self, schedule: StepSchedule, sets_by_phase: list[dict[str, EntrySet]], seed: int,
                 allow_exhaustion: bool):
        self.schedule = schedule
        self.sets_by_phase = sets_by_phase
        self.seed = seed
        self.allow_exhaustion = allow_exhaustion
        self.buckets = list(schedule.tokens.buckets)
        self.set_by_key = {es.key: es for phase in sets_by_phase for es in phase.values()}
        by_group: dict[str, EntrySet] = {}
        for es in self.set_by_key.values():
            first = by_group.setdefault(es.group, es)
            if (es.size, es.pass_tokens, es.limit) != (first.size, first.pass_tokens, first.limit):
                raise ValueError(
                    f"entry sets {first.key} and {es.key} of bucket {es.bucket!r} read the same entries in other "
                    f"orders but hold {first.size:,} and {es.size:,} entries ({first.pass_tokens:,} and "
                    f"{es.pass_tokens:,} tokens a pass); rebuild phase_manifests"
                )
        self.step = 0
        self.cursors: dict[str, Cursor] = {}  # group -> its stream's cursor
        self.handovers: dict[str, Handover] = {}  # group -> who reads it and what its pass's earlier readers took
        self.dropped: list[tuple[str, int]] = []  # (bucket, first step without it)
        self.served: dict[int, np.ndarray] = {}  # phase -> rows served per bucket
        self.plan_offset = np.zeros(len(self.buckets), dtype=np.int64)  # of the phase of step - 1
        self._quota_blocks: dict[tuple, np.ndarray] = {}

    def done(self) -> bool:
        return self.step >= self.schedule.total_steps

    def set_for(self, phase: int, bucket: str) -> EntrySet:
        for j in range(phase, -1, -1):
            if bucket in self.sets_by_phase[j]:
                return self.sets_by_phase[j][bucket]
        raise KeyError(f"phase {self.schedule.phase_names[phase]!r} weights bucket {bucket!r}, which no manifest lists")

    def reading(self, es: EntrySet) -> tuple[Cursor, Handover | None]:
        """The cursor and handover of `es`'s group once `es` reads it. When another set of the group
        read it last, the pass goes on in `es`'s order: the other's ordinals read so far join what
        the pass took, an entry it stopped inside is finished first, and `es` starts at its first
        ordinal not known taken (the pass's end when the other read its whole order)."""
        cursor = self.cursors.get(es.group, Cursor())
        h = self.handovers.get(es.group)
        previous = h.reader if h is not None else es.group
        if previous == es.key:
            return cursor, h
        current = h if h is not None and h.epoch == cursor.epoch else None
        taken = dict(current.taken) if current is not None else {}
        if current is not None and current.in_carry(cursor):
            partial = current.carry
        elif cursor.offset > 0:
            other = self.set_by_key[previous]
            partial = int(other.ids_at(other.order(cursor.epoch).positions(np.array([cursor.ordinal])))[0])
        else:
            partial = -1
        n = cursor.ordinal + (cursor.offset > 0)
        if n > 0:
            taken[previous] = max(taken.get(previous, 0), n)
        start = es.size if previous in self.set_by_key and n >= self.set_by_key[previous].size else taken.get(es.key, 0)
        if partial >= 0:
            cursor = Cursor(cursor.position, cursor.epoch, start - 1, cursor.offset)
        else:
            cursor = Cursor(cursor.position, cursor.epoch, start, 0)
        handover = Handover(es.key, cursor.epoch, tuple(sorted(taken.items())), partial, start - 1 if partial >= 0 else -1)
        return cursor, settle(es.group, handover, cursor)

    def _taken(self, handover: Handover | None, cursor: Cursor) -> tuple[tuple[EntrySet, int], ...]:
        if handover is None or handover.epoch != cursor.epoch:
            return ()
        return tuple((self.set_by_key[k], n) for k, n in handover.taken)

    # ---- the allocation ------------------------------------------------------------------------------

    def _weights(self, phase: int, lo: int, hi: int, dropped: list[tuple[str, int]]) -> np.ndarray:
        """Steps [lo, hi) of the phase's mixture (relative to its first step), without the buckets
        dropped at or before the step the drops list ends at."""
        weights = self.schedule.phase_weights(phase, lo, hi).copy()
        weights[:, [self.buckets.index(b) for b, _ in dropped]] = 0.0
        return weights

    def _quota(self, phase: int, lo: int, hi: int, dropped: list[tuple[str, int]]) -> np.ndarray:
        """`quantize_rows` of steps [lo, hi) of the phase's mixture, from blocks of QUOTA_BLOCK steps
        computed once (a chunk's horizon overlaps the next chunk's: the blocks are shared)."""
        gone = tuple(sorted({b for b, _ in dropped}))
        length, G = len(self.schedule.phase_steps(phase)), self.schedule.global_batch
        parts = []
        for block in range(lo // QUOTA_BLOCK, (hi - 1) // QUOTA_BLOCK + 1):
            key = (phase, gone, block)
            quota = self._quota_blocks.get(key)
            if quota is None:
                a = block * QUOTA_BLOCK
                quota = quantize_rows(self._weights(phase, a, min(length, a + QUOTA_BLOCK), dropped), G)
                if len(self._quota_blocks) >= 4:
                    self._quota_blocks.pop(next(iter(self._quota_blocks)))
                self._quota_blocks[key] = quota
            parts.append(quota)
        first = lo // QUOTA_BLOCK * QUOTA_BLOCK
        return (parts[0] if len(parts) == 1 else np.concatenate(parts))[lo - first:hi - first]

    def _allocate(self, phase: int, lo: int, hi: int, offset: np.ndarray,
                  dropped: list[tuple[str, int]]) -> tuple[np.ndarray, np.ndarray]:
        """(quota, rows) per (step, bucket) for steps [lo, hi) of the phase, continuing from `offset`."""
        G, length = self.schedule.global_batch, len(self.schedule.phase_steps(phase))
        horizon = min(length, hi + HORIZON_STEPS)
        quota = self._quota(phase, lo, horizon, dropped)
        empty = np.flatnonzero(quota[: hi - lo].sum(axis=1) == 0)
        if len(empty):  # every bucket the step weights is dropped: the last one dropped ran dry
            last = max(dropped, key=lambda d: d[1])[0]
            raise BucketExhausted(last, self.schedule.phase_starts[phase] + lo + int(empty[0]),
                                  self.schedule.step_tokens(phase), 0)
        last = offset + quota.sum(axis=0)

        def beyond(b: int, units: int) -> int:
            reached, at = int(last[b]), horizon
            while at < length:  # block by block: the phase's mixture is never held whole
                stop = min(length, at + QUOTA_BLOCK)
                column = reached + np.cumsum(self._quota(phase, at, stop, dropped)[:, b])
                i = int(np.searchsorted(column, units, side="left"))
                if i < len(column):
                    return at + i - lo
                reached, at = int(column[-1]), stop
            return length - lo

        return quota[: hi - lo], allocate_rows(quota, G, offset, hi - lo, beyond)

    def allocation(self, phase: int, dropped: list[tuple[str, int]] | None = None) -> PhaseAllocation:
        """Rows per (step, bucket) of the whole phase given the drops (default: this sampler's), as the
        chunks plan them: for inspection and tests (O(steps of the phase))."""
        dropped = self.dropped if dropped is None else dropped
        steps = self.schedule.phase_steps(phase)
        cuts = sorted({s - steps.start for _, s in dropped if steps.start < s < steps.stop})
        counts = np.zeros((len(steps), len(self.buckets)), dtype=np.int64)
        offset = np.zeros(len(self.buckets), dtype=np.int64)
        for lo, hi in zip([0, *cuts], [*cuts, len(steps)]):
            gone = [(b, s) for b, s in dropped if s <= steps.start + lo]
            quota, counts[lo:hi] = self._allocate(phase, lo, hi, np.zeros_like(offset) if lo else offset, gone)
        return PhaseAllocation(counts)

    # ---- planning ------------------------------------------------------------------------------------

    def plan_steps(self, max_steps: int) -> ChunkPlan:
        """Plan up to `max_steps` next steps of the current phase and advance past them. Stops before
        a step that would exhaust a bucket; planning that step raises BucketExhausted without
        advancing, or, with exhaustion allowed, drops the bucket there and renormalizes."""
        if self.done():
            raise ValueError(f"all {self.schedule.total_steps} steps of the curriculum are planned")
        step, G = self.step, self.schedule.global_batch
        phase = self.schedule.phase_at(step)
        L = self.schedule.manifests[phase].seq_len
        phase_start = self.schedule.phase_starts[phase]
        if step == phase_start:  # a new phase: its plan starts from nothing served
            self.plan_offset = np.zeros(len(self.buckets), dtype=np.int64)
        served = self.served.get(phase, np.zeros(len(self.buckets), dtype=np.int64))
        lo = step - phase_start
        hi = min(lo + max_steps, len(self.schedule.phase_steps(phase)))
        dropped_now: list[str] = []
        while True:
            quota, counts = self._allocate(phase, lo, hi, self.plan_offset, self.dropped)
            used = np.flatnonzero(counts.any(axis=0))
            sets = [self.set_for(phase, self.buckets[b]) for b in used]
            reading = [self.reading(es) for es in sets]
            base = np.array([cursor.position for cursor, _ in reading], dtype=np.int64)
            cursors = base + np.cumsum(counts[:, used], axis=0) * L
            over = cursors > np.array([es.limit for es in sets], dtype=np.int64)
            if not over[0].any():
                break
            k = int(np.flatnonzero(over[0])[0])
            es = sets[k]
            if not self.allow_exhaustion:
                raise BucketExhausted(es.bucket, step, int(counts[0, used[k]]) * L, es.limit - int(base[k]))
            self.dropped.append((es.bucket, step))
            self.plan_offset = np.zeros(len(self.buckets), dtype=np.int64)  # the allocation restarts here
            dropped_now.append(es.bucket)
        bad = np.flatnonzero(over.any(axis=1))
        n = int(bad[0]) if len(bad) else len(counts)  # the chunk ends before the next step that runs a set dry
        quota, counts, cursors = quota[:n], counts[:n], cursors[:n]
        # Slot order within each step: the rows' counter-based keys sorted, so a rank's slice is mixed.
        slots = np.argsort(row_keys(self.seed, step * G + np.arange(n * G, dtype=np.int64)).reshape(n, G), axis=1)
        labels = np.repeat(np.tile(np.arange(len(sets)), n), counts[:, used].reshape(-1)).reshape(n, G)
        row_set = np.empty((n, G), dtype=np.int64)
        np.put_along_axis(row_set, slots, labels, axis=1)
        row_start = np.empty((n, G), dtype=np.int64)
        flat_set, flat_start = row_set.reshape(-1), row_start.reshape(-1)
        for si in range(len(sets)):
            rows = np.flatnonzero(flat_set == si)
            flat_start[rows] = base[si] + np.arange(len(rows), dtype=np.int64) * L
        before = dict(self.cursors)
        handovers = {**self.handovers, **{es.group: h for es, (_, h) in zip(sets, reading)}}
        handovers = {g: h for g, h in handovers.items() if h is not None}
        windows = [es.window(cursor, int(cursors[-1, i] - base[i]), self._taken(h, cursor),
                             h.carry if h is not None and h.in_carry(cursor) else None)
                   for i, (es, (cursor, h)) in enumerate(zip(sets, reading))]
        served_after = served + np.cumsum(counts, axis=0)
        offset_after = self.plan_offset + np.cumsum(quota, axis=0) - np.cumsum(counts, axis=0) * PLAN_SCALE
        after: dict[str, Handover | None] = {**self.handovers}
        for es, window, c in zip(sets, windows, cursors[-1].tolist()):
            self.cursors[es.group] = window.cursor_at(c)
            after[es.group] = settle(es.group, handovers.get(es.group), self.cursors[es.group])
        self.handovers = {g: h for g, h in after.items() if h is not None}
        self.served[phase] = served_after[-1]
        self.plan_offset = offset_after[-1]
        self.step += n
        return ChunkPlan(step, phase, L, row_set, row_start, sets, windows, cursors, before, handovers, served_after,
                         offset_after, dropped_now)

    def plan_next(self) -> StepPlan:
        """Plan the next step and advance; raises BucketExhausted without advancing."""
        return self.plan_steps(1).step_plan(0)

    def upcoming_entries(self) -> dict[str, list[tuple[int, int]]]:
        """Per bucket, global id ranges its current sets read next (for prefetching their shards)."""
        if self.done():
            return {}
        phase = self.schedule.phase_at(self.step)
        out: dict[str, list[tuple[int, int]]] = {}
        for name in self.sets_by_phase[phase]:
            es = self.set_for(phase, name)
            cursor, handover = self.reading(es)
            if handover is not None and handover.in_carry(cursor):
                out.setdefault(es.bucket, []).append((handover.carry, handover.carry + 1))
            if es.size and cursor.ordinal < es.size:
                out.setdefault(es.bucket, []).extend(es.upcoming_entries(cursor))
        return out

    # ---- what was planned and served -----------------------------------------------------------------

    def planned_tokens(self) -> dict[str, dict[str, float]]:
        """Tokens per phase and bucket the mixture plans (each step's weights, blends included, with
        no drops), and the allocation serves them to within one row per bucket."""
        out = {}
        G = self.schedule.global_batch
        for j, name in enumerate(self.schedule.phase_names):
            length, L = len(self.schedule.phase_steps(j)), self.schedule.manifests[j].seq_len
            units = [0] * len(self.buckets)
            for lo in range(0, length, 16 * HORIZON_STEPS):  # block by block: Python ints cannot overflow
                block = quantize_rows(self._weights(j, lo, min(length, lo + 16 * HORIZON_STEPS), []), G).sum(axis=0)
                units = [u + int(x) for u, x in zip(units, block.tolist())]
            out[name] = {b: u / PLAN_SCALE * L for b, u in zip(self.buckets, units) if u}
        return out

    def served_tokens(self) -> dict[str, dict[str, int]]:
        """Tokens per phase and bucket the global order served before step `self.step`, drops included."""
        out = {}
        for j, rows in sorted(self.served.items()):
            L = self.schedule.manifests[j].seq_len
            tokens = {b: int(r) * L for b, r in zip(self.buckets, rows.tolist()) if r}
            if tokens:
                out[self.schedule.phase_names[j]] = tokens
        return out

    def mixture_report(self) -> dict[str, dict[str, dict[str, float]]]:
        """phase -> bucket -> {"planned": tokens the mixture plans for the whole phase, "served": tokens
        served before `self.step`} (restore the run's sampler state first)."""
        return mixture_report(self.planned_tokens(), self.served_tokens())

    # ---- state -----------------------------------------------------------------------------------

    def state_dict(self, world_size: int) -> dict[str, Any]:
        return self._state(self.step, {k: c.to_list() for k, c in sorted(self.cursors.items())},
                           {j: r for j, r in self.served.items()}, self.plan_offset, world_size, self.handovers)

    def state_after(self, chunk: ChunkPlan, i: int, world_size: int) -> dict[str, Any]:
        """The state after step `i` of `chunk` (planned by this sampler)."""
        return self.chunk_states(chunk, world_size).state(i)

    def states_after(self, chunk: ChunkPlan, world_size: int) -> list[dict[str, Any]]:
        """The state after each step of `chunk`, as dicts."""
        states = self.chunk_states(chunk, world_size)
        return [states.state(i) for i in range(len(states))]

    def chunk_states(self, chunk: ChunkPlan, world_size: int) -> ChunkStates:
        """The states after every step of `chunk` in one pass: each set's cursors from its stream
        window, the rest shared (every step of a chunk reads one phase, and drops happen only at a
        chunk's first step, so the fingerprint and drops are those of the state after its first)."""
        own = {es.group: window.cursor_table(chunk.cursors[:, k]) for k, (es, window) in enumerate(zip(chunk.sets, chunk.windows))}
        keys = sorted({*chunk.cursors_before, *own})
        cursors = np.empty((chunk.steps, len(keys), 4), dtype=np.int64)
        for j, key in enumerate(keys):
            cursors[:, j] = own[key] if key in own else chunk.cursors_before[key].to_list()
        earlier = {j: r for j, r in self.served.items() if j < chunk.phase}
        shared = self._state(chunk.step + 1, {}, earlier, chunk.plan_offset[0], world_size, {})
        return ChunkStates(chunk.step, shared, keys, cursors, self.schedule.phase_names[chunk.phase], self.buckets,
                           chunk.served, chunk.plan_offset, chunk.handovers)

    def _state(self, step: int, cursors: dict[str, list[int]], served: dict[int, np.ndarray], offset: np.ndarray,
               world_size: int, handovers: dict[str, Handover]) -> dict[str, Any]:
        names = self.schedule.phase_names
        return {
            "version": SAMPLER_STATE_VERSION,
            "world_size": world_size,
            "step": step,
            "cursors": cursors,
            "handovers": {g: h.to_dict() for g, h in sorted(handovers.items())},
            "served": {names[j]: dict(zip(self.buckets, r.tolist())) for j, r in sorted(served.items())},
            "plan_offset": dict(zip(self.buckets, np.asarray(offset).tolist())),
            "dropped": [[b, s] for b, s in self.dropped if s < step],
            "seed": self.seed,
            "global_batch": self.schedule.global_batch,
            "schedule": self.schedule.fingerprint_before(step),
            "phases": self.schedule.phase_fingerprints_before(step),
        }

    def load_state_dict(self, state: dict[str, Any], world_size: int) -> list[str]:
        """Restore; returns notes on what changed that is safe (e.g. the world size)."""
        version = state.get("version")
        ordered = [k for k in state.get("cursors", {}) if k in self.set_by_key and self.set_by_key[k].group != k]
        if version != SAMPLER_STATE_VERSION and not (version == 3 and not ordered):
            why = {
                1: "that trainer drew each row's bucket at random, this one allocates rows to buckets exactly per step",
                2: "that trainer held each pass's order as a full permutation of the set, this one computes it block by "
                   "block (training/pass_order.py), so the same cursor names another entry",
                3: f"that trainer gave the ordered sets {', '.join(ordered)} cursors of their own, restarting their "
                   "buckets' passes, where this one continues each pass across orders",
            }.get(version, f"this trainer reads {SAMPLER_STATE_VERSION}")
            raise SamplerStateError(
                f"sampler state version {version}: {why} (version {SAMPLER_STATE_VERSION}); the run's global order "
                "cannot continue: resume with the trainer version that wrote the checkpoint, or start a new run"
            )
        if state["global_batch"] != self.schedule.global_batch:
            raise SamplerStateError(
                f"the checkpoint's global batch is {state['global_batch']} rows, this run's is "
                f"{self.schedule.global_batch}; the global order depends on it, so set training.micro_batch_size * "
                f"training.grad_accum_steps back to {state['global_batch']}"
            )
        if state["seed"] != self.seed:
            raise SamplerStateError(f"the checkpoint's seed is {state['seed']}, this run's is {self.seed}; restore seed")
        now = self.schedule.fingerprint_before(int(state["step"]))
        if state["schedule"] != now:
            saved, current = state.get("phases", {}), self.schedule.phase_fingerprints_before(int(state["step"]))
            changed = [p for p in {**saved, **current} if saved.get(p) != current.get(p)]
            raise SamplerStateError(
                f"the manifests of the phases trained so far changed since the checkpoint: phases "
                f"{', '.join(map(repr, changed))} (schedule fingerprint {state['schedule']} -> {now}); resume "
                "against the manifests it was trained on, or start a new run"
            )
        self.step = int(state["step"])
        self.cursors = {k: Cursor(*(int(x) for x in v)) for k, v in state["cursors"].items()}
        self.handovers = {g: Handover.from_dict(h) for g, h in state.get("handovers", {}).items()}
        self.dropped = [(str(b), int(s)) for b, s in state["dropped"]]
        index = {name: j for j, name in enumerate(self.schedule.phase_names)}
        self.served = {index[p]: np.array([int(rows.get(b, 0)) for b in self.buckets], dtype=np.int64)
                       for p, rows in state["served"].items()}
        self.plan_offset = np.array([int(state["plan_offset"].get(b, 0)) for b in self.buckets], dtype=np.int64)
        notes = []
        if state["world_size"] != world_size:
            notes.append(
                f"world size changed {state['world_size']} -> {world_size}: each rank now takes 1/{world_size} of "
                "every global batch; the global order and the consumed count are unchanged"
            )
        return notes
