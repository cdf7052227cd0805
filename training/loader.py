"""The torch side of data delivery: each rank's stream of whole steps, split round-robin over
DataLoader workers, each batch carrying the sampler state after its step so the trainer can commit
exactly what it consumed (seed 003's per-item cursors, attached per batch instead of per item).

Steps are planned and gathered in chunks (about `CHUNK_TOKENS` tokens of a rank's rows at a time):
one plan, one vectorised lookup and one copy per chunk, then each step is handed over as torch views
of the chunk's arrays. `make_loader` runs the stream (or the DataLoader over its workers) on a
background thread that keeps `PREFETCH_STEPS` steps ready, in pinned memory when CUDA is available,
so the trainer's wait for data is a queue pop once the pipeline is warm.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training.data import CurriculumData
from training.sampler import BucketExhausted

CHUNK_TOKENS = 1 << 20
PREFETCH_STEPS = 8


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

    def pin_memory(self) -> "StepBatch":
        for name in ("tokens", "doc_ids", "target_mask", "row_bucket"):
            setattr(self, name, getattr(self, name).pin_memory())
        return self


@dataclass
class Exhausted:
    """The stream's last item when a bucket runs dry and exhaustion is not allowed."""

    bucket: str
    step: int
    message: str


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
        first = sampler.step
        per = self.rows.stop - self.rows.start
        while not sampler.done():
            L = self.data.schedule.seq_len_at(sampler.step)
            try:
                chunk = sampler.plan_steps(max(workers, CHUNK_TOKENS // (per * L) // workers * workers))
            except BucketExhausted as err:
                if (sampler.step - first) % workers == worker:
                    yield Exhausted(err.bucket, err.step, str(err))
                return
            mine = np.flatnonzero((chunk.step + np.arange(chunk.steps) - first) % workers == worker)
            if not len(mine):
                continue
            arrays = self.data.gather_steps(chunk, self.rows, mine, self.record)
            tensors = {k: torch.from_numpy(arrays[k]) for k in ("tokens", "doc_ids", "target_mask", "row_bucket")}
            for j, i in enumerate(mine.tolist()):
                yield StepBatch(
                    step=chunk.step + i, phase=chunk.phase, seq_len=chunk.seq_len,
                    tokens=tensors["tokens"][j], doc_ids=tensors["doc_ids"][j], target_mask=tensors["target_mask"][j],
                    row_bucket=tensors["row_bucket"][j], sampler_state=sampler.state_after(chunk, i, self.world_size),
                    dropped=chunk.dropped if i == 0 else [],
                    consumed=arrays["consumed"][j] if self.record else None,
                )


def _keep(item: Any) -> Any:
    return item


class Prefetcher:
    """Iterates `source` on a background thread, `depth` items ahead, pinning batches when CUDA is
    available; an error in the source is raised to the consumer at the item where it happened."""

    _END = object()

    def __init__(self, source: Iterable[Any], depth: int = PREFETCH_STEPS, pin: bool | None = None):
        self.source, self.depth = source, depth
        self.pin = torch.cuda.is_available() if pin is None else pin

    def __iter__(self) -> Iterator[Any]:
        items: queue.Queue = queue.Queue(self.depth)
        stop = threading.Event()
        source = iter(self.source)  # DataLoader workers fork here, on the caller's thread

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    items.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for item in source:
                    if self.pin and isinstance(item, StepBatch):
                        item = item.pin_memory()
                    if not put(item):
                        return
                put(self._END)
            except BaseException as err:  # handed to the consumer, who raises it
                put(err)

        thread = threading.Thread(target=produce, name="refinery-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = items.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()
            del source


def make_loader(stream: StepStream, num_workers: int) -> Prefetcher:
    """The rank's steps, prefetched on a background thread: from the stream itself with
    num_workers=0, else from a DataLoader whose workers take whole steps round-robin."""
    if num_workers == 0:
        return Prefetcher(stream)
    loader = DataLoader(stream, batch_size=None, num_workers=num_workers, collate_fn=_keep, prefetch_factor=2)
    return Prefetcher(loader)
