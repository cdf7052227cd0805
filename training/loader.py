"""The torch side of data delivery: each rank's stream of whole steps, each batch carrying the
sampler state after its step so the trainer can commit exactly what it consumed (seed 003's
per-item cursors, attached per batch instead of per item).

Steps are planned and gathered in chunks of about `CHUNK_TOKENS` tokens of a rank's rows: one plan,
one vectorised lookup and one copy per chunk, then each step is handed over as torch views of the
chunk's arrays. With DataLoader workers, whole chunks go round-robin to the workers (chunk c to
worker c % k; every worker plans the same chunks), so one message carries a chunk, and the order a
rank sees depends on neither the world size nor the worker count. `make_loader` runs the stream, or
the DataLoader over its workers, on a background thread that keeps chunks ready, in pinned memory
when CUDA is available, so the trainer's wait for data is a queue pop once the pipeline is warm.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training.data import CurriculumData
from training.sampler import BucketExhausted

CHUNK_TOKENS = 1 << 20
PREFETCH_CHUNKS = 2
# Without workers, gather outputs are reused round-robin: the producer may fill one chunk while
# PREFETCH_CHUNKS wait in the queue, the consumer reads one and may still hold the one before it.
RING_CHUNKS = PREFETCH_CHUNKS + 3
BATCH_FIELDS = ("tokens", "doc_ids", "target_mask", "row_bucket")


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


@dataclass
class StepChunk:
    """Consecutive steps of one rank gathered together: arrays with a leading step axis."""

    first_step: int
    phase: int
    seq_len: int
    arrays: dict[str, torch.Tensor]  # BATCH_FIELDS, each (steps, rows, ...)
    states: list[dict[str, Any]]  # the sampler state after each step
    dropped: list[str]  # buckets dropped at the first step
    consumed: list[dict[str, np.ndarray]] | None

    def pin_memory(self) -> "StepChunk":
        self.arrays = {k: v if v.is_pinned() else v.pin_memory() for k, v in self.arrays.items()}
        return self

    def batches(self) -> list[StepBatch]:
        views = {k: v.unbind(0) for k, v in self.arrays.items()}
        return [
            StepBatch(self.first_step + j, self.phase, self.seq_len, *(views[k][j] for k in BATCH_FIELDS),
                      sampler_state=state, dropped=self.dropped if j == 0 else [],
                      consumed=self.consumed[j] if self.consumed is not None else None)
            for j, state in enumerate(self.states)
        ]


class StepStream(IterableDataset):
    """The steps one rank reads, from a sampler state on; whole chunks round-robin over workers."""

    def __init__(self, data: CurriculumData, state: dict[str, Any] | None, allow_exhaustion: bool,
                 rank: int, world_size: int, record: bool = False):
        self.data, self.state, self.allow = data, state, allow_exhaustion
        self.rank, self.world_size, self.record = rank, world_size, record
        self.rows = data.rank_rows(rank, world_size)

    def __iter__(self) -> Iterator[StepBatch | Exhausted]:
        for chunk in self.chunks():
            yield from chunk.batches() if isinstance(chunk, StepChunk) else [chunk]

    def chunks(self, reuse_buffers: bool = False, pin: bool = False) -> Iterator[StepChunk | Exhausted]:
        """This worker's chunks. With `reuse_buffers`, a chunk's arrays are a buffer filled again
        RING_CHUNKS chunks later (pinned with `pin`), so a consumer holds at most the chunk before the
        one it reads; without, every chunk gets fresh arrays (what crosses a process boundary)."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        sampler = self.data.sampler(self.allow)
        if self.state is not None:
            sampler.load_state_dict(self.state, self.world_size)
        per = self.rows.stop - self.rows.start
        ring = [_Buffers(pin) for _ in range(RING_CHUNKS)] if reuse_buffers else None
        c = 0
        while not sampler.done():
            L = self.data.schedule.seq_len_at(sampler.step)
            try:
                plan = sampler.plan_steps(max(1, CHUNK_TOKENS // (per * L)))
            except BucketExhausted as err:
                if c % workers == worker:
                    yield Exhausted(err.bucket, err.step, str(err))
                return
            c += 1
            if (c - 1) % workers != worker:
                continue
            steps = np.arange(plan.steps)
            arrays = self.data.gather_steps(plan, self.rows, steps, self.record, ring[c % RING_CHUNKS] if ring else None)
            tensors = {k: torch.from_numpy(arrays[k]) for k in BATCH_FIELDS}
            if pin:  # tokens and target_mask were gathered into pinned buffers
                tensors["doc_ids"], tensors["row_bucket"] = tensors["doc_ids"].pin_memory(), tensors["row_bucket"].pin_memory()
            yield StepChunk(plan.step, plan.phase, plan.seq_len, tensors, sampler.states_after(plan, self.world_size),
                            plan.dropped, arrays.get("consumed"))


class _Buffers:
    """One ring slot of gather outputs, grown when a phase needs more; pinned when asked."""

    def __init__(self, pin: bool):
        self.pin = pin
        self.arrays: dict[str, np.ndarray] = {}

    def __call__(self, name: str, n: int, dtype: Any) -> np.ndarray:
        held = self.arrays.get(name)
        if held is None or len(held) < n:
            fresh = torch.from_numpy(np.empty(n, dtype=dtype))
            held = self.arrays[name] = (fresh.pin_memory() if self.pin else fresh).numpy()
        return held[:n]


class Prefetcher:
    """Iterates `source`, an iterable of lists of items, on a background thread, `depth` lists ahead,
    and yields their items; an error in the source is raised to the consumer where it happened."""

    _END = object()

    def __init__(self, source: Iterable[list[Any]], depth: int = PREFETCH_CHUNKS):
        self.source, self.depth = source, depth

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
                yield from item
        finally:
            stop.set()
            thread.join()
            del source


class _WorkerChunks(IterableDataset):
    """A stream's chunks for DataLoader workers: fresh arrays, one message per chunk."""

    def __init__(self, stream: StepStream):
        self.stream = stream

    def __iter__(self) -> Iterator[StepChunk | Exhausted]:
        return self.stream.chunks()


def _keep(item: Any) -> Any:
    return item


@dataclass
class _StepLists:
    """A stream's chunks as lists of steps for the Prefetcher, pinned on the prefetch thread (DataLoader
    workers cannot touch CUDA)."""

    stream: StepStream
    workers: int
    pin: bool

    def __iter__(self) -> Iterator[list[StepBatch | Exhausted]]:
        if self.workers == 0:
            chunks: Iterable[StepChunk | Exhausted] = self.stream.chunks(reuse_buffers=True, pin=self.pin)
        else:
            chunks = DataLoader(_WorkerChunks(self.stream), batch_size=None, num_workers=self.workers,
                                collate_fn=_keep, prefetch_factor=PREFETCH_CHUNKS)
        return map(self._steps, chunks)

    def _steps(self, chunk: StepChunk | Exhausted) -> list[StepBatch | Exhausted]:
        if isinstance(chunk, Exhausted):
            return [chunk]
        return (chunk.pin_memory() if self.pin else chunk).batches()


def make_loader(stream: StepStream, num_workers: int, pin: bool | None = None) -> Prefetcher:
    """The rank's steps, prefetched on a background thread (pinned when CUDA is available): chunks of
    the stream itself with num_workers=0, else of a DataLoader whose workers take whole chunks
    round-robin."""
    return Prefetcher(_StepLists(stream, num_workers, torch.cuda.is_available() if pin is None else pin))
