"""The trainer's data path at scale: computed pass orders, per-chunk planning that matches the whole
phase's allocation, resume without replay, and shard handles bounded below the file limit."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from refinery.config import load_config
from refinery.storage import LocalDataRoot
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, tiny_run
from training.data import CurriculumData
from training.pass_order import PassOrder
from training.sampler_state import SamplerStateError


def open_data(config_path, global_batch=4):
    cfg = load_config(config_path)
    return CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), global_batch)


@pytest.mark.parametrize("n, block", [(1, 4), (50, 7), (49, 7), (200_000, 1 << 16)])
def test_a_pass_order_is_a_keyed_permutation(n, block):
    order = PassOrder(n, seed=3, key="web:abc", epoch=0, block=block)
    positions = order.positions(np.arange(n))
    assert sorted(positions.tolist()) == list(range(n)), "every position exactly once"
    again = PassOrder(n, seed=3, key="web:abc", epoch=0, block=block).positions(np.arange(n))
    np.testing.assert_array_equal(positions, again)
    # any slice of ordinals gives the same positions as the whole pass (chunks compute their own)
    np.testing.assert_array_equal(order.positions(np.arange(n // 3, n)), positions[n // 3:])
    if n > 10:
        for other in (PassOrder(n, 3, "web:abc", 1, block), PassOrder(n, 4, "web:abc", 0, block),
                      PassOrder(n, 3, "web:xyz", 0, block)):
            assert not np.array_equal(other.positions(np.arange(n)), positions), "a fresh order per pass, seed and set"
    with pytest.raises(IndexError):
        order.positions(np.array([n]))


def test_a_pass_reads_each_block_whole_before_the_next():
    """The randomness given up for locality: a block's positions are read together, in a random
    order inside; the blocks in a random order per pass."""
    n, block = 1000, 64
    positions = PassOrder(n, 1, "k", 0, block).positions(np.arange(n))
    blocks = positions // block
    runs = 1 + int(np.count_nonzero(np.diff(blocks)))
    assert runs == -(-n // block), "one run per block"
    assert [int(b) for b in dict.fromkeys(blocks.tolist())] != sorted(set(blocks.tolist()))
    inside = positions[blocks == blocks[0]]
    assert not np.array_equal(inside, np.sort(inside))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return open_data(tiny_run(tmp_path_factory.mktemp("tiny")))


def chunk_counts(data, chunk_steps, allow=False):
    """Rows per (step, bucket) as plan_steps(chunk_steps) plans them, phase by phase."""
    sampler, names = data.sampler(allow), list(data.schedule.tokens.buckets)
    per_phase = {}
    while not sampler.done():
        chunk = sampler.plan_steps(chunk_steps)
        buckets = np.array([names.index(es.bucket) for es in chunk.sets])
        counts = np.zeros((chunk.steps, len(names)), dtype=np.int64)
        for i in range(chunk.steps):
            np.add.at(counts[i], buckets[chunk.row_set[i]], 1)
        per_phase.setdefault(chunk.phase, []).append(counts)
    return sampler, {j: np.concatenate(c) for j, c in per_phase.items()}


@pytest.mark.parametrize("chunk_steps", [1, 7, 64])
def test_per_chunk_planning_allocates_exactly_as_the_whole_phase(tiny, chunk_steps):
    sampler, counts = chunk_counts(tiny, chunk_steps)
    for j, got in counts.items():
        np.testing.assert_array_equal(got, sampler.allocation(j).counts)


def test_a_resumed_sampler_continues_without_replaying(tiny):
    """From a saved state alone: no step before it is planned again, and every later plan (rows,
    sets, stream starts, pieces) is the one an uninterrupted sampler makes."""
    straight = tiny.sampler(False)
    for _ in range(23):
        straight.plan_next()
    state = json.loads(json.dumps(straight.state_dict(1)))  # what a checkpoint stores survives JSON
    resumed = tiny.sampler(False)
    resumed.load_state_dict(state, 1)
    assert resumed.step == 23
    while not straight.done():
        want, got = straight.plan_next(), resumed.plan_next()
        np.testing.assert_array_equal(got.row_start, want.row_start)
        a, b = want.pieces(slice(0, 4)), got.pieces(slice(0, 4))
        for field in ("row", "epoch", "entry", "a", "b"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert resumed.mixture_report() == straight.mixture_report()


def test_a_resume_after_an_exhaustion_drop_continues_the_renormalized_allocation(tmp_path):
    buckets = {"web": SyntheticBucket(200, 60), "math": SyntheticBucket(6, 30, max_epochs=1)}
    phases = [SyntheticPhase("only", 4096, {"web": 0.5, "math": 0.5}, seq_len=32)]
    data = open_data(tiny_run(tmp_path, phases=phases, buckets=buckets))
    straight = data.sampler(True)
    states = []
    while not straight.done():
        states.append(straight.state_dict(1))
        straight.plan_steps(3)
    [(_, at)] = straight.dropped
    later = next(s for s in states if s["step"] > at)
    resumed = data.sampler(True)
    resumed.load_state_dict(later, 1)
    _, whole = chunk_counts(data, 3, allow=True)
    names = list(data.schedule.tokens.buckets)
    step = resumed.step
    while not resumed.done():
        chunk = resumed.plan_steps(3)
        for i in range(chunk.steps):
            got = np.bincount([names.index(chunk.sets[s].bucket) for s in chunk.row_set[i]], minlength=len(names))
            np.testing.assert_array_equal(got, whole[0][step + i])
        step += chunk.steps


def test_a_version_2_state_is_refused_saying_how_to_continue(tiny):
    state = {**tiny.sampler(False).state_dict(1), "version": 2}
    with pytest.raises(SamplerStateError, match="version 2: .*full permutation.*resume with the trainer version"):
        tiny.sampler(False).load_state_dict(state, 1)


def test_open_reads_no_shard_and_the_pool_stays_bounded(tmp_path):
    buckets = {"web": SyntheticBucket(400, 40, shards=40), "math": SyntheticBucket(100, 40, max_epochs=4, shards=10)}
    data = open_data(tiny_run(tmp_path, buckets=buckets))
    assert len(data.pool) == 0 and data.pool.opens == 0
    data.pool.capacity = 5
    sampler = data.sampler(False)
    while not sampler.done():
        chunk = sampler.plan_steps(8)
        data.gather_steps(chunk, slice(0, 4), np.arange(chunk.steps))
        assert len(data.pool) <= 5
    assert data.pool.opens > 5, "shards were evicted and opened again"


CHILD = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from refinery.config import load_config
    from refinery.storage import LocalDataRoot
    from training.data import CurriculumData
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    cfg = load_config(sys.argv[1])
    data = CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)
    sampler, served = data.sampler(False), 0
    while not sampler.done():
        chunk = sampler.plan_steps(16)
        out = data.gather_steps(chunk, slice(0, 4), np.arange(chunk.steps))
        served += out["tokens"].size
    print(served, data.pool.capacity, sum(len(b.shards) for b in data.buckets.values()))
""")


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 512, reason="needs a hard file limit of 512")
def test_a_run_reads_more_shards_than_the_file_limit_allows_open(tmp_path):
    """With RLIMIT_NOFILE at 256, a run over 300 shards (two maps and two descriptors each if all
    were open) trains every step: the pool keeps what the limit leaves."""
    buckets = {"web": SyntheticBucket(1200, 24, shards=240), "math": SyntheticBucket(300, 24, max_epochs=4, shards=60)}
    config = tiny_run(tmp_path, buckets=buckets)
    done = subprocess.run([sys.executable, "-c", CHILD, str(config), "256"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    served, capacity, shards = map(int, done.stdout.split())
    data = open_data(config)
    assert served == sum(
        data.schedule.global_batch * m.seq_len * len(data.schedule.phase_steps(j)) for j, m in enumerate(data.schedule.manifests))
    assert shards == 300 and capacity < 100
