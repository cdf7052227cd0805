"""Exact mixtures: at the end of every step each bucket's rows in the phase so far stay within one row
of the plan (the sum of each step's mixture, boundary blends included), on the demo curriculum, on
awkward synthetic ones, through exhaustion drops and through the sampler's own planning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from refinery.config import load_config
from refinery.curriculum import build_schedule
from refinery.curriculum import PhaseManifest
from refinery.storage import LocalDataRoot
from training.allocation import allocate_rows, quantize_rows
from training.data import CurriculumData
from training.sampler import CurriculumSampler
from training.sampler_state import SamplerStateError
from training.schedule import StepSchedule
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, tiny_run

REPO = Path(__file__).resolve().parents[1]


def manifests_of(schedule) -> list[PhaseManifest]:
    """Phase manifests carrying only the schedule (no shards): what the allocation reads."""
    total = schedule.total_tokens
    return [
        PhaseManifest(p.name, p.index, p.tokens, p.seq_len, p.lr_scale,
                      {b: float(w) for b, w in zip(schedule.buckets, p.weights)},
                      p.blend_tokens / total, {})
        for p in schedule.phases
    ]


def assert_within_one_row(steps: StepSchedule, sampler: CurriculumSampler) -> int:
    """Checks every step of every phase; returns how many (step, bucket) points were checked."""
    checked = 0
    G = steps.global_batch
    for j in range(len(steps.manifests)):
        counts = sampler.allocation(j).counts
        weights = steps.phase_weights(j)
        assert (counts >= 0).all()
        assert (counts.sum(axis=1) == G).all(), "every step is exactly full"
        assert not counts[:, weights.sum(axis=0) == 0].any(), "a bucket without weight gets no rows"
        served = np.cumsum(counts, axis=0)
        planned = np.cumsum(G * weights / weights.sum(axis=1, keepdims=True), axis=0)
        gap = np.abs(served - planned)
        assert gap.max(initial=0) <= 1 + 1e-6, f"phase {j}: {gap.max():.4f} rows off plan"
        checked += gap.size
    return checked


@pytest.mark.parametrize("global_batch", [1, 3, 4, 16, 64])
def test_demo_mixture_is_within_one_row_at_every_step(global_batch):
    schedule = build_schedule(load_config(REPO / "configs/demo.yaml"))
    steps = StepSchedule.build(manifests_of(schedule), global_batch)
    assert any(p.blend_tokens for p in schedule.phases), "the demo blends at its boundaries"
    assert assert_within_one_row(steps, CurriculumSampler(steps, [], 0, False)) >= steps.total_steps * 5


def test_awkward_weights_and_blends_are_within_one_row():
    rng = np.random.default_rng(3)
    for trial in range(6):
        buckets = [f"b{i}" for i in range(int(rng.integers(2, 8)))]
        phases = []
        for i in range(3):
            w = rng.dirichlet(np.full(len(buckets), 0.3))
            w[rng.random(len(buckets)) < 0.3] = 0.0  # switched-off buckets
            w[int(rng.integers(len(buckets)))] += 1e-3
            w = w / w.sum()
            seq_len = int(rng.choice([16, 32, 48]))
            phases.append(PhaseManifest(f"p{i}", i, seq_len * int(rng.integers(40, 400)), seq_len, 1.0,
                                        dict(zip(buckets, w.tolist())), 0.0 if i == 0 else float(rng.uniform(0, 0.3)), {}))
        steps = StepSchedule.build(phases, int(rng.integers(1, 13)))
        assert_within_one_row(steps, CurriculumSampler(steps, [], trial, False))


def test_allocation_never_takes_a_row_back_where_rounding_the_plan_would():
    """Weights 8:2:1:8 with three rows per step: rounding each step's cumulative plan by largest
    remainder gives the third bucket 2 rows after step 9 and 1 after step 10 (the Alabama paradox),
    which no allocation can serve. Deadlines keep every step's counts non-negative and in bounds."""
    w = np.array([8, 2, 1, 8]) / 19
    plan = np.arange(1, 13)[:, None] * 3 * w
    floor = np.floor(plan)
    short = np.rint(plan.sum(axis=1) - floor.sum(axis=1)).astype(int)
    rank = np.argsort(np.argsort(-(plan - floor), axis=1, kind="stable"), axis=1)
    rounded = floor + (rank < short[:, None])
    assert (np.diff(rounded, axis=0) < 0).any(), "largest-remainder rounding takes a row back"
    counts = allocate_rows(quantize_rows(np.tile(w, (12, 1)), 3), 3)
    assert (counts >= 0).all() and (counts.sum(axis=1) == 3).all()
    assert (np.abs(np.cumsum(counts, axis=0) - plan) <= 1 + 1e-9).all()


