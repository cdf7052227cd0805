"""The torch side of data delivery: each rank's stream of whole steps, split round-robin over
DataLoader workers, each batch carrying the sampler state after its step so the trainer can commit
exactly what it consumed (seed 003's per-item cursors, attached per batch instead of per item).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training.data import CurriculumData
from training.sampler import BucketExhausted, StepPlan


@dataclass
class StepBatch:
    """One step's rows for the ranks this process serves, plus the sampler state after the step."""

    step: int
    phase: int
    seq_len: int
    tokens: torch.Tensor  # int32 (rows, seq_len)
    doc_ids: torch.Tensor  # int32 (rows, seq_len): entry ordinal within the row, for attention masking
    target_mask: torch.Tensor  # bool (rows, seq_len): position i's target (token i+1) counts in the loss
    row_bucket: torch.Tensor  # int64 (rows,): index into CurriculumData.bucket_names
    sampler_state: dict[str, Any]
    dropped: list[str]
    consumed: dict[str, np.ndarray] | None = None  # pieces, when recording consumption


@dataclass
class Exhausted:
    """The stream's last item when a bucket runs dry and exhaustion is not allowed."""

    bucket: str
    step: int
    message: str


def to_step_batch(plan: StepPlan, arrays: dict[str, Any], state: dict[str, Any]) -> StepBatch:
    return StepBatch(
        step=plan.step,
        phase=plan.phase,
        seq_len=plan.seq_len,
        tokens=torch.from_numpy(arrays["tokens"]),
        doc_ids=torch.from_numpy(arrays["doc_ids"]),
        target_mask=torch.from_numpy(arrays["target_mask"]),
        row_bucket=torch.from_numpy(arrays["row_bucket"]),
        sampler_state=state,
        dropped=plan.dropped,
        consumed=arrays.get("consumed"),
    )


class StepStream(IterableDataset):
    """The steps one rank reads, from a sampler state on; whole steps round-robin over workers."""

    def __init__(self, data: CurriculumData, state: dict[str, Any] | None, allow_exhaustion: bool,
                 rank: int, world_size: int, record: bool = False):
        self.data, self.state, self.allow = data, state, allow_exhaustion
        self.rank, self.world_size, self.record = rank, world_size, record
        self.rows = data.rank_rows(rank, world_size)

    def __iter__(self) -> Iterator[StepBatch | Exhausted]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        sampler = self.data.sampler(self.allow)
        if self.state is not None:
            sampler.load_state_dict(self.state, self.world_size)
        i = 0
        while not sampler.done():
            try:
                plan = sampler.plan_next()
            except BucketExhausted as err:
                if i % workers == worker:
                    yield Exhausted(err.bucket, err.step, str(err))
                return
            if i % workers == worker:
                state = sampler.state_dict(self.world_size)
                yield to_step_batch(plan, self.data.gather(plan, self.rows, self.record), state)
            i += 1


def _keep(item: Any) -> Any:
    return item


def make_loader(stream: StepStream, num_workers: int) -> DataLoader:
    return DataLoader(
        stream, batch_size=None, num_workers=num_workers, collate_fn=_keep, prefetch_factor=2 if num_workers else None
    )
