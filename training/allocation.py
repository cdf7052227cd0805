"""Exact mixtures: how many rows each step gives each bucket.

Each step's rows are allocated to buckets deterministically so that, at the end of every step, each
bucket's rows in the phase so far stay within one row of its planned share (the sum of each step's
mixture, boundary blending included). The allocation is earliest-deadline-first over "tickets": a
bucket's j-th row falls due at the first step whose plan reaches j rows and may be served once the
plan exceeds j - 1; each step takes the tickets that are due, then the earliest-due released ones
(Megatron's blended dataset picks the largest sampling error row by row; deadlines give the same
bound for mixtures that change from step to step). Plans are integers (weights quantised to 2^-32 of
a row) so the bound holds exactly. The allocation is a pure function of the manifests, the global
batch and the exhaustion drops, computed per chunk from the state at the chunk's start, so every
rank and worker derives the same one without shared state.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable

import numpy as np

from training.schedule import StepSchedule

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



class RowAllocator:
    """The rows per (step, bucket) of one schedule's mixture: the quantized mixture, computed in blocks
    shared by the chunks in them, and the allocation over it, for a chunk or a whole phase."""

    def __init__(self, schedule: StepSchedule, buckets: list[str]):
        self.schedule, self.buckets = schedule, buckets
        self._quota_blocks: dict[tuple, np.ndarray] = {}

    def weights(self, phase: int, lo: int, hi: int, dropped: list[tuple[str, int]]) -> np.ndarray:
        """Steps [lo, hi) of the phase's mixture (relative to its first step), without the buckets
        dropped at or before the step the drops list ends at."""
        weights = self.schedule.phase_weights(phase, lo, hi).copy()
        weights[:, [self.buckets.index(b) for b, _ in dropped]] = 0.0
        return weights

    def quota(self, phase: int, lo: int, hi: int, dropped: list[tuple[str, int]]) -> np.ndarray:
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
                quota = quantize_rows(self.weights(phase, a, min(length, a + QUOTA_BLOCK), dropped), G)
                if len(self._quota_blocks) >= 4:
                    self._quota_blocks.pop(next(iter(self._quota_blocks)))
                self._quota_blocks[key] = quota
            parts.append(quota)
        first = lo // QUOTA_BLOCK * QUOTA_BLOCK
        return (parts[0] if len(parts) == 1 else np.concatenate(parts))[lo - first:hi - first]

    def allocate(self, phase: int, lo: int, hi: int, offset: np.ndarray,
                 dropped: list[tuple[str, int]]) -> tuple[np.ndarray, np.ndarray]:
        """(quota, rows) per (step, bucket) for steps [lo, hi) of the phase, continuing from `offset`."""
        G, length = self.schedule.global_batch, len(self.schedule.phase_steps(phase))
        horizon = min(length, hi + HORIZON_STEPS)
        quota = self.quota(phase, lo, horizon, dropped)
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
                column = reached + np.cumsum(self.quota(phase, at, stop, dropped)[:, b])
                i = int(np.searchsorted(column, units, side="left"))
                if i < len(column):
                    return at + i - lo
                reached, at = int(column[-1]), stop
            return length - lo

        return quota[: hi - lo], allocate_rows(quota, G, offset, hi - lo, beyond)

    def phase_allocation(self, phase: int, dropped: list[tuple[str, int]]) -> PhaseAllocation:
        """Rows per (step, bucket) of the whole phase given the drops, as the chunks plan them: for
        inspection and tests (O(steps of the phase))."""
        steps = self.schedule.phase_steps(phase)
        cuts = sorted({s - steps.start for _, s in dropped if steps.start < s < steps.stop})
        counts = np.zeros((len(steps), len(self.buckets)), dtype=np.int64)
        offset = np.zeros(len(self.buckets), dtype=np.int64)
        for lo, hi in zip([0, *cuts], [*cuts, len(steps)]):
            gone = [(b, s) for b, s in dropped if s <= steps.start + lo]
            quota, counts[lo:hi] = self.allocate(phase, lo, hi, np.zeros_like(offset) if lo else offset, gone)
        return PhaseAllocation(counts)

    def planned_tokens(self) -> dict[str, dict[str, float]]:
        """Tokens per phase and bucket the mixture plans (each step's weights, blends included, with
        no drops), and the allocation serves them to within one row per bucket."""
        out = {}
        G = self.schedule.global_batch
        for j, name in enumerate(self.schedule.phase_names):
            length, row_tokens = len(self.schedule.phase_steps(j)), self.schedule.step_tokens(j) // G
            units = [0] * len(self.buckets)
            for lo in range(0, length, 16 * HORIZON_STEPS):  # block by block: Python ints cannot overflow
                block = quantize_rows(self.weights(j, lo, min(length, lo + 16 * HORIZON_STEPS), []), G).sum(axis=0)
                units = [u + int(x) for u, x in zip(units, block.tolist())]
            out[name] = {b: u / PLAN_SCALE * row_tokens for b, u in zip(self.buckets, units) if u}
        return out
