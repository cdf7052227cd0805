"""The torch side of data delivery: each rank's stream of whole steps, each batch carrying the
sampler state after its step so the trainer can commit exactly what it consumed (seed 003's
per-item cursors, attached per batch instead of per item).

Steps are planned and gathered in chunks of about `CHUNK_TOKENS` tokens of a rank's rows: one plan,
one vectorised lookup and one copy per chunk, then each step is handed over as torch views of the
chunk's arrays. With workers (forked processes), whole chunks go round-robin to the workers (chunk c
to worker c % k; every worker plans the same chunks), each gathers into a ring of shared-memory
buffers and sends only the chunk's sampler states over its own pipe, so the order a rank sees
depends on neither the world size nor the worker count. `make_loader` runs the stream, or reads the
workers, on a background thread that keeps chunks ready, in pinned memory when CUDA is available, so
the trainer's wait for data is a queue pop once the pipeline is warm.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import multiprocessing
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from training.allocation import BucketExhausted
from training.data import CurriculumData, RowLayout
from training.lifeline import worker_init
from training.sampler import CurriculumSampler
from training.sampler_state import ChunkStates

# Each chunk is one hand-over to the consumer's thread, a GIL round trip for the producer, and one
# planning call whose fixed part (cursor tables, windows, row keys, pieces) is paid per chunk: 2^21
# tokens read 25% faster than 2^20, 2^22 another 15-25% at num_workers=0 (bench/RESULTS.md), for 4
# bytes a token in each ring slot (`ring_chunks`): 48 MiB a rank at num_workers=0.
CHUNK_TOKENS = 1 << 22
PREFETCH_CHUNKS = 2
BATCH_FIELDS = ("tokens", "row_bucket")  # the arrays of a chunk; layouts travel beside them
_DTYPES = {"tokens": np.int32, "row_bucket": np.int64}


@dataclass
class StepBatch:
    """One step's rows for the ranks this process serves, plus the sampler state after the step."""

    step: int
    phase: int
    tokens: torch.Tensor  # int32 (rows, the phase's seq_len)
    row_bucket: torch.Tensor  # int64 (rows,): index into CurriculumData.bucket_names
    layout: RowLayout  # where entries start, which targets count: `doc_ids()`, `target_mask()`
    states: ChunkStates  # the sampler states of the step's chunk; this step's is `sampler_state`
    dropped: list[str]
    consumed: dict[str, np.ndarray] | None = None  # pieces, when recording consumption

    @property
    def sampler_state(self) -> dict[str, Any]:
        """The sampler state after this step (built when asked: a checkpoint's, not every step's)."""
        return self.states.state(self.step - self.states.first_step)


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
    arrays: dict[str, torch.Tensor] | None  # BATCH_FIELDS, each (steps, rows, ...)
    layouts: list[RowLayout]
    states: ChunkStates  # the sampler state after each step
    dropped: list[str]  # buckets dropped at the first step
    consumed: list[dict[str, np.ndarray]] | None
    # From a worker: the arrays stay in the ring slot they were gathered into, and only
    # (slot, shapes) cross the process boundary; the main process views the same shared memory.
    slot: tuple[int, dict[str, tuple[int, ...]]] | None = None

    def pin_memory(self) -> "StepChunk":
        self.arrays = {k: v if v.is_pinned() else v.pin_memory() for k, v in self.arrays.items()}
        return self

    def batches(self) -> list[StepBatch]:
        tokens, row_bucket = (self.arrays[k].unbind(0) for k in BATCH_FIELDS)
        out = [StepBatch(step, self.phase, *parts, self.states, [])
               for step, *parts in zip(itertools.count(self.first_step), tokens, row_bucket, self.layouts)]
        out[0].dropped = self.dropped
        for batch, pieces in zip(out, self.consumed or ()):
            batch.consumed = pieces
        return out


