"""Difficulty order within a phase (issue 28, items 2 and 3): the `order` field, the band files the
phase manifests pin, the banded pass order, every sampler guarantee asserted again with ordering on,
and what `refinery validate` prints about it."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl
import pytest

from orchestration.cli import main
from refinery.config import parse_config, load_config
from refinery.curriculum.bands import served_difficulty
from refinery.curriculum import CurriculumMismatch, build_schedule, build_phase_manifest, read_selection, refuse_mismatch, validate_data_root, write_manifest
from refinery.storage import LocalDataRoot
from synthetic.curriculum import TINY_PHASES, SyntheticBucket, SyntheticPhase, tiny_run
from training.data import CurriculumData
from training.pass_order import BandedOrder, PassOrder
from training.entry_sets import EntrySet
from training.sampler_state import SamplerStateError

from helpers.configs import write_config
from helpers.exactly_once import assert_exactly_once_under_sigkill, pieces as consumed_pieces
from helpers.final_shards import DOCS_PER_BUCKET, config_dict, sample_difficulty, sample_docs, write_final_shards
from helpers.served import assert_each_pass_reads_each_entry_once, served_pieces

EASY = {"by": "difficulty", "direction": "easy_first", "bands": 4}
HARD = {"by": "difficulty", "direction": "hard_first", "bands": 3}

# The tiny curriculum with its main phase easy_first and its anneal (a quality selection of web)
# hard_first, over a web bucket small enough that warmup and main read it 3.6 times (main going on
# with warmup's pass) and the anneal twice; one web document in nine has no difficulty score.
ORDERED_BUCKETS = {"web": SyntheticBucket(docs=40, mean_len=30, max_epochs=4, unscored_every=9),
                   "math": SyntheticBucket(docs=40, mean_len=40, max_epochs=4)}
ORDERED_PHASES = [
    TINY_PHASES[0],
    SyntheticPhase("main", 3072, {"web": 0.6, "math": 0.4}, seq_len=32, interpolation=0.05, order=EASY),
    SyntheticPhase("anneal", 2048, {"web": 0.5, "math": 0.5}, seq_len=64, lr_scale=0.5, interpolation=0.05,
                   top_fraction={"web": 0.4}, order=HARD),
]
# Uniform, then ordered, then uniform again over the same entries (math; web's anneal reads a
# quality selection): each phase switch hands a pass under way to another order.
SWITCHING_PHASES = [ORDERED_PHASES[0], ORDERED_PHASES[1], TINY_PHASES[2]]


# ---- config -------------------------------------------------------------------------------------


def ordered_config(tmp_path, main_order=EASY, anneal_order=None, **extra):
    d = config_dict(tmp_path)
    phases = [dict(p) for p in d["curriculum"]["phases"]]
    if main_order is not None:
        phases[0]["order"] = main_order
    if anneal_order is not None:
        phases[1]["order"] = anneal_order
    d["curriculum"]["phases"] = phases
    return {**d, **extra}


@pytest.mark.parametrize("order, field", [
    ({"by": "difficulty", "bands": 0}, "bands"),
    ({"by": "difficulty", "bands": 1000}, "bands"),
    ({"by": "perplexity"}, "by"),
    ({"by": "difficulty", "direction": "sideways"}, "direction"),
    ({"by": "difficulty", "shuffle": False}, "shuffle"),
])
def test_bad_order_is_refused_before_anything_runs(tmp_path, capsys, order, field):
    path = write_config(tmp_path, ordered_config(tmp_path, main_order=order))
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "curriculum.phases[0].order" in err and field in err


# ---- manifests ----------------------------------------------------------------------------------


@pytest.fixture
def scored(tmp_path):
    """Final shards of both buckets whose entry tables carry `difficulty` (web's document 5 has none)."""
    root = LocalDataRoot(tmp_path / "root")
    docs = {b: sample_docs(b, n) for b, n in DOCS_PER_BUCKET.items()}
    difficulty = {b: sample_difficulty(d) for b, d in docs.items()}
    for b, d in docs.items():
        write_final_shards(root, b, d, difficulty=difficulty[b])
    return root, difficulty


def entry_difficulty(root, bucket) -> np.ndarray:
    table = pl.read_parquet(root.root / f"shards/final/{bucket}/entries.parquet")
    return table["difficulty"].to_numpy().astype(np.float64)


def band_file(root, pinned) -> list[np.ndarray]:
    ids = np.load(root.root / pinned["file"])
    return np.split(ids, np.cumsum(pinned["entries"])[:-1])


def build(cfg, root, phase):
    report, inventory, selections = validate_data_root(cfg, root)
    return report, build_phase_manifest(cfg, root, phase, report, inventory, selections)


@pytest.mark.parametrize("order", [EASY, HARD])
def test_manifest_pins_equal_count_bands_in_serving_order(tmp_path, scored, order):
    root, _ = scored
    cfg = parse_config(ordered_config(tmp_path, main_order=order))
    report, m = build(cfg, root, "main")
    assert report.ok, report.errors
    assert {k: m.order[k] for k in ("by", "direction", "bands")} == order
    for bucket, pinned in m.order["buckets"].items():
        assert pinned["file"] == f"manifests/main/{bucket}-bands.npy" and pinned["sha256"] == root.sha256(pinned["file"])
        ids = np.load(root.root / pinned["file"])
        assert ids.dtype == np.uint32 and sorted(ids.tolist()) == list(range(m.buckets[bucket].entries))
        score = entry_difficulty(root, bucket)
        bands = band_file(root, pinned)
        unscored = np.flatnonzero(np.isnan(score))
        scored_bands = bands[:-1] if len(unscored) else bands
        assert len(scored_bands) == order["bands"]
        if len(unscored):  # the unscored entries are one band of their own, served last
            assert pinned["unscored"] == len(unscored) and bands[-1].tolist() == unscored.tolist()
            assert pinned["mean_difficulty"][-1] is None
        for band in bands:
            assert (np.diff(band.astype(np.int64)) > 0).all(), "ascending within a band"
        sign = 1 if order["direction"] == "easy_first" else -1
        for a, b in zip(scored_bands, scored_bands[1:]):
            assert (sign * score[a]).max() <= (sign * score[b]).min()
        means = pinned["mean_difficulty"][: len(scored_bands)]
        assert means == pytest.approx([float(score[b].mean()) for b in scored_bands])
        assert sorted(means, reverse=sign < 0) == means
        sizes = [len(b) for b in scored_bands]
        assert max(sizes) - min(sizes) <= 2, "equal counts up to a document's windows"
        assert pinned["entries"] == [len(b) for b in bands]


def test_bands_of_a_quality_selection_hold_exactly_its_entries(tmp_path, scored):
    root, _ = scored
    cfg = parse_config(ordered_config(tmp_path, main_order=None, anneal_order=HARD))
    report, m = build(cfg, root, "anneal")
    assert report.ok, report.errors
    for bucket, sl in m.buckets.items():
        kept = read_selection(root, sl)
        ids = np.load(root.root / m.order["buckets"][bucket]["file"])
        assert sorted(ids.tolist()) == kept.tolist() and len(ids) == sl.entries


def test_an_order_over_a_bucket_without_scores_is_refused_by_validate(tmp_path, capsys):
    root = LocalDataRoot(tmp_path / "root")
    for b, n in DOCS_PER_BUCKET.items():
        write_final_shards(root, b, sample_docs(b, n))  # no difficulty column
    path = write_config(tmp_path, ordered_config(tmp_path))
    assert main(["validate", "--config", str(path)]) == 1
    out = capsys.readouterr().out
    assert ("error: curriculum.phases[0].order: phase 'main' orders bucket 'web' by difficulty, but its final shards "
            "carry no difficulty scores; difficulty must be enabled") in out


def test_trainer_refuses_a_config_whose_order_differs_from_the_manifest(tmp_path, scored):
    root, _ = scored
    built = parse_config(ordered_config(tmp_path, main_order=EASY))
    for phase in ("main", "anneal"):
        write_manifest(root, build(built, root, phase)[1])
    refuse_mismatch(built, root)  # what was validated trains
    for other in (HARD, None, {**EASY, "bands": 5}):
        with pytest.raises(CurriculumMismatch, match=r"curriculum.phases\[0\] \(main\).order: the config says"):
            refuse_mismatch(parse_config(ordered_config(tmp_path, main_order=other)), root)


# ---- validate -----------------------------------------------------------------------------------


def test_validate_prints_each_phase_order_and_the_difficulty_it_serves(tmp_path, scored, capsys):
    root, _ = scored
    path = write_config(tmp_path, ordered_config(tmp_path, main_order=EASY))
    assert main(["validate", "--config", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("ordering within buckets:")
    assert lines[at + 1:at + 3] == ["  main: easy_first by difficulty, 4 bands", "  anneal: uniform"]
    prefix = "mean difficulty served in main, at each tenth of the phase: "
    served = [float(v) for v in next(line for line in lines if line.startswith(prefix))[len(prefix):].split()]
    assert len(served) == 10 and served == sorted(served) and served[-1] > served[0] + 1.0
    assert (tmp_path / "root" / "curriculum" / "schedule.png").exists()


def test_served_difficulty_goes_on_with_the_pass_a_uniform_phase_began(tmp_path):
    """warmup reads half of web's pass uniformly, so main (easy_first) finds half of each band left:
    band 1 begins 256 tokens into main, not 512, and the next pass begins 1024 tokens in."""
    phases = [{"name": "warmup", "share": 0.25, "weights": {"web": 1.0}, "seq_len": 128},
              {"name": "main", "share": 0.75, "weights": {"web": 1.0}, "seq_len": 128, "order": EASY}]
    cfg = parse_config({**config_dict(tmp_path), "curriculum": {"total_tokens": 4096, "phases": phases}})
    schedule = build_schedule(cfg)
    bands = {"main": {"web": {"tokens": [512, 512, 512, 512], "mean_difficulty": [1.0, 2.0, 3.0, 4.0]}}}
    start = schedule.phases[1].start
    served = served_difficulty(cfg, schedule, bands, start + np.array([100, 300, 600, 900, 1100, 1600]))
    assert served.tolist() == [1.0, 2.0, 3.0, 4.0, 1.0, 2.0]


def test_validate_without_shards_prints_the_order_and_unknown_difficulty(tmp_path, capsys):
    path = write_config(tmp_path, ordered_config(tmp_path, anneal_order=HARD))
    assert main(["validate", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  main: easy_first by difficulty, 4 bands\n  anneal: hard_first by difficulty, 3 bands" in out
    assert "mean difficulty served in anneal, at each tenth of the phase: unknown (no final shards yet)" in out


# ---- the banded pass order ----------------------------------------------------------------------


def test_banded_order_reads_band_after_band_fresh_within_each_per_pass():
    sizes = [5, 0, 70_000, 3, 131_072]
    starts = np.cumsum([0, *sizes])
    orders = [BandedOrder(sizes, 3, "web:abc", epoch, block=1 << 16) for epoch in (0, 1)]
    for order in orders:
        n = sum(sizes)
        positions = order.positions(np.arange(n))
        assert sorted(positions.tolist()) == list(range(n))
        assert order.ordinals(positions).tolist() == list(range(n)), "ordinals invert positions"
        band = np.searchsorted(starts, positions, side="right") - 1
        assert (np.diff(band) >= 0).all(), "band by band"
        slot, offset = order.slot_of(np.arange(n))
        for s in np.unique(slot).tolist():  # slots, their first ordinal and their positions agree
            first = int(np.flatnonzero(slot == s)[0])
            assert order.slot_start(s) == first and offset[first] == 0
            assert order.slot_positions(s).tolist() == positions[slot == s].tolist()
        spans = order.spans_from(6, 3)
        assert spans[0][0] <= positions[6] < spans[0][1] and all(lo < hi for lo, hi in spans)
    a, b = (o.positions(np.arange(sum(sizes))) for o in orders)
    assert not np.array_equal(a, b), "a later pass shuffles each band afresh"
    assert (np.searchsorted(starts, a, side="right") == np.searchsorted(starts, b, side="right")).all(), \
        "and keeps the band order"
    plain = PassOrder(1000, 3, "k", 0)
    shuffled = PassOrder(200_000, 3, "k", 0).positions(np.arange(200_000))  # four blocks, the last short
    assert PassOrder(200_000, 3, "k", 0).ordinals(shuffled).tolist() == list(range(200_000))
    assert BandedOrder([1000], 3, "k", 0).n == plain.n  # one band: the same bijection shape, its own key


def test_entry_set_removes_held_out_entries_band_by_band(tmp_path):
    cfg = load_config(tiny_run(tmp_path, phases=ORDERED_PHASES, buckets=ORDERED_BUCKETS))
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    data = CurriculumData.open(cfg, root, 4)
    es = data.sets_by_phase[1]["web"]
    bands = band_file(root, data.schedule.manifests[1].order["buckets"]["web"])
    held = np.array(sorted([int(bands[0][3]), int(bands[2][0]), int(bands[-1][-1])]), dtype=np.int64)
    again = EntrySet("k", "web", es.index, es.pass_tokens, 1.0, 0, es.selection, held, [len(b) for b in bands])
    assert again.band_sizes == [len(bands[0]) - 1, len(bands[1]), len(bands[2]) - 1, len(bands[3]), len(bands[4]) - 1]
    expect = np.concatenate([b[~np.isin(b, held)] for b in bands]).astype(np.int64)
    assert again.ids.tolist() == expect.tolist()


# ---- the sampler, with ordering on --------------------------------------------------------------


@pytest.fixture(scope="module")
def ordered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ordered")
    config = tiny_run(tmp, phases=ORDERED_PHASES, buckets=ORDERED_BUCKETS,
                      training={"eval_entries_per_bucket": 6, "eval_every_tokens": 4096})
    cfg = load_config(config)
    return cfg, CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)


def plan_all(data, chunk=1):
    sampler, chunks = data.sampler(False), []
    while not sampler.done():
        chunks.append(sampler.plan_steps(chunk))
    return sampler, chunks


def test_ordered_sets_have_their_own_keys_and_skip_held_out_entries(ordered):
    _, data = ordered
    warm, main_, anneal = (data.sets_by_phase[j]["web"] for j in range(3))
    assert len({warm.key, main_.key, anneal.key}) == 3, "each order is keyed by its own set"
    assert warm.group == main_.group != anneal.group, "the same entries in another order share one pass"
    assert main_.band_sizes is not None and sum(main_.band_sizes) == main_.size
    held = set(data.heldout["web"].tolist())
    assert held and not held & set(main_.ids.tolist())
    assert set(main_.ids.tolist()) | held == set(range(main_.index.total_entries))


def group_reads(data, pieces):
    """The pieces as (group, pass, entry, a, b), the members of each group and their lengths, for
    `assert_each_pass_reads_each_entry_once`."""
    sets = {es.key: es for phase in data.sets_by_phase for es in phase.values()}
    by_group = {es.group: es for es in sets.values()}
    reads = [(sets[k].group, e, entry, a, b) for _, k, e, entry, a, b in pieces]
    return (reads, {g: es.ids.tolist() for g, es in by_group.items()},
            lambda g, entry: int(by_group[g].index.lengths(np.array([entry]))[0]))


def test_every_pass_serves_each_entry_once_band_by_band_with_rising_difficulty(ordered):
    cfg, data = ordered
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    pieces = served_pieces(data, plan_all(data, chunk=7)[1])
    first = assert_each_pass_reads_each_entry_once(*group_reads(data, pieces))
    group = {es.key: es.group for phase in data.sets_by_phase for es in phase.values()}
    began = {(ph, group[k], e, entry) for ph, k, e, entry, a, _ in pieces if a == 0}  # the phase that read its first token
    second_passes = 0
    for phase, direction in ((1, 1), (2, -1)):
        for bucket, es in data.sets_by_phase[phase].items():
            bands = np.repeat(np.arange(len(es.band_sizes)), es.band_sizes)
            band_of = dict(zip(es.ids.tolist(), bands.tolist()))
            passes = [[e for e in entries if (phase, g, p, e) in began]
                      for (g, p), entries in sorted(first.items()) if g == es.group]
            passes = [order for order in passes if order]
            for order in passes:
                read = [band_of[e] for e in order]
                assert read == sorted(read), f"{bucket} in phase {phase}: bands read in order"
            order = max(passes, key=len)
            score = entry_difficulty(root, bucket)
            means = [np.nanmean(score[[e for e in order if band_of[e] == k]]) for k in sorted(set(band_of[e] for e in order))
                     if not np.isnan(score[[e for e in order if band_of[e] == k]]).all()]
            assert len(means) >= 2 and (direction * np.diff(means) > 0).all(), f"{bucket}: {means}"
            for a, b in zip(passes, passes[1:]):  # a later pass repeats the band order with a fresh shuffle in each band
                both = set(a) & set(b)
                assert [e for e in a if e in both] != [e for e in b if e in both]
                second_passes += 1
    assert second_passes, "an ordered set started a second pass"


def test_ordered_mixture_is_exact_within_one_row_at_every_step(ordered):
    _, data = ordered
    _, chunks = plan_all(data, chunk=5)
    G, names = data.schedule.global_batch, list(data.schedule.tokens.buckets)
    for j in range(3):
        rows = np.array([[sum(c.sets[si].bucket == b for si in row.tolist()) for b in names]
                         for c in chunks if c.phase == j for row in c.row_set])
        weights = data.schedule.phase_weights(j)
        planned = np.cumsum(G * weights / weights.sum(axis=1, keepdims=True), axis=0)
        assert (rows.sum(axis=1) == G).all()
        assert np.abs(np.cumsum(rows, axis=0) - planned).max() <= 1 + 1e-6


def test_ordered_plans_do_not_depend_on_chunking_or_resume(ordered):
    _, data = ordered
    whole = served_pieces(data, plan_all(data, chunk=64)[1])
    assert served_pieces(data, plan_all(data, chunk=1)[1]) == whole
    first = data.sampler(False)
    part = [first.plan_steps(3) for _ in range(data.schedule.phase_starts[1] // 3 + 2)]
    resumed = data.sampler(False)
    resumed.load_state_dict(first.state_dict(2), world_size=4)
    rest = []
    while not resumed.done():
        rest.append(resumed.plan_steps(9))
    assert served_pieces(data, part) + served_pieces(data, rest) == whole


def test_prefetch_spans_cover_what_the_ordered_set_reads_next(ordered):
    _, data = ordered
    sampler = data.sampler(False)
    while sampler.schedule.phase_at(sampler.step) < 1:
        sampler.plan_next()
    spans = sampler.upcoming_entries()["web"]
    # One step: past warmup's handover the entries it took thin each band's block, so that a few
    # steps of this tiny set reach past the two blocks prefetched.
    chunk = sampler.plan_steps(1)
    es = data.sets_by_phase[1]["web"]
    read = served_pieces(data, [chunk])
    assert all(any(lo <= entry < hi for lo, hi in spans) for _, key, _, entry, _, _ in read if key == es.key)


def test_an_ordered_phase_continues_the_pass_a_uniform_phase_began(ordered):
    """Issue 38: main (easy_first) restarted web's pass, reading again at its start documents that
    warmup had read in the same pass. Now main leaves them out and serves the rest band by band."""
    _, data = ordered
    pieces = served_pieces(data, plan_all(data, chunk=5)[1])
    web = [(ph, e, entry, a, b) for ph, key, e, entry, a, b in pieces if ph < 2 and key.startswith("web:")]
    warmup = {(e, entry, t) for ph, e, entry, a, b in web if ph == 0 for t in range(a, b)}
    main_ = [(e, entry, t) for ph, e, entry, a, b in web if ph == 1 for t in range(a, b)]
    assert warmup and main_ and not warmup & set(main_), "no token of a pass read twice"
    es = data.sets_by_phase[1]["web"]
    switch = next(e for ph, e, _, _, _ in web if ph == 1)  # warmup read web 1.7 times: main begins in its pass 1
    assert {entry for _, e, entry, _, _ in web if e == switch} == set(es.ids.tolist()), \
        "warmup and main read every entry of the pass between them"
    began_in_warmup = {entry for ph, e, entry, a, _ in web if ph == 0 and e == switch and a == 0}
    main_order = [entry for ph, e, entry, a, _ in web if ph == 1 and e == switch and a == 0]
    assert began_in_warmup and main_order and not began_in_warmup & set(main_order)
    band_of = dict(zip(es.ids.tolist(), np.repeat(np.arange(len(es.band_sizes)), es.band_sizes).tolist()))
    assert [band_of[e] for e in main_order] == sorted(band_of[e] for e in main_order), "the rest in band order"


@pytest.fixture(scope="module")
def switching(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("switching")
    cfg = load_config(tiny_run(tmp, phases=SWITCHING_PHASES, buckets=ORDERED_BUCKETS))
    return CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), 4)


def test_a_uniform_phase_after_an_ordered_one_continues_its_pass(switching):
    data = switching
    pieces = served_pieces(data, plan_all(data, chunk=3)[1])
    first = assert_each_pass_reads_each_entry_once(*group_reads(data, pieces))
    math = data.sets_by_phase[2]["math"]
    assert math.group == data.sets_by_phase[1]["math"].group and math.band_sizes is None
    shared = {e for ph, key, e, _, _, _ in pieces if ph == 1 and key.startswith("math:")} & \
        {e for ph, key, e, _, _, _ in pieces if ph == 2 and key.startswith("math:")}
    assert shared and all(first[(math.group, e)] for e in shared), "anneal finished a pass main had begun"


def test_handovers_resume_at_any_step_around_the_switches(switching):
    data = switching
    whole = served_pieces(data, plan_all(data, chunk=4)[1])
    for at in sorted({s + d for s in data.schedule.phase_starts[1:3] for d in (-1, 0, 1, 2)}):
        first = data.sampler(False)
        part = [first.plan_steps(1) for _ in range(at)]
        resumed = data.sampler(False)
        resumed.load_state_dict(first.state_dict(1), world_size=2)
        assert resumed.state_dict(1) == first.state_dict(1)
        rest = []
        while not resumed.done():
            rest.append(resumed.plan_steps(5))
        assert served_pieces(data, part) + served_pieces(data, rest) == whole, f"resumed after step {at}"
    chunked, stepwise = data.sampler(False), data.sampler(False)
    while not chunked.done():  # the per-step states a loader checkpoints are those of planning step by step
        for state in chunked.states_after(chunked.plan_steps(4), 1):
            stepwise.plan_steps(1)
            assert state == stepwise.state_dict(1), f"step {stepwise.step}"


def test_a_version_3_state_resumes_unless_it_holds_an_ordered_sets_cursor(switching):
    data = switching
    warm, main_ = data.sets_by_phase[0]["web"], data.sets_by_phase[1]["web"]
    sampler = data.sampler(False)
    sampler.plan_steps(data.schedule.phase_starts[1] - 2)  # inside warmup: nothing handed over yet
    state = {**sampler.state_dict(1), "version": 3}
    state.pop("handovers")
    resumed = data.sampler(False)
    resumed.load_state_dict(state, 1)
    assert resumed.state_dict(1) == sampler.state_dict(1)
    old = {**state, "cursors": {**state["cursors"], main_.key: [0, 0, 0, 0]}}  # that trainer's own cursor for main
    with pytest.raises(SamplerStateError, match=f"version 3: that trainer gave the ordered sets {main_.key} cursors"):
        data.sampler(False).load_state_dict(old, 1)
    assert warm.key == warm.group


@pytest.mark.slow
def test_sigkill_and_elastic_resume_with_ordering_deliver_exactly_once_and_lineage_resolves(tmp_path):
    config = tiny_run(tmp_path, phases=SWITCHING_PHASES, buckets=ORDERED_BUCKETS,
                      training={"record_consumption": True, "checkpoint_interval": 3})
    reference, run_dir = assert_exactly_once_under_sigkill(tmp_path, config)
    from training.token_lineage import locate_token

    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    # Every pass of every group read each entry once, across the handovers of both switches.
    data = CurriculumData.open(cfg, root, reference.schedule.global_batch)
    sampler = data.sampler(False)
    steps = reference.schedule
    group = {(step, bucket): sampler.set_for(steps.phase_at(step - 1), bucket).group
             for step, _, bucket, _, _, _, _ in consumed_pieces(tmp_path / "reference")}
    reads = [(group[(step, bucket)], epoch, entry, a, b) for step, _, bucket, epoch, entry, a, b in consumed_pieces(run_dir)]
    _, members, length_of = group_reads(data, [])
    assert_each_pass_reads_each_entry_once(reads, members, length_of)
    by_row = defaultdict(list)
    for step, row, bucket, epoch, entry, a, b in consumed_pieces(run_dir):
        by_row[(step, row)].append((entry, a, b))
    rng = np.random.default_rng(5)
    for i in rng.choice(len(by_row), size=8, replace=False).tolist():
        (step, row), parts = sorted(by_row.items())[i]
        pos = 0
        for entry, a, b in parts:
            found = locate_token(cfg, root, step, row, pos, run_dir)
            assert (found["bucket_entry"], found["entry_token"]) == (entry, a)
            pos += b - a


def test_a_band_file_changed_since_validation_is_a_refusal_with_its_status(tmp_path, scored, capsys):
    """Issue 38: a band file whose hash no longer matches its manifest was refused as a traceback
    (exit 1) and status.json stayed `running`. Now: the trainer's refusal exit code (3), one line
    naming the file, and status.json `refused` with the reason."""
    import json

    from training.cli import EXIT_HALTED
    from training.run_store import run_base
    from training.status import write_status

    root, _ = scored
    path = write_config(tmp_path, ordered_config(tmp_path, main_order=EASY))
    cfg = load_config(path)
    for phase in ("main", "anneal"):
        write_manifest(root, build(cfg, root, phase)[1])
    bands = root.root / "manifests" / "main" / "web-bands.npy"
    raw = bytearray(bands.read_bytes())
    raw[-1] ^= 1
    bands.write_bytes(bytes(raw))
    run_dir = run_base(cfg)
    run_dir.mkdir(parents=True)
    write_status(run_dir, "running", "")  # the run this one continues
    assert main(["train", "--config", str(path)]) == EXIT_HALTED
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"refinery train: refused: {bands}: content hash ") and "rebuild phase_manifests" in err
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "refused" and status["reason"] == err.strip().removeprefix("refinery train: refused: ")