def test_phase_weights_are_the_per_step_weights(tmp_path):
    cfg = load_config(tiny_run(tmp_path))
    data = CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)
    s = data.schedule
    for j in range(len(s.manifests)):
        bulk = s.phase_weights(j)
        for i, step in enumerate(s.phase_steps(j)):
            assert bulk[i].tolist() == list(s.weights_at(step).values())


def test_sampler_serves_the_allocation_and_reports_planned_and_served(tmp_path):
    cfg = load_config(tiny_run(tmp_path))
    data = CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)
    sampler = data.sampler(False)
    served: dict[tuple[int, str], int] = {}
    while not sampler.done():
        chunk = sampler.plan_steps(7)
        for row_set in chunk.row_set:
            for si in row_set.tolist():
                key = (chunk.phase, chunk.sets[si].bucket)
                served[key] = served.get(key, 0) + chunk.seq_len
    names = data.schedule.phase_names
    reported = sampler.served_tokens()
    assert {(names.index(p), b): t for p, by in reported.items() for b, t in by.items()} == served
    planned = sampler.planned_tokens()
    for phase, by_bucket in planned.items():
        L = data.schedule.manifests[names.index(phase)].seq_len
        assert sum(by_bucket.values()) == pytest.approx(sum(reported[phase].values()))
        for bucket, tokens in by_bucket.items():
            assert abs(reported[phase].get(bucket, 0) - tokens) <= L, (phase, bucket)
    midway = data.sampler(False)
    for _ in range(data.schedule.phase_starts[1] + 3):
        midway.plan_next()
    resumed = data.sampler(False)
    resumed.load_state_dict(midway.state_dict(1), 1)
    report = resumed.mixture_report()
    assert {p: {b: v["planned"] for b, v in by.items()} for p, by in report.items()} == planned
    assert sum(v["served"] for v in report[names[1]].values()) == 3 * 4 * data.schedule.manifests[1].seq_len
    assert sum(v["served"] for v in report[names[2]].values()) == 0
    assert {b: v["served"] for b, v in report[names[0]].items()} == reported[names[0]]


def test_states_inside_a_bulk_plan_equal_step_by_step_states(tmp_path):
    cfg = load_config(tiny_run(tmp_path))
    data = CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)
    one = data.sampler(False)
    stepwise = []
    while not one.done():
        one.plan_next()
        stepwise.append(one.state_dict(2))
    bulk = data.sampler(False)
    states = []
    while not bulk.done():
        chunk = bulk.plan_steps(5)
        states += [bulk.state_after(chunk, i, 2) for i in range(chunk.steps)]
    assert states == stepwise
    assert {s["schedule"] for s in states[: data.schedule.phase_starts[1]]} == {states[0]["schedule"]}


def math_runs_dry(tmp_path) -> CurriculumData:
    """One phase whose "math" bucket (six short entries, one epoch) runs dry partway through."""
    buckets = {"web": SyntheticBucket(200, 60), "math": SyntheticBucket(6, 30, max_epochs=1),
               "code": SyntheticBucket(100, 50)}
    phases = [SyntheticPhase("only", 8192, {"web": 0.5, "math": 0.3, "code": 0.2}, seq_len=32)]
    cfg = load_config(tiny_run(tmp_path, phases=phases, buckets=buckets))
    return CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)


def test_states_inside_bulk_plans_equal_step_by_step_states_across_a_drop(tmp_path):
    data = math_runs_dry(tmp_path)
    one, stepwise = data.sampler(True), []
    while not one.done():
        one.plan_next()
        stepwise.append(one.state_dict(1))
    bulk, states = data.sampler(True), []
    while not bulk.done():
        chunk = bulk.plan_steps(16)
        states += bulk.states_after(chunk, 1)
    [(bucket, at)] = bulk.dropped
    assert bucket == "math" and 0 < at < len(states) - 1
    assert [s["dropped"] for s in states[at - 1:at + 1]] == [[], [["math", at]]]
    assert states == stepwise


def test_exhaustion_drop_restarts_the_allocation_within_bounds(tmp_path):
    data = math_runs_dry(tmp_path)
    sampler = data.sampler(True)
    while not sampler.done():
        sampler.plan_steps(16)
    [(bucket, at)] = sampler.dropped
    assert bucket == "math"
    counts = sampler.allocation(0).counts
    names = list(data.schedule.tokens.buckets)
    assert not counts[at:, names.index("math")].any()
    rest = np.cumsum(counts[at:], axis=0)
    plan = np.arange(1, len(rest) + 1)[:, None] * 4 * np.array([0.5, 0.2]) / 0.7
    assert (np.abs(rest[:, [names.index("web"), names.index("code")]] - plan) <= 1 + 1e-6).all()


def test_a_version_1_state_is_refused_saying_what_changed(tmp_path):
    cfg = load_config(tiny_run(tmp_path))
    data = CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)
    state = {**data.sampler(False).state_dict(1), "version": 1}
    with pytest.raises(SamplerStateError, match="version 1: .*at random.*allocates rows to buckets exactly"):
        data.sampler(False).load_state_dict(state, 1)