class StepStream:
    """The steps one rank reads, from a sampler state on; whole chunks round-robin over workers."""

    def __init__(self, data: CurriculumData, state: dict[str, Any] | None, allow_exhaustion: bool,
                 rank: int, world_size: int, record: bool = False):
        self.data, self.state, self.allow = data, state, allow_exhaustion
        self.rank, self.world_size, self.record = rank, world_size, record
        self.rows = data.rank_rows(rank, world_size)

    def chunk_steps(self, phase: int) -> int:
        """Steps of phase `phase` in one chunk: about CHUNK_TOKENS tokens of this rank's rows."""
        return max(1, CHUNK_TOKENS // self.data.step_slice_tokens(phase, self.rows))

    def chunk_sizes(self) -> dict[str, int]:
        """The most elements of each gather output one chunk of any phase needs."""
        per, phases = self.rows.stop - self.rows.start, range(len(self.data.schedule.manifests))
        rows = max(self.chunk_steps(j) * per for j in phases)
        tokens = max(self.chunk_steps(j) * self.data.step_slice_tokens(j, self.rows) for j in phases)
        return {"tokens": tokens, "row_bucket": rows}

    def _sampler(self) -> CurriculumSampler:
        sampler = self.data.sampler(self.allow)
        if self.state is not None:
            sampler.load_state_dict(self.state, self.world_size)
        return sampler

    def chunks(self, ring: "_Ring | None" = None, worker: int = 0, workers: int = 1) -> Iterator[StepChunk | Exhausted]:
        """Worker `worker`'s chunks (of `workers`), numbered from the stream's start. With a `ring`,
        chunk arrays are buffers the ring hands out again once its consumer has moved on (see
        `_Ring`); without, every chunk gets fresh arrays."""
        sampler = self._sampler()
        index = 0
        while not sampler.done():
            try:
                plan = sampler.plan_steps(self.chunk_steps(self.data.schedule.phase_at(sampler.step)))
            except BucketExhausted as err:
                if index % workers == worker:
                    yield Exhausted(err.bucket, err.step, str(err))
                return
            index += 1
            self.data.prefetch(sampler)  # the shards the next chunks read, while this one is gathered
            if (index - 1) % workers != worker:
                continue
            slot = ring.slot_of(index - 1, workers) if ring is not None else None
            buffers = ring.acquire(index - 1, workers) if ring is not None else None
            arrays = self.data.gather_steps(plan, self.rows, np.arange(plan.steps), self.record, buffers)
            states = sampler.chunk_states(plan, self.world_size)
            if ring is not None and ring.shared:  # in a worker: only (slot, shapes) go back
                shapes = {k: tuple(arrays[k].shape) for k in BATCH_FIELDS}
                yield StepChunk(plan.step, plan.phase, None, arrays["layouts"], states, plan.dropped,
                                arrays.get("consumed"), (slot, shapes))
                continue
            tensors = {k: buffers.tensor(k, arrays[k]) if buffers else torch.from_numpy(arrays[k]) for k in BATCH_FIELDS}
            yield StepChunk(plan.step, plan.phase, tensors, arrays["layouts"], states, plan.dropped,
                            arrays.get("consumed"))


def _shared_zeros(n: int, dtype: Any) -> np.ndarray:
    """An anonymous shared mapping, which forked workers inherit: no page is touched until written
    (`share_memory_` would copy the whole buffer into a new segment, 48 ms for a 2-worker ring)."""
    return np.frombuffer(mmap.mmap(-1, n * np.dtype(dtype).itemsize), dtype=dtype)


class _Buffers:
    """One ring slot of gather outputs, grown when a phase needs more; pinned or in shared memory."""

    def __init__(self, pin: bool, shared: bool, sizes: dict[str, int] | None = None):
        self.pin, self.shared = pin, shared
        self.held: dict[str, torch.Tensor] = {}
        for name, n in (sizes or {}).items():
            self._grow(name, n, _DTYPES[name])

    def _grow(self, name: str, n: int, dtype: Any) -> torch.Tensor:
        if self.pin:  # allocated pinned: `pin_memory()` of a new array would touch and copy it first
            held = torch.empty(n, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True)
        elif self.shared:
            held = torch.from_numpy(_shared_zeros(n, dtype))
        else:
            held = torch.from_numpy(np.empty(n, dtype=dtype))
        self.held[name] = held
        return held

    def __call__(self, name: str, n: int, dtype: Any) -> np.ndarray:
        held = self.held.get(name)
        if held is None or len(held) < n:
            if self.shared:
                raise AssertionError(f"a shared ring slot holds {len(held) if held is not None else 0} {name}, {n} asked")
            held = self._grow(name, n, dtype)
        return held[:n].numpy()

    def views(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        return {k: self.held[k][: int(np.prod(shape))].view(shape) for k, shape in shapes.items()}

    def tensor(self, name: str, array: np.ndarray) -> torch.Tensor:
        """`array` (given out by this slot as `name`) as a view of the slot's own tensor: a tensor
        made from the numpy array would not know its memory is pinned or shared."""
        return self.held[name][: array.size].view(array.shape)


def ring_chunks(workers: int) -> int:
    """Ring slots per producer (the stream itself, or each of `workers` processes). With k producers
    of r slots each, chunk g may refill its slot once the consumer has started chunk g - r * k + 2
    (it reads one chunk and may still hold a batch of the one before).
    - In process, the `Prefetcher` hands a chunk to a waiting consumer before it goes on, so the
      consumer has started g - 1 when the stream, the bottleneck, starts g: three slots.
    - A worker that has made chunk g can start g + k while the consumer still waits for g (started
      g - 1) iff r * k >= k + 3: workers never wait on the ring while they are the bottleneck. Four
      slots for one worker, three each for two, two each from three on (16 workers: 32 slots, not
      64)."""
    return 3 if workers == 0 else 1 + -(-3 // workers)


class _Ring:
    """Gather buffers reused round-robin, because first touching fresh pages costs more than the copy
    (on a VM, ten times more). Each producer (the stream, or each worker process) owns
    `ring_chunks(workers)` slots; chunk g of the stream fills its worker's slot g // workers % r once
    the consumer has started chunk g - r * workers + 2. In process, the stream waits for that on a
    condition the consumer notifies. With workers, the slots and `consumer_at` are shared memory
    allocated before the workers start, which a worker polls; it sends only the slot number and
    shapes, and the consumer reads the slot through its own mapping."""

    def __init__(self, pin: bool, workers: int = 0, sizes: dict[str, int] | None = None):
        self.pin, self.shared = pin, workers > 0
        self.per_producer = ring_chunks(workers)
        # Allocated before the workers start, so every process maps the same memory. Numpy: a read
        # costs a tenth of a torch tensor's.
        self.consumer_at = _shared_zeros(1, np.int64) if self.shared else np.zeros(1, dtype=np.int64)
        self.moved = threading.Condition()
        self.slots = [_Buffers(pin, self.shared, sizes) for _ in range(self.per_producer * max(workers, 1))]

    def slot_of(self, chunk: int, workers: int) -> int:
        return chunk % workers * self.per_producer + chunk // workers % self.per_producer

    def acquire(self, chunk: int, workers: int) -> _Buffers:
        """Chunk `chunk`'s slot, once the consumer no longer reads what it held before."""
        needed = chunk - self.per_producer * workers + 2
        if self.shared:
            while int(self.consumer_at[0]) < needed:
                time.sleep(0.0005)
        else:  # a thread polling here would take the GIL from the trainer 2000 times a second
            with self.moved:
                self.moved.wait_for(lambda: int(self.consumer_at[0]) >= needed)
        return self.slots[self.slot_of(chunk, workers)]

    def consumer_started(self, chunk: int) -> None:
        self._moved_to(max(int(self.consumer_at[0]), chunk))

    def release_all(self) -> None:
        """The consumer is gone: no buffer is read any more."""
        self._moved_to(1 << 62)

    def _moved_to(self, chunk: int) -> None:
        with self.moved:
            self.consumer_at[0] = chunk
            self.moved.notify_all()


class Prefetcher:
    """Iterates `source`, an iterable of lists of items, on a background thread, `depth` lists ahead,
    and yields their items; an error in the source is raised to the consumer where it happened.
    `on_list(n)` is called as the consumer starts the n-th list, and with None when it stops."""

    _END = object()

    def __init__(self, source: Iterable[list[Any]], depth: int = PREFETCH_CHUNKS,
                 on_list: Callable[[int | None], None] | None = None):
        self.source, self.depth, self.on_list = source, depth, on_list

    def __iter__(self) -> Iterator[Any]:
        items: queue.Queue = queue.Queue(self.depth)
        stop = threading.Event()
        waiting, taken = threading.Event(), threading.Event()  # the consumer is blocked on `items`; it took one
        source = iter(self.source)  # worker processes fork here, on the caller's thread

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    taken.clear()
                    items.put(item, timeout=0.1)
                except queue.Full:
                    continue
                # A consumer woken by the put needs the GIL, which this thread would win back at each
                # release (numpy gives it up around every piece it copies) for up to the interpreter's
                # switch interval (5 ms), waking the consumer for nothing each time. Blocked until the
                # consumer has the item, this thread hands it the GIL at once.
                if waiting.is_set():
                    while not taken.wait(0.1) and not stop.is_set():
                        pass
                return True
            return False

        def produce() -> None:
            try:
                for item in source:
                    if not put(item):
                        return
                put(self._END)
            except BaseException as err:  # handed to the consumer, who raises it
                put(err)
            finally:
                close = getattr(source, "close", None)  # a generator's cleanup (stopping workers) runs now
                if close is not None:
                    close()

        thread = threading.Thread(target=produce, name="refinery-prefetch", daemon=True)
        thread.start()
        try:
            n = 0
            while True:
                waiting.set()
                item = items.get()
                waiting.clear()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if self.on_list is not None:
                    self.on_list(n)  # before the producer goes on: it may reuse what the consumer left
                taken.set()
                n += 1
                yield from item
        finally:
            stop.set()
            taken.set()
            if self.on_list is not None:
                self.on_list(None)
            thread.join()


@dataclass
class _WorkerError:
    worker: int
    trace: str


def _work(stream: StepStream, ring: "_Ring", worker: int, workers: int, conn: Any) -> None:
    """A worker process: its chunks into the ring, each chunk's metadata down its pipe, then None."""
    worker_init(worker)
    try:
        for chunk in stream.chunks(ring, worker, workers):
            conn.send(chunk)
        conn.send(None)
    except BrokenPipeError:  # the consumer is gone
        pass
    except BaseException:
        conn.send(_WorkerError(worker, traceback.format_exc()))


class _Workers:
    """`count` forked processes, chunk c made by worker c % count. Each sends its chunks' metadata over
    its own pipe from its own thread: a DataLoader worker hands every item to a feeder thread, and
    the GIL hand-overs between the two, and the index queue behind them, each wait for a CPU when
    other work fills the cores (measured: see bench/RESULTS.md). Only the ring bounds how far ahead
    the workers run. Fork them on the consumer's thread: they die with it (see `worker_init`)."""

    def __init__(self, stream: StepStream, ring: "_Ring", count: int):
        context = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        for w in range(count):
            recv, send = context.Pipe(duplex=False)
            proc = context.Process(target=_work, args=(stream, ring, w, count, send), name=f"refinery-loader-{w}",
                                   daemon=True)
            proc.start()
            send.close()
            self.conns.append(recv)
            self.procs.append(proc)

    def __iter__(self) -> Iterator[StepChunk | Exhausted]:
        try:
            for chunk in itertools.count():
                w = chunk % len(self.conns)
                try:
                    item = self.conns[w].recv()
                except EOFError:
                    self.procs[w].join(1)
                    raise RuntimeError(f"loader worker {w} (pid {self.procs[w].pid}) exited unexpectedly with "
                                       f"code {self.procs[w].exitcode}") from None
                if item is None:
                    return
                if isinstance(item, _WorkerError):
                    raise RuntimeError(f"loader worker {item.worker} failed:\n{item.trace}")
                yield item
        finally:
            for conn, proc in zip(self.conns, self.procs):
                conn.close()
                proc.kill()  # it holds nothing worth saving; a worker waiting on the ring would never end
                proc.join()


@dataclass
class _StepLists:
    """A stream's chunks as lists of steps for the Prefetcher, pinned on the prefetch thread (forked
    workers cannot touch CUDA)."""

    stream: StepStream
    workers: int
    pin: bool
    ring: _Ring

    def __iter__(self) -> Iterator[list[StepBatch | Exhausted]]:
        if self.workers == 0:
            return self._lists(self.stream.chunks(self.ring))
        return self._lists(iter(_Workers(self.stream, self.ring, self.workers)))  # forks now, on this thread

    def _lists(self, chunks: Iterator[StepChunk | Exhausted]) -> Iterator[list[StepBatch | Exhausted]]:
        with contextlib.closing(chunks):
            for chunk in chunks:
                yield self._steps(chunk)

    def _steps(self, chunk: StepChunk | Exhausted) -> list[StepBatch | Exhausted]:
        if isinstance(chunk, Exhausted):
            return [chunk]
        if chunk.slot is not None:
            slot, shapes = chunk.slot
            chunk.arrays = self.ring.slots[slot].views(shapes)
        return (chunk.pin_memory() if self.pin else chunk).batches()

    def consumer_at(self, n: int | None) -> None:
        self.ring.release_all() if n is None else self.ring.consumer_started(n)


def make_loader(stream: StepStream, num_workers: int, pin: bool | None = None) -> Prefetcher:
    """The rank's steps, prefetched on a background thread (pinned when CUDA is available): chunks of
    the stream itself with num_workers=0, else of `num_workers` forked processes that take whole
    chunks round-robin. A batch's tensors are views of a reused buffer: valid while the consumer reads the
    next batch, so a consumer that keeps batches longer (beyond its step) clones them."""
    pin = torch.cuda.is_available() if pin is None else pin
    # Workers' buffers live in shared memory; a chunk from a worker is pinned by a copy on arrival.
    ring = _Ring(pin and num_workers == 0, num_workers, stream.chunk_sizes() if num_workers else None)
    lists = _StepLists(stream, num_workers, pin, ring)
    return Prefetcher(lists, on_list=lists.consumer_at)
