"""The prefetching loader: chunks planned and gathered in bulk, buffers reused only after the consumer
has moved on, the same steps with and without worker processes, exhaustion delivered in order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import training.loader as loader_mod
from refinery.config import load_config
from refinery.storage import LocalDataRoot
from training.data import CurriculumData
from training.loader import Exhausted, Prefetcher, StepStream, make_loader
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, tiny_run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = load_config(tiny_run(tmp_path_factory.mktemp("tiny")))
    return CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)


def reference_steps(data, rows):
    sampler, out = data.sampler(False), []
    while not sampler.done():
        plan = sampler.plan_next()
        out.append(data.gather(plan, rows))
    return out


@pytest.mark.parametrize("workers", [0, 2, 3])  # rings of 3, 3 and 2 slots per producer
def test_loader_serves_the_reference_steps_and_held_batches_stay_intact(tiny, workers, monkeypatch):
    """Chunks of 3 steps, so the reuse ring wraps many times; the consumer keeps the previous batch
    and checks it is unchanged once the next one has arrived."""
    monkeypatch.setattr(loader_mod, "CHUNK_TOKENS", 3 * 2 * 32)
    rows = tiny.rank_rows(1, 2)
    expect = reference_steps(tiny, rows)
    previous = None
    served = 0
    for batch in make_loader(StepStream(tiny, None, False, 1, 2), workers):
        want = expect[batch.step]
        assert batch.step == served
        got = {"tokens": batch.tokens, "doc_ids": batch.layout.doc_ids(), "target_mask": batch.layout.target_mask(),
               "row_bucket": batch.row_bucket}
        for name, value in got.items():
            np.testing.assert_array_equal(value.numpy(), want[name], err_msg=f"step {batch.step} {name}")
        if previous is not None:
            held, copy = previous
            assert torch.equal(held.tokens, copy), f"step {held.step}'s tokens changed while it was held"
        previous = (batch, batch.tokens.clone())
        served += 1
    assert served == tiny.schedule.total_steps


def test_row_layouts_expand_to_the_per_token_reference(tiny):
    """Each step's layout, cut out of a chunk's, expands to the doc ids and target mask built token by
    token from the pieces the rows read: a target counts when the next token lies in the same entry
    and outside that entry's overlap prefix."""
    rows = tiny.rank_rows(1, 2)
    per, sampler, overlapped = rows.stop - rows.start, tiny.sampler(False), 0
    while not sampler.done():
        chunk = sampler.plan_steps(5)
        L = chunk.seq_len
        out = tiny.gather_steps(chunk, rows, np.arange(chunk.steps), record=True)
        for j, pieces in enumerate(out["consumed"]):
            doc, in_overlap = [[] for _ in range(per)], [[] for _ in range(per)]
            for row, bucket, entry, a, b in zip(*(pieces[k].tolist() for k in ("row", "bucket", "entry", "a", "b"))):
                r, overlap = row - rows.start, int(tiny.buckets[tiny.bucket_names[bucket]].table(np.array([entry]))[3][0])
                ordinal = doc[r][-1] + 1 if doc[r] else 0
                doc[r] += [ordinal] * (b - a)
                in_overlap[r] += [t < overlap for t in range(a, b)]
            doc, in_overlap = np.array(doc), np.array(in_overlap)
            mask = np.zeros((per, L), dtype=bool)
            mask[:, :-1] = (doc[:, 1:] == doc[:, :-1]) & ~in_overlap[:, 1:]
            overlapped += int(in_overlap[:, 1:].sum())
            layout = out["layouts"][j]
            np.testing.assert_array_equal(layout.doc_ids().numpy(), doc, err_msg=f"step {chunk.step + j} doc ids")
            np.testing.assert_array_equal(layout.target_mask().numpy(), mask, err_msg=f"step {chunk.step + j} mask")
    assert overlapped > 100, "the tiny run's windows carry overlap prefixes, so the skipped targets are exercised"


@pytest.mark.parametrize("workers", [0, 2])
def test_exhaustion_arrives_after_the_last_full_step(tmp_path, workers, monkeypatch):
    monkeypatch.setattr(loader_mod, "CHUNK_TOKENS", 2 * 4 * 32)
    buckets = {"web": SyntheticBucket(200, 60), "math": SyntheticBucket(6, 30, max_epochs=1)}
    phases = [SyntheticPhase("only", 4096, {"web": 0.5, "math": 0.5}, seq_len=32)]
    cfg = load_config(tiny_run(tmp_path, phases=phases, buckets=buckets))
    data = CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)
    items = list(make_loader(StepStream(data, None, False, 0, 1), workers))
    assert isinstance(items[-1], Exhausted) and items[-1].bucket == "math"
    assert [b.step for b in items[:-1]] == list(range(items[-1].step))


def test_prefetcher_raises_the_source_error_where_it_happened():
    def source():
        yield [1, 2]
        raise RuntimeError("shard vanished")

    got = []
    with pytest.raises(RuntimeError, match="shard vanished"):
        for item in Prefetcher(source()):
            got.append(item)
    assert got == [1, 2]


