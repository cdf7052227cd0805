"""The phase-aware, exactly-once sampler: one global order of rows, independent of world size and
worker count, plus the state that says how far it got (OLMo-core's "global order plus a consumed
count", made phase-aware).

Its parts, each in its own module:

- `training.allocation`: how many rows each step gives each bucket (exact mixtures, within one row
  of the plan at every step).
- `training.entry_sets`: the entries each bucket serves in a phase, read as a token stream in pass
  orders (`training.pass_order`), and the cursor in it.
- `training.handover`: a pass begun in one order and continued in another.
- `training.sampler_state`: the state a checkpoint holds, after a step or each step of a chunk,
  and the checks a saved state passes.

This module walks them into plans (`ChunkPlan`, `StepPlan`, which `training.data` reads): per chunk
(`plan_steps`), the row allocation of the chunk's steps from the state at its start (rows served in
the phase, the plan's offset from them); within a step, the rows' slots shuffled by a counter-based
PRNG (splitmix64 of (seed, row)), so every rank's slice carries the mixture too; then each used
set's stream walked over the tokens the chunk takes. Every quantity a
state holds is per bucket or per entry set, so a resumed sampler continues without replaying.

A step that would run a set past its allowed passes raises `BucketExhausted` before anything is
consumed; with exhaustion allowed, the bucket is dropped from that step on, the remaining weights
renormalized, and the allocation restarts from the rows served so far. The sampler only plans (which
set, which stream position per row, which entries); `training.data` reads tokens.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refinery.hashing import splitmix64
from training.accounting import mixture_report
from training.allocation import PLAN_SCALE, BucketExhausted, PhaseAllocation, RowAllocator
from training.entry_sets import Cursor, EntrySet, Pieces, StreamWindow
from training.handover import Handover, read_by, settle, taken_sets
from training.sampler_state import SAMPLER_STATE_VERSION, ChunkStates, refuse_foreign_state
from training.schedule import StepSchedule

def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def row_keys(seed: int, rows: np.ndarray) -> np.ndarray:
    """One pseudo-random uint64 per global row index, a pure function of (seed, row)."""
    with np.errstate(over="ignore"):
        return splitmix64(splitmix64(np.uint64(stable_hash(f"seed:{seed}")) ^ rows.astype(np.uint64)))


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
        self.allocator = RowAllocator(schedule, self.buckets)

    def done(self) -> bool:
        return self.step >= self.schedule.total_steps

    def set_for(self, phase: int, bucket: str) -> EntrySet:
        for j in range(phase, -1, -1):
            if bucket in self.sets_by_phase[j]:
                return self.sets_by_phase[j][bucket]
        raise KeyError(f"phase {self.schedule.phase_names[phase]!r} weights bucket {bucket!r}, which no manifest lists")

    def reading(self, es: EntrySet) -> tuple[Cursor, Handover | None]:
        """The cursor and handover of `es`'s group once `es` reads it (`training.handover.read_by`)."""
        return read_by(es, self.cursors.get(es.group, Cursor()), self.handovers.get(es.group), self.set_by_key)

    def allocation(self, phase: int, dropped: list[tuple[str, int]] | None = None) -> PhaseAllocation:
        """Rows per (step, bucket) of the whole phase given the drops (default: this sampler's), as the
        chunks plan them: for inspection and tests (O(steps of the phase))."""
        return self.allocator.phase_allocation(phase, self.dropped if dropped is None else dropped)

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
            quota, counts = self.allocator.allocate(phase, lo, hi, self.plan_offset, self.dropped)
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
        windows = [es.window(cursor, int(cursors[-1, i] - base[i]), taken_sets(h, cursor, self.set_by_key),
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
        """Tokens per phase and bucket the mixture plans (`RowAllocator.planned_tokens`)."""
        return self.allocator.planned_tokens()

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
        refuse_foreign_state(state, self.schedule, self.seed, self.set_by_key)
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
