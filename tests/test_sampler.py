"""The phase-aware sampler and batch builder: exactly once per pass, cursors that carry across phase
switches, per-phase seq_len, packing masks, selections, exhaustion, and sharding over ranks/workers."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from refinery.config import load_config
from refinery.curriculum import BucketSlice, ManifestError, PhaseManifest, ShardRef, write_manifest
from refinery.shard_format import ShardFormatError, ShardWriter
from refinery.storage import LocalDataRoot
from training.allocation import BucketExhausted
from training.data import CurriculumData
from training.sampler_state import SamplerStateError
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, tiny_run
from helpers.served import served_pieces


def open_data(config_path, global_batch=4):
    cfg = load_config(config_path)
    return cfg, CurriculumData.open(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), global_batch)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("tiny"))


def all_plans(data, allow=False):
    sampler = data.sampler(allow)
    plans = []
    while not sampler.done():
        plans.append(sampler.plan_next())
    return plans


def test_every_pass_serves_each_entry_exactly_once(tiny):
    _, data = open_data(tiny)
    pieces = served_pieces(data, all_plans(data))
    tokens = defaultdict(list)
    for _, key, epoch, entry, a, b in pieces:
        tokens[(key, epoch, entry)].append((a, b))
    sets = {es.key: es for phase in data.sets_by_phase for es in phase.values()}
    for (key, epoch, entry), ranges in tokens.items():
        ranges.sort()
        assert all(r0[1] == r1[0] for r0, r1 in zip(ranges, ranges[1:])), f"gap or overlap in {key} {entry}: {ranges}"
        assert ranges[0][0] == 0 and ranges[-1][1] <= sets[key].index.lengths(np.array([entry]))[0]
    for key, es in sets.items():
        epochs = {e for (k, e, _) in tokens if k == key}
        for epoch in epochs - {max(epochs)}:  # every pass but the running one is complete
            served = {entry for (k, e, entry) in tokens if k == key and e == epoch}
            assert served == set(es.ids.tolist()), f"{key} pass {epoch} skipped entries"
    assert any(len({e for (k, e, _) in tokens if k == key}) > 1 for key in sets), "no bucket started a second pass"


def test_phase_two_continues_bucket_cursor_instead_of_replaying_phase_one(tiny):
    """gpt-simple restarted buckets at a phase switch: 69 of its first 100 phase-2 documents had been
    served in phase 1. Here no phase-2 token of a pass was already served in phase 1."""
    _, data = open_data(tiny)
    pieces = served_pieces(data, all_plans(data))
    web_key = data.sets_by_phase[0]["web"].key
    assert data.sets_by_phase[1]["web"].key == web_key
    phase1 = {(e, entry, t) for ph, k, e, entry, a, b in pieces if ph == 0 and k == web_key for t in range(a, b)}
    phase2 = [(e, entry, t) for ph, k, e, entry, a, b in pieces if ph == 1 and k == web_key for t in range(a, b)]
    assert len(phase2) > 100
    assert sum(x in phase1 for x in phase2) == 0
    first_phase2 = next(p for p in pieces if p[0] == 1 and p[1] == web_key)
    last_phase1 = [p for p in pieces if p[0] == 0 and p[1] == web_key][-1]
    if last_phase1[4:] != (0, 0) and first_phase2[3] == last_phase1[3]:
        assert first_phase2[4] == last_phase1[5], "a split entry must continue where phase 1 stopped"


def test_quality_selection_has_its_own_cursor_and_reads_only_selected_entries(tiny):
    _, data = open_data(tiny)
    anneal_web = data.sets_by_phase[2]["web"]
    assert anneal_web.key != data.sets_by_phase[1]["web"].key
    assert 0 < len(anneal_web.ids) < len(data.sets_by_phase[1]["web"].ids)
    pieces = served_pieces(data, all_plans(data))
    web_in_anneal = {entry for ph, k, _, entry, _, _ in pieces if ph == 2 and k.startswith("web:")}
    assert web_in_anneal and web_in_anneal <= set(anneal_web.ids.tolist())
    first_anneal = next(p for p in pieces if p[0] == 2 and p[1] == anneal_web.key)
    assert first_anneal[2] == 0 and first_anneal[4] == 0, "a new entry set starts at its first pass, first token"


def test_seq_len_changes_at_the_exact_boundary_step(tiny):
    _, data = open_data(tiny)
    boundary = data.schedule.phase_starts[2]
    plans = all_plans(data)
    assert [p.seq_len for p in plans[boundary - 1 : boundary + 1]] == [32, 64]
    assert {p.seq_len for p in plans[:boundary]} == {32} and {p.seq_len for p in plans[boundary:]} == {64}
    batch = data.gather(plans[boundary], slice(0, 4))
    assert batch["tokens"].shape == (4, 64) and data.gather(plans[boundary - 1], slice(0, 4))["tokens"].shape == (4, 32)
    tokens_before = data.schedule.tokens_before(boundary)
    assert data.schedule.tokens.phases[2].start <= tokens_before < data.schedule.tokens.phases[2].start + 4 * 32


def test_global_order_is_the_same_for_any_world_size_and_worker_count(tiny):
    from training.loader import StepStream, make_loader

    _, data = open_data(tiny)

    def consumed(world, workers):
        loaders = [make_loader(StepStream(data, None, False, r, world, record=True), workers) for r in range(world)]
        steps = []
        for parts in zip(*loaders):
            assert len({p.step for p in parts}) == 1
            steps.append(np.concatenate([np.stack([p.consumed[k] for k in ("row", "entry", "a", "b")]) for p in parts], axis=1))
        return steps

    reference = consumed(1, 0)
    assert len(reference) == data.schedule.total_steps
    for world, workers in ((2, 0), (4, 2)):
        other = consumed(world, workers)
        assert len(other) == len(reference)
        for a, b in zip(reference, other):
            np.testing.assert_array_equal(a, b)


def test_rank_slices_partition_each_global_batch(tiny):
    _, data = open_data(tiny)
    plan = all_plans(data)[5]
    whole = data.gather(plan, slice(0, 4))
    halves = [data.gather(plan, data.rank_rows(r, 2)) for r in range(2)]
    np.testing.assert_array_equal(np.concatenate([h["tokens"] for h in halves]), whole["tokens"])
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        data.rank_rows(0, 3)


def test_state_dict_resumes_the_same_sequence(tiny):
    _, data = open_data(tiny)
    plans = all_plans(data)
    sampler = data.sampler(False)
    for _ in range(17):
        sampler.plan_next()
    resumed = data.sampler(False)
    notes = resumed.load_state_dict(sampler.state_dict(world_size=2), world_size=4)
    assert "world size changed 2 -> 4" in notes[0]
    for expect in plans[17:]:
        got = resumed.plan_next()
        assert got.step == expect.step
        np.testing.assert_array_equal(got.row_start, expect.row_start)
        assert [got.sets[i].key for i in got.row_set] == [expect.sets[i].key for i in expect.row_set]


def test_incompatible_state_is_refused_with_the_fix(tiny):
    _, data = open_data(tiny)
    state = data.sampler(False).state_dict(1)
    _, other = open_data(tiny, global_batch=8)
    with pytest.raises(SamplerStateError, match="global batch is 4 rows.*back to 4"):
        other.sampler(False).load_state_dict(state, 1)
    with pytest.raises(SamplerStateError, match="version"):
        data.sampler(False).load_state_dict({**state, "version": 99}, 1)


def test_a_later_phase_may_change_after_a_checkpoint_but_not_one_already_read(tmp_path):
    """An anneal variant may resume from main's boundary state with its own anneal manifest; a state
    taken inside a phase whose manifest then changed is refused."""
    from synthetic.curriculum import TINY_BUCKETS, TINY_PHASES, write_synthetic_curriculum

    config = tiny_run(tmp_path)
    _, data = open_data(config)
    starts = data.schedule.phase_starts
    sampler = data.sampler(False)
    states = {}
    for step in range(starts[2] + 2):
        if step >= starts[2] - 1:
            states[step] = sampler.state_dict(1)  # the state after `step` steps
        sampler.plan_next()
    variant = [*TINY_PHASES[:2], SyntheticPhase("anneal", 2048, {"web": 0.2, "math": 0.8}, seq_len=64)]
    write_synthetic_curriculum(tmp_path / "root", TINY_BUCKETS, variant, vocab=512, window=48, overlap=8)
    _, changed = open_data(config)
    assert changed.schedule.phase_starts[:3] == starts[:3]
    changed.sampler(False).load_state_dict(states[starts[2]], 1)  # at the anneal boundary: accepted
    changed.sampler(False).load_state_dict(states[starts[2] - 1], 1)  # inside main, main unchanged: accepted
    with pytest.raises(SamplerStateError, match="phases trained so far changed"):
        changed.sampler(False).load_state_dict(states[starts[2] + 1], 1)  # anneal already read from


def test_packing_masks_targets_across_entries_and_on_overlap_prefixes(tmp_path):
    root = LocalDataRoot(tmp_path)
    writer = ShardWriter(tmp_path / "shards/final/web/shard-00000", np.uint16)
    writer.add(np.array([11, 12, 13, 14, 15, 16]), "d0", overlap=0, window=0, n_windows=2)
    writer.add(np.array([15, 16, 17, 0]), "d0", overlap=2, window=1, n_windows=2)
    writer.add(np.array([21, 22, 0]), "d1")
    hashes = writer.close()
    ref = ShardRef("shards/final/web/shard-00000", 13, 3, hashes)
    write_manifest(root, PhaseManifest("only", 0, 13, 13, 1.0, {"web": 1.0}, 0.0,
                                       {"web": BucketSlice("web", [ref], 13, 3)}, {"ok": True}))
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(
        f"data_root: {tmp_path}\nbuckets: [web]\nsources: [{{name: s, path: x, format: jsonl, bucket: web}}]\n"
        "curriculum: {total_tokens: 13, phases: [{name: only, tokens: 13, weights: {web: 1.0}, seq_len: 13}]}\n"
    )
    _, data = open_data(cfg_path, global_batch=1)
    plan = data.sampler(False).plan_next()
    out = data.gather(plan, slice(0, 1))
    web = data.sets_by_phase[0]["web"]
    order = web.ids_at(web.order(0).positions(np.arange(web.size)))
    entries = {0: [11, 12, 13, 14, 15, 16], 1: [15, 16, 17, 0], 2: [21, 22, 0]}
    overlaps = {0: 0, 1: 2, 2: 0}
    expect_tokens, expect_mask, expect_doc = [], [], []
    for ordinal, e in enumerate(order.tolist()):
        for i, t in enumerate(entries[e]):
            expect_tokens.append(t)
            expect_doc.append(ordinal)
            expect_mask.append(i >= overlaps[e])  # is this token a counted *target*?
    target_ok = [expect_doc[i] == expect_doc[i + 1] and expect_mask[i + 1] for i in range(12)] + [False]
    assert out["tokens"][0].tolist() == expect_tokens
    assert out["doc_ids"][0].tolist() == expect_doc
    assert out["target_mask"][0].tolist() == target_ok


def test_exhaustion_halts_or_drops_and_renormalizes(tmp_path):
    buckets = {"web": SyntheticBucket(200, 60), "math": SyntheticBucket(6, 30, max_epochs=1)}
    phases = [SyntheticPhase("only", 4096, {"web": 0.5, "math": 0.5}, seq_len=32)]
    _, data = open_data(tiny_run(tmp_path, phases=phases, buckets=buckets))
    with pytest.raises(BucketExhausted, match="bucket 'math' ran dry at step .*allow_bucket_exhaustion"):
        all_plans(data)
    plans = all_plans(data, allow=True)
    assert len(plans) == data.schedule.total_steps
    dropped_at = [p.step for p in plans if p.dropped]
    assert len(dropped_at) == 1 and plans[dropped_at[0]].dropped == ["math"]
    after = plans[dropped_at[0]:]
    assert all(p.sets[i].bucket == "web" for p in after for i in p.row_set)
    assert any(p.sets[i].bucket == "math" for p in plans[: dropped_at[0]] for i in p.row_set)


def test_a_shard_changed_after_validation_is_refused_by_name_when_first_read(tmp_path):
    """Nothing is hashed at open; the first read of a shard checks it against the manifest."""
    config = tiny_run(tmp_path)
    with open(tmp_path / "root/shards/final/math/shard-00000.bin", "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff")
    _, data = open_data(config)
    assert len(data.pool) == 0, "open reads no shard"
    with pytest.raises(ShardFormatError, match="shard-00000.bin: content hash .* rebuild the manifest"):
        for plan in all_plans(data):
            data.gather(plan, slice(0, 4))


def test_a_missing_manifest_names_the_asset_to_materialize(tmp_path):
    config = tiny_run(tmp_path)
    (tmp_path / "root/manifests/main.json").unlink()
    with pytest.raises(ManifestError, match="no manifest for phase 'main'; materialize phase_manifests"):
        open_data(config)
