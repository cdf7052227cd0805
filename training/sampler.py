"""The phase-aware, exactly-once sampler: one global order of rows, independent of world size and
worker count, plus the state that says how far it got.

How a row is chosen (OLMo-core's "global order plus a consumed count", made phase-aware):

- Global row `g = step * global_batch + slot` draws its bucket from a counter-based PRNG
  (splitmix64 of (seed, g) -> uniform -> inverse CDF of the step's mixture), so the mixture needs no
  shared state and every rank and worker computes the same draws.
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
  consumed; with exhaustion allowed, the bucket is dropped, the remaining weights renormalized, and
  the same uniforms redrawn against the new CDF.

The sampler only plans (which set, which stream position per row); `training.data` reads tokens.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from assets.stages.hashing import splitmix64
from training.schedule import StepSchedule

SAMPLER_STATE_VERSION = 1


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


def row_uniforms(seed: int, rows: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per global row index, a pure function of (seed, row)."""
    with np.errstate(over="ignore"):
        keyed = splitmix64(np.uint64(stable_hash(f"seed:{seed}")) ^ rows.astype(np.uint64))
    return (splitmix64(keyed) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass
class Pieces:
    """Where a batch's rows come from, one piece per (row, entry) run: tokens [a, b) of `entry`."""

    row: np.ndarray
    set_index: np.ndarray
    epoch: np.ndarray
    entry: np.ndarray
    a: np.ndarray
    b: np.ndarray

    @classmethod
    def concat(cls, parts: list["Pieces"]) -> "Pieces":
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
    ids: np.ndarray  # int64 global entry ids of the bucket, ascending
    lengths: np.ndarray  # int64 tokens of every global entry id of the bucket
    max_epochs: float
    seed: int
    _orders: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.pass_tokens = int(self.lengths[self.ids].sum())
        self.limit = int(self.max_epochs * self.pass_tokens)

    def order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(entry ids in pass `epoch`'s order, cumulative token starts with a final total)."""
        if epoch not in self._orders:
            if len(self._orders) >= 4:
                self._orders.pop(min(self._orders))
            rng = np.random.default_rng([self.seed, stable_hash(self.key), epoch])
            perm = rng.permutation(self.ids)
            cum = np.zeros(len(perm) + 1, dtype=np.int64)
            np.cumsum(self.lengths[perm], out=cum[1:])
            self._orders[epoch] = (perm, cum)
        return self._orders[epoch]

    def locate(self, starts: np.ndarray, length: int, set_index: int, rows: np.ndarray) -> Pieces:
        """The pieces of rows that read `length` tokens from stream positions `starts`."""
        ends = starts + length
        P = self.pass_tokens
        first, last = starts // P, (ends - 1) // P
        if (first == last).all():
            seg_row, seg_from, seg_to, seg_epoch = rows, starts, ends, first
        else:  # a row that crosses into the next pass is split at the pass boundary
            segs = [
                (rows[i], max(starts[i], e * P), min(ends[i], (e + 1) * P), e)
                for i in range(len(starts))
                for e in range(int(first[i]), int(last[i]) + 1)
            ]
            seg_row, seg_from, seg_to, seg_epoch = (np.array(c, dtype=np.int64) for c in zip(*segs))
        parts = []
        for e in np.unique(seg_epoch):
            m = seg_epoch == e
            perm, cum = self.order(int(e))
            lo, hi = seg_from[m] - e * P, seg_to[m] - e * P
            k0 = np.searchsorted(cum, lo, side="right") - 1
            k1 = np.searchsorted(cum, hi - 1, side="right") - 1
            n = k1 - k0 + 1
            k = np.repeat(k0 - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
            a = np.maximum(np.repeat(lo, n) - cum[k], 0)
            b = np.minimum(np.repeat(hi, n) - cum[k], cum[k + 1] - cum[k])
            keep = b > a
            count = int(keep.sum())
            parts.append(
                Pieces(
                    np.repeat(seg_row[m], n)[keep], np.full(count, set_index), np.full(count, e),
                    perm[k][keep], a[keep], b[keep],
                )
            )
        return Pieces.concat(parts)


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

    def pieces(self, rows: slice) -> Pieces:
        """Pieces of global rows `rows` (a rank's slice), with `row` relative to `rows.start`."""
        idx = np.arange(rows.start, rows.stop)
        parts = []
        for si, es in enumerate(self.sets):
            m = self.row_set[idx] == si
            if m.any():
                parts.append(es.locate(self.row_start[idx][m], self.seq_len, si, np.flatnonzero(m)))
        return Pieces.concat(parts)


class CurriculumSampler:
    """Plans steps of the global order in sequence; `state_dict` is everything needed to continue."""

    def __init__(
        self,
        schedule: StepSchedule,
        sets_by_phase: list[dict[str, EntrySet]],
        seed: int,
        allow_exhaustion: bool,
    ):
        self.schedule = schedule
        self.sets_by_phase = sets_by_phase
        self.seed = seed
        self.allow_exhaustion = allow_exhaustion
        self.step = 0
        self.cursors: dict[str, int] = {}
        self.dropped: list[str] = []

    def done(self) -> bool:
        return self.step >= self.schedule.total_steps

    def _set_for(self, phase: int, bucket: str) -> EntrySet:
        for j in range(phase, -1, -1):
            if bucket in self.sets_by_phase[j]:
                return self.sets_by_phase[j][bucket]
        raise KeyError(f"phase {self.schedule.phase_names[phase]!r} weights bucket {bucket!r}, which no manifest lists")

    def plan_next(self) -> StepPlan:
        """Plan the next step and advance; raises BucketExhausted without advancing."""
        step, G = self.step, self.schedule.global_batch
        phase = self.schedule.phase_at(step)
        L = self.schedule.manifests[phase].seq_len
        weights = {b: w for b, w in self.schedule.weights_at(step).items() if w > 0}
        u = row_uniforms(self.seed, step * G + np.arange(G, dtype=np.int64))
        dropped_now: list[str] = []
        while True:
            live = [b for b in sorted(weights) if b not in self.dropped and b not in dropped_now]
            if not live:
                bucket = sorted(weights)[0] if weights else "?"
                raise BucketExhausted(bucket, step, G * L, 0)
            w = np.array([weights[b] for b in live])
            cdf = np.cumsum(w / w.sum())
            choice = np.minimum(np.searchsorted(cdf, u, side="right"), len(live) - 1)
            sets = [self._set_for(phase, b) for b in live]
            counts = np.bincount(choice, minlength=len(live))
            short = None
            for es, n in zip(sets, counts):
                left = es.limit - self.cursors.get(es.key, 0)
                if n * L > left:
                    short = (es, int(n) * L, left)
                    break
            if short is None:
                break
            if not self.allow_exhaustion:
                raise BucketExhausted(short[0].bucket, step, short[1], short[2])
            dropped_now.append(short[0].bucket)
        starts = np.zeros(G, dtype=np.int64)
        for si, es in enumerate(sets):
            m = choice == si
            base = self.cursors.get(es.key, 0)
            starts[m] = base + np.arange(int(m.sum()), dtype=np.int64) * L
            self.cursors[es.key] = base + int(m.sum()) * L
        self.dropped.extend(dropped_now)
        self.step += 1
        return StepPlan(step, phase, L, choice, starts, sets, dropped_now)

    # ---- state -----------------------------------------------------------------------------------

    def state_dict(self, world_size: int) -> dict[str, Any]:
        return {
            "version": SAMPLER_STATE_VERSION,
            "world_size": world_size,
            "step": self.step,
            "cursors": dict(sorted(self.cursors.items())),
            "dropped": list(self.dropped),
            "seed": self.seed,
            "global_batch": self.schedule.global_batch,
            "schedule": self.schedule.fingerprint_before(self.step),
        }

    def load_state_dict(self, state: dict[str, Any], world_size: int) -> list[str]:
        """Restore; returns notes on what changed that is safe (e.g. the world size)."""
        if state.get("version") != SAMPLER_STATE_VERSION:
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
        self.dropped = list(state["dropped"])
        notes = []
        if state["world_size"] != world_size:
            notes.append(
                f"world size changed {state['world_size']} -> {world_size}: each rank now takes 1/{world_size} of "
                "every global batch; the global order and the consumed count are unchanged"
            )
        return notes
