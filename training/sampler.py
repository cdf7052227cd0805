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
  of the manifests, the global batch and the exhaustion drops, recomputed per phase, so every rank and
  worker derives the same one without shared state.
- Within a step, the rows' slots are shuffled by a counter-based PRNG (splitmix64 of (seed, row)), so
  every rank's slice carries the mixture too.
- Each bucket is read through an *entry set*: the bucket's entries (all of them, or a phase's
  quality selection). An entry set owns one cursor, a position in its token stream: pass 0's seeded
  permutation of the set's entries, then pass 1's fresh permutation, and so on up to `max_epochs`
  passes. A row of seq_len L takes the next L tokens of its set's stream, so an entry longer than L
  continues in the set's next row, and entries are packed back to back.
- Cursors belong to entry sets, not phases: a bucket served in phase 1 continues in phase 2 from
  where it stopped (gpt-simple restarted it). A phase with a quality selection reads a different
  entry set with its own cursor, so the anneal slice gets its own passes; two phases with the same
  selection share one cursor.
- A step that would run a set past its allowed passes raises `BucketExhausted` before anything is
  consumed; with exhaustion allowed, the bucket is dropped from that step on, the remaining weights
  renormalized, and the allocation restarts from the rows served so far.

Steps are planned in bulk (`plan_steps`, up to a phase's end) with vectorised lookups; the sampler
only plans (which set, which stream position per row) and `training.data` reads tokens.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refinery.hashing import splitmix64
from training.accounting import mixture_report
from training.schedule import StepSchedule

# Version 2: rows are allocated to buckets exactly per step (version 1 drew each row's bucket at
# random), and `dropped` records the step each bucket was dropped at.
SAMPLER_STATE_VERSION = 2
# Plans count rows in units of 2^-32 of a row: exact integers, so "within one row" holds exactly.
PLAN_SCALE = 1 << 32


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
    proportional to `weights` (rows renormalized), each step summing exactly to rows_per_step rows."""
    total = rows_per_step * PLAN_SCALE
    exact = weights / weights.sum(axis=1, keepdims=True) * total
    q = np.floor(exact).astype(np.int64)
    short = total - q.sum(axis=1)
    # The units floor() left over go to the largest remainders (at most one per bucket); a bucket
    # without weight ranks last, so float rounding never hands it a share.
    remainder = np.where(weights > 0, exact - q, -1.0)
    rank = np.argsort(np.argsort(-remainder, axis=1, kind="stable"), axis=1, kind="stable")
    return q + (rank < short[:, None])


def allocate_rows(quota: np.ndarray, rows_per_step: int, served: np.ndarray | None = None) -> np.ndarray:
    """Rows per (step, bucket) such that after every step each bucket's rows A and plan P (rows
    `served` before the first step plus the cumulative `quota`, in 1/PLAN_SCALE units) satisfy
    floor(P) <= A <= ceil(P): within one row.

    Earliest deadline first: bucket b's j-th row is released once P_b > j - 1 and due at the first
    step where P_b >= j. Each step takes every due row, then fills the step with released rows by
    deadline (ties: the larger shortfall, then the lower bucket). Tijdeman's chairman assignment
    theorem says some order keeps every bucket within one row even when the mixture changes per step;
    EDF finds one whenever one exists, so the step is never over-full and never short."""
    steps, n = quota.shape
    start = np.zeros(n, dtype=np.int64) if served is None else served.astype(np.int64)
    plan = start * PLAN_SCALE + np.cumsum(quota, axis=0)
    columns = [plan[:, b].tolist() for b in range(n)]  # bisect over Python ints: no numpy call per step
    rows = start.tolist()
    out = np.zeros((steps, n), dtype=np.int64)
    for s in range(steps):
        target = [col[s] for col in columns]
        floor = [t // PLAN_SCALE for t in target]
        need = [max(a, f) for a, f in zip(rows, floor)]
        free = sum(rows) + rows_per_step - sum(need)
        if free:
            released = [b for b in range(n) if need[b] * PLAN_SCALE < target[b]]
            due = sorted(released, key=lambda b: (bisect.bisect_left(columns[b], (need[b] + 1) * PLAN_SCALE, s + 1),
                                                  need[b] * PLAN_SCALE - target[b], b))
            if not 0 <= free <= len(due):
                raise AssertionError(f"row allocation infeasible at step {s}: {free} rows for {len(due)} buckets")
            for b in due[:free]:
                need[b] += 1
        out[s] = [x - a for x, a in zip(need, rows)]
        rows = need
    return out


@dataclass
class PhaseAllocation:
    """Rows per (step, bucket) of one phase, with the drops taken so far."""

    counts: np.ndarray  # int64 (steps of the phase, buckets)
    plan: np.ndarray  # int64 (steps, buckets): planned rows after each step, in 1/PLAN_SCALE units

    def __post_init__(self) -> None:
        self.used = np.flatnonzero(self.counts.any(axis=0))  # buckets the phase serves at all


# --------------------------------------------------------------------------------------------------
# Entry sets and pieces
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

    @classmethod
    def concat(cls, parts: list["Pieces"]) -> "Pieces":
        """The parts joined in row order; within a row the parts keep their given order."""
        if len(parts) == 1:
            return parts[0]
        joined = cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))
        order = np.argsort(joined.row, kind="stable")
        return cls(*(getattr(joined, f)[order] for f in cls.__dataclass_fields__))


@dataclass
class EntrySet:
    """The entries one bucket serves in a phase, with their lengths; owns a cursor in the sampler."""

    key: str
    bucket: str
    ids: np.ndarray  # global entry ids of the bucket, ascending (int32 when the bucket has fewer than 2^31)
    lengths: np.ndarray  # tokens of every global entry id of the bucket
    max_epochs: float
    seed: int
    _orders: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.pass_tokens = int(self.lengths[self.ids].sum())
        self.limit = int(self.max_epochs * self.pass_tokens)

    def order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(entry ids in pass `epoch`'s order, cumulative token starts with a final total)."""
        # Samplers of several simulated ranks share entry sets from their own prefetch threads: the
        # cache is read and trimmed so that a racing thread at worst recomputes a permutation. Two
        # passes: a chunk reads across at most one pass boundary, unless the bucket is smaller than
        # a chunk (then recomputing its order is cheap); each pass held costs 12-16 bytes an entry.
        cached = self._orders.get(epoch)
        if cached is None:
            rng = np.random.default_rng([self.seed, stable_hash(self.key), epoch])
            perm = rng.permutation(self.ids)
            cum = np.zeros(len(perm) + 1, dtype=np.int64)
            np.cumsum(self.lengths[perm], out=cum[1:])
            cached = (perm, cum)
            held = list(self._orders)
            if len(held) >= 2:
                self._orders.pop(min(held), None)
            self._orders[epoch] = cached
        return cached

    def locate(self, starts: np.ndarray, length: int, set_index: int, rows: np.ndarray) -> Pieces:
        """The pieces of rows that read `length` tokens from stream positions `starts`, in row order
        (`rows` ascending) and stream order within a row."""
        P = self.pass_tokens
        ends = starts + length
        first = starts // P
        segments = (ends - 1) // P - first + 1  # a row crossing into the next pass splits at its boundary
        if (segments == 1).all():
            seg_row, seg_from, seg_to, seg_epoch = rows, starts, ends, first
        else:
            seg_row = np.repeat(rows, segments)
            seg_epoch = np.repeat(first, segments) + ordinals(segments)
            seg_from = np.maximum(np.repeat(starts, segments), seg_epoch * P)
            seg_to = np.minimum(np.repeat(ends, segments), (seg_epoch + 1) * P)
        parts = []
        epochs = range(int(seg_epoch.min()), int(seg_epoch.max()) + 1)  # consecutive: segments split at pass ends
        for e in epochs:
            m = seg_epoch == e if len(epochs) > 1 else slice(None)
            perm, cum = self.order(e)
            lo, hi = seg_from[m] - e * P, seg_to[m] - e * P
            k0 = np.searchsorted(cum, lo, side="right") - 1
            n = np.searchsorted(cum, hi - 1, side="right") - k0
            k = np.repeat(k0, n) + ordinals(n)
            a = np.maximum(np.repeat(lo, n) - cum[k], 0)
            b = np.minimum(np.repeat(hi, n) - cum[k], cum[k + 1] - cum[k])
            parts.append(Pieces(np.repeat(seg_row[m], n), np.full(len(k), set_index), np.full(len(k), e),
                                perm[k], a, b))
        return Pieces.concat(parts)


