"""The plans the sampler hands out: a chunk of consecutive steps of one phase (`ChunkPlan`), one
step of it (`StepPlan`), and the sampler state after each of its steps (`ChunkStates`). The sampler
decides them (`training.sampler`); `training.data` reads the tokens they name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training.entry_sets import Cursor, EntrySet, Pieces, StreamWindow
from training.handover import Handover, settle


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

