"""The trainer's data part: this process's share of each global batch, and the sampler state after
the last step it trained, which the checkpoint stores under `sampler` (torchtitan's stateful
dataloader). A resumed run continues the global order from that state, under any world size.
`Lookahead` takes the next step's batch and builds its device inputs (`StepInputs`) early, while
the device still runs the current step (the CUDA path).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from training.data import CurriculumData, RowLayout
from training.loader import Exhausted, StepBatch, StepStream, make_loader
from training.sampler_state import ChunkStates


class TrainBatches:
    """Iterating yields one `StepBatch` per step (all simulated ranks' slices joined), or `Exhausted`
    last; `commit(batch)` records that its step was trained."""

    def __init__(self, data: CurriculumData, allow_exhaustion: bool, record: bool, num_workers: int,
                 ranks: list[int], world: int):
        self.data, self.allow, self.record, self.num_workers = data, allow_exhaustion, record, num_workers
        self.ranks, self.world = ranks, world
        data.rank_rows(0, world)  # fail now, not in a worker, if the batch does not split
        self.sampler_state: dict[str, Any] | None = None
        # The last step trained, when newer than sampler_state: its chunk's states and its index there.
        self.committed: tuple[ChunkStates, int] | None = None

    def __iter__(self) -> Iterator[StepBatch | Exhausted]:
        loaders = [make_loader(StepStream(self.data, self.state_dict(), self.allow, r, self.world, self.record),
                               self.num_workers)
                   for r in self.ranks]
        for parts in zip(*loaders):
            exhausted = [p for p in parts if isinstance(p, Exhausted)]
            if exhausted:
                yield exhausted[0]
                return
            yield parts[0] if len(parts) == 1 else StepBatch(
                step=parts[0].step, phase=parts[0].phase,
                tokens=torch.cat([p.tokens for p in parts]), row_bucket=torch.cat([p.row_bucket for p in parts]),
                layout=RowLayout.cat([p.layout for p in parts]),
                states=parts[0].states, dropped=parts[0].dropped,
                consumed={k: torch.cat([torch.from_numpy(p.consumed[k]) for p in parts]).numpy() for k in parts[0].consumed}
                if parts[0].consumed is not None else None,
            )

    def commit(self, batch: StepBatch) -> None:
        self.committed = (batch.states, batch.step - batch.states.first_step)  # built when a checkpoint asks

    def state_dict(self) -> dict[str, Any] | None:
        if self.committed is not None:
            states, i = self.committed
            self.sampler_state, self.committed = states.state(i), None
        return self.sampler_state

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Take a checkpoint's sampler state, refusing one this run's global order cannot continue."""
        self.sampler_state, self.committed = state, None
        if state is not None:
            probe = self.data.sampler(self.allow)
            for note in probe.load_state_dict(state, self.world):
                print(f"refinery train: {note}")


@dataclass
class StepInputs:
    """One step's tensors on the trainer's device (`Trainer.step_inputs`), and its rows per bucket."""

    tokens: torch.Tensor  # int64 (rows, the phase's seq_len)
    targets: torch.Tensor  # int64, IGNORE where the target does not count
    doc_ids: torch.Tensor
    row_bucket: torch.Tensor
    rows: torch.Tensor  # int64 (buckets,) on the host: rows served per bucket
    n_targets: torch.Tensor  # counted targets over all ranks
    masks: list[Any]  # per micro-batch: the model's attention mask, built ahead


class Lookahead:
    """The loop's batches, taken one step early when asked. `fetch()` takes the next batch and builds
    its device inputs; the trainer calls it while the device still runs the current step's backward.
    `next()` returns that batch, or takes one itself when none was fetched. An error in `fetch()` is
    raised by the `next()` that needs its batch, where it would have been raised without a lookahead.
    The wait returned is the wait for the batch alone, as before (its inputs are built elsewhere)."""

    def __init__(self, batches: Iterator[StepBatch | Exhausted], build: Callable[[StepBatch], StepInputs]):
        self.batches, self.build = batches, build
        self.ahead: tuple[StepBatch | Exhausted | Exception, float, StepInputs | None] | None = None

    def fetch(self) -> None:
        t0 = time.perf_counter()
        try:
            batch = next(self.batches)
            wait = time.perf_counter() - t0
            self.ahead = (batch, wait, None if isinstance(batch, Exhausted) else self.build(batch))
        except Exception as err:  # raised where the step that needs this batch begins
            self.ahead = (err, time.perf_counter() - t0, None)

    def next(self) -> tuple[StepBatch | Exhausted, float, StepInputs | None]:
        """(batch, seconds waited for it, its device inputs or None: built by the step itself)."""
        if self.ahead is None:
            t0 = time.perf_counter()
            batch = next(self.batches)
            return batch, time.perf_counter() - t0, None
        batch, wait, inputs = self.ahead
        self.ahead = None
        if isinstance(batch, Exception):
            raise batch
        return batch, wait, inputs