def ordinals(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each c in `counts`, concatenated."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


# --------------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------------


@dataclass
class ChunkPlan:
    """Consecutive steps of one phase: every row's entry set and stream start, and the cursors after
    each step."""

    step: int  # 0-based index of the first step
    phase: int
    seq_len: int
    row_set: np.ndarray  # int (steps, global_batch), index into `sets`
    row_start: np.ndarray  # int64 (steps, global_batch) stream position of each row in its set
    sets: list[EntrySet]
    cursors: np.ndarray  # int64 (steps, len(sets)): each set's cursor after each step
    cursors_before: dict[str, int]  # every set's cursor before the first step
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
        for si, es in enumerate(self.sets):
            picked = np.flatnonzero(row_set == si)
            if len(picked):
                parts.append(es.locate(row_start[picked], self.seq_len, si, picked))
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

    def __init__(
        self,
        schedule: StepSchedule,
        sets_by_phase: list[dict[str, EntrySet]],
        seed: int,
        allow_exhaustion: bool,
        allocations: dict[tuple, PhaseAllocation] | None = None,
    ):
        self.schedule = schedule
        self.sets_by_phase = sets_by_phase
        self.seed = seed
        self.allow_exhaustion = allow_exhaustion
        self.buckets = list(schedule.tokens.buckets)
        self.step = 0
        self.cursors: dict[str, int] = {}
        self.dropped: list[tuple[str, int]] = []  # (bucket, first step without it)
        # Allocations are pure functions of (phase, drops): samplers of one run may share the cache.
        self._allocations = {} if allocations is None else allocations

    def done(self) -> bool:
        return self.step >= self.schedule.total_steps

    def set_for(self, phase: int, bucket: str) -> EntrySet:
        for j in range(phase, -1, -1):
            if bucket in self.sets_by_phase[j]:
                return self.sets_by_phase[j][bucket]
        raise KeyError(f"phase {self.schedule.phase_names[phase]!r} weights bucket {bucket!r}, which no manifest lists")

    # ---- the allocation ------------------------------------------------------------------------------

    def allocation(self, phase: int, dropped: list[tuple[str, int]] | None = None) -> PhaseAllocation:
        """Rows per (step, bucket) of `phase` given the drops (default: this sampler's); a drop at a
        step of the phase restarts the allocation there from the rows already served."""
        dropped = self.dropped if dropped is None else dropped
        steps = self.schedule.phase_steps(phase)
        before = tuple(sorted(b for b, s in dropped if s <= steps.start))
        within = tuple(sorted((s, b) for b, s in dropped if steps.start < s < steps.stop))
        key = (phase, before, within)
        if key not in self._allocations:
            weights = self.schedule.phase_weights(phase).copy()
            weights[:, [self.buckets.index(b) for b in before]] = 0.0
            counts = np.zeros(weights.shape, dtype=np.int64)
            plan = np.zeros(weights.shape, dtype=np.int64)
            cuts = sorted({s - steps.start for s, _ in within})
            G = self.schedule.global_batch
            for lo, hi in zip([0, *cuts], [*cuts, len(steps)]):
                for s, b in within:
                    if s - steps.start == lo:
                        weights[:, self.buckets.index(b)] = 0.0
                empty = np.flatnonzero(weights[lo:hi].sum(axis=1) <= 0)
                if len(empty):  # every bucket the step weights is dropped: the last one dropped ran dry
                    last = max(dropped, key=lambda d: d[1])[0]
                    raise BucketExhausted(last, steps.start + lo + int(empty[0]), G * self.schedule.manifests[phase].seq_len, 0)
                quota = quantize_rows(weights[lo:hi], G)
                served = counts[:lo].sum(axis=0)
                counts[lo:hi] = allocate_rows(quota, G, served)
                plan[lo:hi] = served * PLAN_SCALE + np.cumsum(quota, axis=0)
            self._allocations[key] = PhaseAllocation(counts, plan)
        return self._allocations[key]

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
        dropped_now: list[str] = []
        while True:
            alloc = self.allocation(phase)
            lo = step - phase_start
            hi = min(lo + max_steps, len(alloc.counts))
            counts = alloc.counts[lo:hi]
            used = alloc.used
            sets = [self.set_for(phase, self.buckets[b]) for b in used]
            base = np.array([self.cursors.get(es.key, 0) for es in sets], dtype=np.int64)
            cursors = base + np.cumsum(counts[:, used], axis=0) * L
            over = cursors > np.array([es.limit for es in sets], dtype=np.int64)
            if not over[0].any():
                break
            k = int(np.flatnonzero(over[0])[0])
            es = sets[k]
            if not self.allow_exhaustion:
                raise BucketExhausted(es.bucket, step, int(counts[0, used[k]]) * L, es.limit - int(base[k]))
            self.dropped.append((es.bucket, step))
            dropped_now.append(es.bucket)
        bad = np.flatnonzero(over.any(axis=1))
        n = int(bad[0]) if len(bad) else len(counts)  # the chunk ends before the next step that runs a set dry
        counts, cursors = counts[:n, used], cursors[:n]
        # Slot order within each step: the rows' counter-based keys sorted, so a rank's slice is mixed.
        slots = np.argsort(row_keys(self.seed, step * G + np.arange(n * G, dtype=np.int64)).reshape(n, G), axis=1)
        labels = np.repeat(np.tile(np.arange(len(sets)), n), counts.reshape(-1)).reshape(n, G)
        row_set = np.empty((n, G), dtype=np.int64)
        np.put_along_axis(row_set, slots, labels, axis=1)
        row_start = np.empty((n, G), dtype=np.int64)
        flat_set, flat_start = row_set.reshape(-1), row_start.reshape(-1)
        for si in range(len(sets)):
            rows = np.flatnonzero(flat_set == si)
            flat_start[rows] = base[si] + np.arange(len(rows), dtype=np.int64) * L
        before = dict(self.cursors)
        for es, c in zip(sets, cursors[-1].tolist()):
            self.cursors[es.key] = c
        self.step += n
        return ChunkPlan(step, phase, L, row_set, row_start, sets, cursors, before, dropped_now)

    def plan_next(self) -> StepPlan:
        """Plan the next step and advance; raises BucketExhausted without advancing."""
        return self.plan_steps(1).step_plan(0)

    # ---- what was planned and served -----------------------------------------------------------------

    def planned_tokens(self) -> dict[str, dict[str, float]]:
        """Tokens per phase and bucket the mixture plans (each step's weights, blends included, with
        no drops), and the allocation serves them to within one row per bucket."""
        out = {}
        for j, name in enumerate(self.schedule.phase_names):
            plan = self.allocation(j, []).plan
            L = self.schedule.manifests[j].seq_len
            last = plan[-1] if len(plan) else np.zeros(len(self.buckets), dtype=np.int64)
            out[name] = {b: float(x) / PLAN_SCALE * L for b, x in zip(self.buckets, last.tolist()) if x}
        return out

    def served_tokens(self) -> dict[str, dict[str, int]]:
        """Tokens per phase and bucket the global order served before step `self.step`, drops included."""
        out = {}
        for j, name in enumerate(self.schedule.phase_names):
            steps = self.schedule.phase_steps(j)
            done = min(max(self.step - steps.start, 0), len(steps))
            if not done:
                continue
            rows = self.allocation(j).counts[:done].sum(axis=0)
            L = self.schedule.manifests[j].seq_len
            out[name] = {b: int(r) * L for b, r in zip(self.buckets, rows.tolist()) if r}
        return out

    def mixture_report(self) -> dict[str, dict[str, dict[str, float]]]:
        """phase -> bucket -> {"planned": tokens the mixture plans for the whole phase, "served": tokens
        served before `self.step`} (restore the run's sampler state first)."""
        return mixture_report(self.planned_tokens(), self.served_tokens())

    # ---- state -----------------------------------------------------------------------------------

    def state_dict(self, world_size: int) -> dict[str, Any]:
        return self._state(self.step, dict(sorted(self.cursors.items())), world_size)

    def state_after(self, chunk: ChunkPlan, i: int, world_size: int) -> dict[str, Any]:
        """The state after step `i` of `chunk` (planned by this sampler)."""
        return self.states_after(chunk, world_size, [i])[0]

    def states_after(self, chunk: ChunkPlan, world_size: int, steps: list[int] | None = None) -> list[dict[str, Any]]:
        """The state after each of the chosen steps of `chunk` (default all), built in one pass: what
        the steps share (fingerprint, drops, the other sets' cursors) once, each step's cursors from
        one table."""
        steps = list(range(chunk.steps)) if steps is None else steps
        own = {es.key: k for k, es in enumerate(chunk.sets)}
        keys = sorted({*chunk.cursors_before, *own})
        table = np.empty((len(steps), len(keys)), dtype=np.int64)
        for j, k in enumerate(keys):
            table[:, j] = chunk.cursors[steps, own[k]] if k in own else chunk.cursors_before.get(k, 0)
        # Every step of a chunk reads one phase, and drops happen only at a chunk's first step, so
        # the state after any of its steps has the fingerprint and drops of the state after its first.
        shared = self._state(chunk.step + 1, {}, world_size)
        return [{**shared, "step": chunk.step + i + 1, "cursors": dict(zip(keys, row)),
                 "dropped": [list(d) for d in shared["dropped"]]}
                for i, row in zip(steps, table.tolist())]

    def _state(self, step: int, cursors: dict[str, int], world_size: int) -> dict[str, Any]:
        return {
            "version": SAMPLER_STATE_VERSION,
            "world_size": world_size,
            "step": step,
            "cursors": cursors,
            "dropped": [[b, s] for b, s in self.dropped if s < step],
            "seed": self.seed,
            "global_batch": self.schedule.global_batch,
            "schedule": self.schedule.fingerprint_before(step),
        }

    def load_state_dict(self, state: dict[str, Any], world_size: int) -> list[str]:
        """Restore; returns notes on what changed that is safe (e.g. the world size)."""
        if state.get("version") != SAMPLER_STATE_VERSION:
            if state.get("version") == 1:
                raise SamplerStateError(
                    "sampler state version 1: that trainer drew each row's bucket at random, this one (version 2) "
                    "allocates rows to buckets exactly per step, so the run's global order cannot continue; resume "
                    "with the trainer version that wrote the checkpoint, or start a new run"
                )
            raise SamplerStateError(
                f"sampler state version {state.get('version')}, this trainer reads {SAMPLER_STATE_VERSION}; "
                "resume with the trainer version that wrote the checkpoint"
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
            raise SamplerStateError(
                "the manifests of the phases trained so far changed since the checkpoint (schedule fingerprint "
                f"{state['schedule']} -> {now}); resume against the manifests it was trained on, or start a new run"
            )
        self.step = int(state["step"])
        self.cursors = {k: int(v) for k, v in state["cursors"].items()}
        self.dropped = [(str(b), int(s)) for b, s in state["dropped"]]
        notes = []
        if state["world_size"] != world_size:
            notes.append(
                f"world size changed {state['world_size']} -> {world_size}: each rank now takes 1/{world_size} of "
                "every global batch; the global order and the consumed count are unchanged"
            )
        return notes
