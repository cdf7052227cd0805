"""The phase-aware, exactly-once sampler: one global order of rows, independent of world size and
worker count, plus the state that says how far it got (OLMo-core's "global order plus a consumed
count", made phase-aware).

Its parts, each in its own module:

- `training.allocation`: how many rows each step gives each bucket (exact mixtures, within one row
  of the plan at every step).
- `training.entry_sets`: the entries each bucket serves in a phase, read as a token stream in pass
  orders (`training.pass_order`), and the cursor in it.
- `training.handover`: a pass begun in one order and continued in another.
- `training.plans`: the chunk and step plans handed to `training.data`, and the states after them.

This module walks them: per chunk (`plan_steps`), the row allocation of the chunk's steps from the
state at its start (rows served in the phase, the plan's offset from them); within a step, the rows'
slots shuffled by a counter-based PRNG (splitmix64 of (seed, row)), so every rank's slice carries the
mixture too; then each used set's stream walked over the tokens the chunk takes. Every quantity a
state holds is per bucket or per entry set, so a resumed sampler continues without replaying.

A step that would run a set past its allowed passes raises `BucketExhausted` before anything is
consumed; with exhaustion allowed, the bucket is dropped from that step on, the remaining weights
renormalized, and the allocation restarts from the rows served so far. The sampler only plans (which
set, which stream position per row, which entries); `training.data` reads tokens.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from refinery.hashing import splitmix64
from training.accounting import mixture_report
from training.allocation import PLAN_SCALE, BucketExhausted, PhaseAllocation, RowAllocator
from training.entry_sets import Cursor, EntrySet
from training.handover import Handover, read_by, settle, taken_sets
from training.plans import ChunkPlan, ChunkStates, StepPlan
from training.schedule import StepSchedule

# Version 4: cursors belong to groups of entry sets (one per bucket and selection, whatever the
# order), and `handovers` says what a pass begun in another order took. Version 3 (cursors per set)
# is read when it holds no ordered set's cursor: there the two mean the same. Version 3 computed
# pass orders block by block, version 2 held each pass as a full permutation, version 1 drew each
# row's bucket at random.
SAMPLER_STATE_VERSION = 4


class SamplerStateError(ValueError):
    """A saved sampler state that does not fit this run; the message says what changed."""


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def row_keys(seed: int, rows: np.ndarray) -> np.ndarray:
    """One pseudo-random uint64 per global row index, a pure function of (seed, row)."""
    with np.errstate(over="ignore"):
        return splitmix64(splitmix64(np.uint64(stable_hash(f"seed:{seed}")) ^ rows.astype(np.uint64)))


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