def _voluntary_switches() -> int:
    with open("/proc/thread-self/status") as f:
        return int(f.read().split("voluntary_ctxt_switches:")[1].split()[0])


def test_the_in_process_ring_waits_for_the_consumer_without_polling():
    """The stream's thread, ahead of a slow consumer, sleeps until the consumer moves on: a thread
    polling would take the GIL from the trainer every half millisecond."""
    import threading
    import time

    ring = loader_mod._Ring(False, 0)
    reuse = ring.per_producer  # the first chunk to reuse a slot (chunk 0's)
    got, switches = [], []

    def produce():
        before = _voluntary_switches()
        got.append(ring.acquire(reuse, 1))
        switches.append(_voluntary_switches() - before)

    thread = threading.Thread(target=produce)
    thread.start()
    time.sleep(0.2)
    ring.consumer_started(1)  # reading chunk 1, it may still hold a batch of chunk 0
    time.sleep(0.05)
    assert not got, "chunk 0's slot was handed out while the consumer could still hold its batch"
    ring.consumer_started(2)
    thread.join(5)
    assert got == [ring.slots[0]]
    # Polling every half millisecond wakes the thread about 500 times in these 0.25 s; waiting on the
    # condition wakes it for the two notifications, plus a few GIL handoffs when other threads of the
    # test process (a run pool's, a prefetcher's left by an earlier test) hold the GIL as it wakes.
    assert switches[0] <= 25, f"the waiting thread woke {switches[0]} times in 0.25 s"


def test_a_worker_error_or_death_reaches_the_consumer_and_no_worker_outlives_the_loader(tiny, monkeypatch):
    import multiprocessing
    import os
    import signal

    from training.data import CurriculumData as Data

    gather = Data.gather_steps

    def failing(self, chunk, *args, **kwargs):
        if chunk.step > 0:
            raise ValueError("shard torn under the worker")
        return gather(self, chunk, *args, **kwargs)

    def dying(self, chunk, *args, **kwargs):
        if chunk.step > 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return gather(self, chunk, *args, **kwargs)

    # Other tests of the session may leave processes of their own (the extraction worker); count ours.
    before = set(multiprocessing.active_children())

    def loader_workers() -> list:
        return [p for p in multiprocessing.active_children() if p not in before]

    monkeypatch.setattr(loader_mod, "CHUNK_TOKENS", 3 * 2 * 32)
    for patch, message in ((failing, r"loader worker 1 failed:(.|\n)*shard torn under the worker"),
                           (dying, r"loader worker 1 \(pid \d+\) exited unexpectedly with code -9")):
        monkeypatch.setattr(Data, "gather_steps", patch)
        steps = []
        with pytest.raises(RuntimeError, match=message):
            for batch in make_loader(StepStream(tiny, None, False, 1, 2), 2):
                steps.append(batch.step)
        assert steps == [0, 1, 2], "the first chunk arrives before the second one's failure"
        assert loader_workers() == []
    monkeypatch.setattr(Data, "gather_steps", gather)
    reading = iter(make_loader(StepStream(tiny, None, False, 1, 2), 2))
    assert [next(reading).step for _ in range(4)] == [0, 1, 2, 3]
    assert len(loader_workers()) == 2
    reading.close()  # a consumer that stops early (a SIGTERM, a halt)
    assert loader_workers() == []


def test_a_bucket_without_shards_or_with_an_entry_past_int32_is_refused(monkeypatch):
    """An entry of 2^31 tokens or more is refused by name when its shard is first opened, as is a
    bucket whose manifest lists no shard (at open)."""
    import training.shard_pool as pool_mod
    from refinery.curriculum import ShardRef

    class Cache:
        def local_prefix(self, prefix):
            return prefix

        def release(self, prefix):
            pass

    class HugeEntry:  # a shard index whose second entry is 2^31 tokens long (no tokens behind it)
        def __init__(self, prefix):
            self.offsets = np.array([0, 10, 10 + (1 << 31)], dtype=np.int64)
            self.overlaps = np.zeros(2, dtype=np.uint32)
            self.tokens = np.zeros(0, dtype=np.uint16)
            self.num_tokens = 10 + (1 << 31)

        def __len__(self):
            return 2

    pool = pool_mod.ShardPool(Cache(), capacity=2)
    with pytest.raises(ValueError, match="bucket 'web': the manifest lists no shards"):
        pool_mod.BucketIndex("web", [], pool)
    monkeypatch.setattr(pool_mod, "ShardReader", HugeEntry)
    index = pool_mod.BucketIndex("web", [ShardRef("shards/final/web/shard-00000", 10 + (1 << 31), 2, {})], pool)
    with pytest.raises(ValueError, match=r"bucket 'web': an entry of 2147483648 tokens; entries must be shorter than 2\^31"):
        index.lengths(np.array([1]))
