"""phase_manifests: per-phase shard lists pinned by hash, quality-cutoff selections, the blocking
validation check, and bad input, over final shards in shuffled_shards' layout
(helpers/final_shards.py)."""

import math
from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from refinery.config import parse_config
from refinery.curriculum import (CurriculumError, build_phase_manifest, build_schedule, read_bucket_inventory,
                                 schedule_from_manifests, validate_data_root)
from refinery.layout import final_index_key
from refinery.curriculum import (CurriculumMismatch, ManifestError, PhaseManifest, read_manifest, read_selection,
                                 refuse_mismatch, write_manifest)
from refinery.shard_format import ShardReader, shard_hashes
from refinery.storage import LocalDataRoot

from helpers.final_shards import (DOCS_PER_BUCKET, bucket_entry_docs, config_dict, sample_docs, write_curriculum_config,
                                  write_final_index, write_final_shards)


def make_cfg(tmp_path, **curriculum):
    return parse_config(config_dict(tmp_path, **curriculum))


@pytest.fixture
def corpus(tmp_path):
    root = LocalDataRoot(tmp_path / "root")
    docs = {b: sample_docs(b, n) for b, n in DOCS_PER_BUCKET.items()}
    for b, d in docs.items():
        write_final_shards(root, b, d)
    return root, docs


def build(cfg, root, phase):
    report, inventory, selections = validate_data_root(cfg, root)
    return report, build_phase_manifest(cfg, root, phase, report, inventory, selections)


def test_main_manifest_lists_every_shard_with_hashes(tmp_path, corpus):
    root, docs = corpus
    cfg = make_cfg(tmp_path)
    report, m = build(cfg, root, "main")
    assert report.ok, report.errors
    assert (m.phase, m.index, m.token_budget, m.seq_len) == ("main", 0, 3072, 128)
    assert m.weights == {"web": 0.75, "math": 0.25}
    web = m.buckets["web"]
    assert web.selection is None and web.entries == 40 + 8 and web.tokens == sum(n for _, n, _ in docs["web"])
    assert [s.prefix for s in web.shards] == [f"shards/final/web/shard-{i:05d}" for i in range(3)]
    for ref in web.shards:
        assert ref.sha256 == shard_hashes(root.root / ref.prefix)
        ShardReader(root.root / ref.prefix).verify(ref.sha256)
    assert m.buckets["math"].max_epochs == 3.0
    assert m.validation["ok"] and m.validation["contract"]["phases"][0]["tokens"] == 3072


def test_anneal_manifest_keeps_only_documents_at_or_above_cutoff(tmp_path, corpus):
    root, docs = corpus
    cfg = make_cfg(tmp_path)
    _, m = build(cfg, root, "anneal")
    write_manifest(root, m)
    m = read_manifest(root, "anneal")
    for bucket, bucket_docs in docs.items():
        sl = m.buckets[bucket]
        selection = read_selection(root, sl)
        doc_ids = [d for ref in sl.shards for d in pl.read_parquet(root.root / (ref.prefix + ".entries.parquet"))["doc_id"]]
        lengths = np.concatenate([np.diff(ShardReader(root.root / ref.prefix).offsets) for ref in sl.shards])
        score = {d: s for d, _, s in bucket_docs}
        kept = {doc_ids[i] for i in selection}
        # the best documents, whole, until they hold 25% of the bucket's tokens
        tokens = {d: int(lengths[[i for i, x in enumerate(doc_ids) if x == d]].sum()) for d in score}
        ranked = sorted((s, tokens[d]) for d, s in score.items() if s is not None)[::-1]
        held = np.cumsum([t for _, t in ranked])
        target = math.ceil(0.25 * sum(tokens.values()))
        assert sl.quality_cutoff == ranked[int(np.searchsorted(held, target))][0]
        assert target <= sum(tokens[d] for d in kept) < target + max(tokens.values())
        assert all(score[d] is not None and score[d] >= sl.quality_cutoff for d in kept)
        assert {d for d, s in score.items() if s is not None and s >= sl.quality_cutoff} == kept
        # every window of a kept document is in, and counts match the manifest
        assert sorted(selection.tolist()) == [i for i, d in enumerate(doc_ids) if d in kept]
        assert sl.entries == len(selection) and sl.tokens == int(lengths[selection].sum())


def test_trainer_schedule_from_manifests_matches_the_config(tmp_path, corpus):
    root, _ = corpus
    cfg = make_cfg(tmp_path, temperature=2.0)
    manifests = [build(cfg, root, p)[1] for p in ("anneal", "main")]
    from_cfg, from_manifests = build_schedule(cfg), schedule_from_manifests(manifests, ["web", "math"])
    assert from_manifests.boundaries == from_cfg.boundaries == [3072, 4096]
    for t in (0, 100, 3071, 3072, 3100, 3276, 3277, 4095):
        assert from_manifests.weights_at(t) == pytest.approx(from_cfg.weights_at(t))
        assert from_manifests.seq_len_at(t) == from_cfg.seq_len_at(t)
        assert from_manifests.lr_multiplier(t, 256) == from_cfg.lr_multiplier(t, 256)


def test_manifest_pins_rope_scaling_and_the_trainer_refuses_a_config_that_differs(tmp_path, corpus):
    """The manifest carries the phase's RoPE scaling (every YaRN field); a config that declares
    another is refused with the field named and both fingerprints."""
    root, _ = corpus
    data = config_dict(tmp_path)
    data["curriculum"]["phases"][1]["rope_scaling"] = {"factor": 2.0, "original_seq_len": 32}
    cfg = parse_config(data)
    for phase in ("main", "anneal"):
        write_manifest(root, build(cfg, root, phase)[1])
    pinned = read_manifest(root, "anneal").rope_scaling
    assert pinned == {"type": "yarn", "factor": 2.0, "original_seq_len": 32, "beta_fast": 32.0, "beta_slow": 1.0}
    assert read_manifest(root, "main").rope_scaling is None
    refuse_mismatch(cfg, root)  # the config they were built from trains
    data["curriculum"]["phases"][1]["rope_scaling"] = "auto"
    with pytest.raises(CurriculumMismatch) as err:
        refuse_mismatch(parse_config(data), root)
    assert "curriculum.phases[1] (anneal).rope_scaling: the config says auto" in str(err.value)
    assert f"config fingerprint {cfg.fingerprint()}" in str(err.value)


def test_a_manifest_from_before_rope_scaling_keeps_its_identity(tmp_path, corpus):
    """Checkpoints fingerprint the manifests they read (training/schedule.py): a manifest written
    before `rope_scaling` existed and its rebuild with the field at null are the same manifest."""
    root, _ = corpus
    manifest = build(make_cfg(tmp_path), root, "main")[1]
    older = {k: v for k, v in manifest.to_json().items() if k != "rope_scaling"}
    assert manifest.to_json()["rope_scaling"] is None and manifest.identity() == older
    assert PhaseManifest.from_json(older).identity() == older
    assert replace(manifest, rope_scaling="auto").identity() != older


def test_manifests_are_byte_identical_on_rebuild(tmp_path, corpus):
    root, _ = corpus
    cfg = make_cfg(tmp_path)
    digests = []
    for _ in range(2):
        _, m = build(cfg, root, "anneal")
        digests.append((write_manifest(root, m), root.sha256(m.buckets["web"].selection)))
    assert digests[0] == digests[1]


def test_blend_window_keeps_previous_phase_buckets(tmp_path, corpus):
    root, _ = corpus
    cur_phases = make_cfg(tmp_path).curriculum.model_dump()["phases"]
    cur_phases[1]["weights"] = {"web": 1.0}
    _, m = build(make_cfg(tmp_path, phases=cur_phases), root, "anneal")
    assert set(m.buckets) == {"web", "math"}  # math is still drawn while the mixture blends
    cur_phases[1]["interpolation"] = 0.0
    _, m = build(make_cfg(tmp_path, phases=cur_phases), root, "anneal")
    assert set(m.buckets) == {"web"}


def test_contamination_exclusions_survive_a_rebuild(tmp_path, corpus):
    root, docs = corpus
    cfg = make_cfg(tmp_path)
    victim = docs["web"][0][0]
    root.write_json("contamination/main/excluded_doc_ids.json", [victim])
    _, m = build(cfg, root, "main")
    sl = m.buckets["web"]
    assert sl.entries == 40 + 8 - 1
    assert sl.tokens == sum(n for _, n, _ in docs["web"]) - docs["web"][0][1]


def test_failed_validation_is_recorded_in_the_manifest(tmp_path, corpus):
    root, _ = corpus
    cfg = make_cfg(tmp_path, buckets={"math": {"max_epochs": 0.1}})  # a tenth of math is less than it needs
    report, m = build(cfg, root, "main")
    assert not report.ok
    assert not m.validation["ok"]
    assert any(e.startswith("curriculum.buckets.math.max_epochs: bucket 'math' needs") for e in m.validation["errors"])


# ---- totals past 32 bits ------------------------------------------------------------------------

# Each entry's tokens fit the entry table's Int32 column; twelve of them overflow 32 bits even unsigned.
BIG_ENTRY = 2**31 - 1
BIG_DOCS = 12


def test_bucket_totals_past_two_to_the_32_are_exact_in_inventory_validation_and_manifests(tmp_path):
    root = LocalDataRoot(tmp_path / "root")
    for bucket in ("web", "math"):
        # distinct scores, so the anneal phase's top quarter is exactly the last three documents
        write_final_index(root, bucket, [(f"{bucket}-0/{i:07d}", BIG_ENTRY, (i + 1) / BIG_DOCS) for i in range(BIG_DOCS)])
    total = BIG_DOCS * BIG_ENTRY
    assert total > 2**32
    inventory = read_bucket_inventory(root, "web")
    assert (inventory.tokens, inventory.entries) == (total, BIG_DOCS + 2)
    assert sum(ref.tokens for ref in inventory.shards) == total

    cfg = make_cfg(tmp_path)
    report, main = build(cfg, root, "main")
    assert report.ok, report.errors
    assert report.contract["buckets"]["web"]["inventory_tokens"] == total
    _, anneal = build(cfg, root, "anneal")
    for m in (main, anneal):
        write_manifest(root, m)
    main, anneal = read_manifest(root, "main"), read_manifest(root, "anneal")
    assert {b: (s.tokens, s.entries) for b, s in main.buckets.items()} == {b: (total, BIG_DOCS + 2) for b in ("web", "math")}
    # documents 9, 10 and 11 (9 cut into two windows), each BIG_ENTRY tokens: past 2^32 as well
    for sl in anneal.buckets.values():
        assert (sl.tokens, sl.entries) == (3 * BIG_ENTRY, 4)
        assert read_selection(root, sl).tolist() == [10, 11, 12, 13]
    assert anneal.validation["contract"]["buckets"]["web"]["inventory_tokens"] == total


# ---- bad input ------------------------------------------------------------------------------------


def test_no_final_shards_means_unknown_inventory(tmp_path):
    report, inventory, _ = validate_data_root(make_cfg(tmp_path), LocalDataRoot(tmp_path / "root"))
    assert inventory is None and report.ok and [w.field for w in report.warnings] == ["inventory"]


def test_malformed_shard_index_is_a_clear_error(tmp_path, corpus):
    root, _ = corpus
    root.write_json(final_index_key("math"), {"shards": [{"prefix": "x"}]})
    with pytest.raises(CurriculumError, match=r"index.json: malformed shard index \('tokens'\); re-materialize shuffled_shards\[math\]"):
        validate_data_root(make_cfg(tmp_path), root)


def test_entry_table_disagreeing_with_index_is_a_clear_error(tmp_path, corpus):
    root, _ = corpus
    table = root.read_parquet("shards/final/web/entries.parquet")
    root.write_parquet("shards/final/web/entries.parquet", table.head(10))
    with pytest.raises(CurriculumError, match=r"entries.parquet: 10 entries / \d+ tokens, but .* lists 48 / \d+; re-materialize shuffled_shards\[web\]"):
        validate_data_root(make_cfg(tmp_path), root)


def test_tampered_selection_is_rejected_by_the_reader(tmp_path, corpus):
    root, _ = corpus
    _, m = build(make_cfg(tmp_path), root, "anneal")
    sl = m.buckets["web"]
    root.write_bytes(sl.selection, b"not the selection")
    with pytest.raises(ManifestError, match="content hash does not match the manifest"):
        read_selection(root, sl)


def test_unknown_phase(tmp_path, corpus):
    root, _ = corpus
    cfg = make_cfg(tmp_path)
    report, inventory, selections = validate_data_root(cfg, root)
    with pytest.raises(CurriculumError, match=r"unknown phase 'cooldown'; the curriculum has \['main', 'anneal'\]"):
        build_phase_manifest(cfg, root, "cooldown", report, inventory, selections)


# ---- the Dagster asset ----------------------------------------------------------------------------


def materialize_manifest(tmp_path, curriculum, phase):
    from assets import curriculum as curriculum_assets
    from helpers.materialize import materialize, module_assets

    path = write_curriculum_config(tmp_path, **curriculum)
    asset = next(iter(module_assets(curriculum_assets, path).values()))
    return materialize([asset], path, partition_key=phase, raise_on_error=False)


def test_asset_writes_manifest_with_contract_and_plot(tmp_path, corpus):
    root, _ = corpus
    result = materialize_manifest(tmp_path, {}, "anneal")
    assert result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "curriculum_valid" and check.passed
    # the evaluation records its phase, and says it: GraphQL and the UI show both
    assert check.partition == "anneal" and check.metadata["phase"].value == "anneal"
    assert check.description == "phase anneal: curriculum valid: 0 error(s), 0 warning(s)"
    md = result.get_asset_materialization_events()[0].materialization.metadata
    for key in ("valid", "token_budget", "seq_len", "lr_scale", "weights", "bucket_tokens", "quality_cutoffs",
                "contract", "schedule_plot", "manifest_path", "config", "code_version", "content_hashes"):
        assert key in md, key
    assert md["token_budget"].value == 1024 and md["seq_len"].value == 256
    assert "| **anneal** | **1,024** |" in md["contract"].value
    assert md["schedule_plot"].value.startswith("![curriculum schedule](data:image/png;base64,iVBOR")
    assert root.read_bytes("curriculum/schedule.png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(md["content_hashes"].value) == {"manifests/anneal.json", "curriculum/schedule.png",
                                               "manifests/anneal/web-selection.npy", "manifests/anneal/math-selection.npy"}
    assert read_manifest(root, "anneal").validation["ok"]


def test_asset_check_blocks_an_invalid_curriculum(tmp_path, corpus):
    root, _ = corpus
    result = materialize_manifest(tmp_path, {"buckets": {"math": {"max_epochs": 0.1}}}, "main")
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and check.partition == "main"
    assert check.description.startswith("phase main: curriculum invalid: 2 error(s)")
    assert any("curriculum.buckets.math.max_epochs" in f for f in check.metadata["findings"].value)
    assert not read_manifest(root, "main").validation["ok"]


def test_asset_without_final_shards_fails_clearly_and_writes_nothing(tmp_path):
    result = materialize_manifest(tmp_path, {}, "main")
    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "no final shards in any bucket; materialize shuffled_shards first" in failure
    assert not (tmp_path / "root" / "manifests").exists()


# ---- bounded memory: streamed cutoffs and selections ---------------------------------------------


def reference_selection(entries, top_fraction):
    """The cutoff ranked over every document at once (what the streamed passes must equal): the best
    documents, whole, until they hold `top_fraction` of the tokens. (cutoff, documents, kept entry
    ids, kept tokens)."""
    doc_score = {doc: math.nan if s is None else s for doc, _, _, _, s in entries}
    doc_tokens: dict[str, int] = {}
    for doc, tokens, *_ in entries:
        doc_tokens[doc] = doc_tokens.get(doc, 0) + tokens
    scored = sorted(((s, doc_tokens[d]) for d, s in doc_score.items() if not math.isnan(s)), reverse=True)
    held = np.cumsum([t for _, t in scored])
    target = min(max(1, math.ceil(top_fraction * sum(doc_tokens.values()))), int(held[-1]))
    cutoff = scored[int(np.searchsorted(held, target))][0]
    kept = [i for i, (_, _, _, _, s) in enumerate(entries) if s is not None and s >= cutoff]
    return (cutoff, sum(1 for s in doc_score.values() if s >= cutoff), kept,
            sum(entries[i][1] for i in kept))


def write_scored_bucket(root, scores):
    from helpers.final_shards import document_entries, write_entry_table_and_index

    rng = np.random.default_rng(len(scores))
    entries = document_entries([(f"web-0/{i:07d}", int(rng.integers(40, 200)), s) for i, s in enumerate(scores)])
    write_entry_table_and_index(root, "web", [{"prefix": "shards/final/web/shard-00000", "tokens": sum(e[1] for e in entries),
                                               "entries": len(entries), "sha256": {}}], entries)
    return entries


@pytest.mark.parametrize("bracket", [1 << 20, 40, 0])
def test_streamed_cutoff_is_exact_at_every_histogram_level(tmp_path, monkeypatch, bracket):
    """Scores with ties, negative ones, unscored documents and two-window documents, read 37 entries a
    batch: one histogram and a bracket (1 << 20), histograms down to a bin of at most 40 entries, and
    no bracket at all (every level down to one exact score). Each gives the whole-table ranking."""
    from refinery.curriculum import inventory as inv_mod
    from refinery.curriculum import quality_cut as cut_mod

    monkeypatch.setattr(inv_mod, "ENTRY_BATCH_ROWS", 37)
    monkeypatch.setattr(cut_mod, "BRACKET_ENTRIES", bracket)
    rng = np.random.default_rng(3)
    scores = [None if i % 11 == 5 else float(s) for i, s in enumerate(rng.choice([-0.25, 0.0, 0.125, 0.5, 0.5000001, 0.75, 1.0], 700)
                                                                     + rng.integers(0, 3, 700) * 1e-9)]
    root = LocalDataRoot(tmp_path / "root")
    entries = write_scored_bucket(root, scores)
    inv = inv_mod.read_bucket_inventory(root, "web")
    for top_fraction in (0.001, 0.1, 0.25, 0.5, 0.93, 1.0):
        cutoff, documents, kept, tokens = reference_selection(entries, top_fraction)
        sel = cut_mod.select_top_quality(root, inv, top_fraction)
        assert (sel.cutoff, sel.documents, sel.entries, sel.tokens) == (cutoff, documents, len(kept), tokens), top_fraction
        assert np.concatenate(list(cut_mod.kept_entry_ids(root, inv, sel.cutoff))).tolist() == kept


def test_every_score_equal_keeps_every_scored_document(tmp_path, monkeypatch):
    from refinery.curriculum import inventory as inv_mod
    from refinery.curriculum import quality_cut as cut_mod

    monkeypatch.setattr(cut_mod, "BRACKET_ENTRIES", 0)
    root = LocalDataRoot(tmp_path / "root")
    entries = write_scored_bucket(root, [0.5] * 9 + [None])
    sel = cut_mod.select_top_quality(root, inv_mod.read_bucket_inventory(root, "web"), 0.1)
    assert (sel.cutoff, sel.documents, sel.entries, sel.tokens) == (0.5, 9, 10, sum(e[1] for e in entries[:10]))


def test_no_scored_document_keeps_nothing(tmp_path):
    from refinery.curriculum import inventory as inv_mod
    from refinery.curriculum import quality_cut as cut_mod

    root = LocalDataRoot(tmp_path / "root")
    write_scored_bucket(root, [None] * 4)
    sel = cut_mod.select_top_quality(root, inv_mod.read_bucket_inventory(root, "web"), 0.5)
    assert (sel.cutoff, sel.documents, sel.entries, sel.tokens) == (math.inf, 0, 0, 0)


@pytest.mark.parametrize("count", [0, 1, 1000, 123_457])
def test_streamed_selection_is_the_bytes_np_save_writes(tmp_path, count):
    from refinery.curriculum.manifests import selection_npy, write_selection

    root = LocalDataRoot(tmp_path / "root")
    ids = np.arange(count, dtype=np.int64) * 3 + 2**40
    with write_selection(root, "manifests/p/web-selection.npy", count) as out:
        for chunk in np.array_split(ids, 7):
            out.append(chunk)
    data = root.read_bytes("manifests/p/web-selection.npy")
    assert data == selection_npy(ids)
    assert out.sha256 == root.sha256("manifests/p/web-selection.npy")
    assert np.load(root.local_path("manifests/p/web-selection.npy"), mmap_mode="r").tolist() == ids.tolist()


def test_a_selection_of_the_wrong_length_is_not_published(tmp_path):
    from refinery.curriculum.manifests import write_selection

    root = LocalDataRoot(tmp_path / "root")
    with pytest.raises(ManifestError, match=r"web-selection.npy: 2 entry ids, 3 expected"):
        with write_selection(root, "manifests/p/web-selection.npy", 3) as out:
            out.append(np.array([4, 9]))
    assert not root.exists("manifests/p/web-selection.npy") and root.list("manifests") == []


def test_exclusions_stream_over_a_quality_selection(tmp_path, corpus):
    """A dropped document leaves the anneal phase's quality selection: every one of its windows,
    and exactly its tokens; the other kept entries stay, in order."""
    root, docs = corpus
    cfg = make_cfg(tmp_path)
    _, before = build(cfg, root, "anneal")
    sl = before.buckets["web"]
    kept = read_selection(root, sl).tolist()
    doc_ids = bucket_entry_docs(root, sl)
    victim = doc_ids[kept[0]]
    root.write_json("contamination/anneal/excluded_doc_ids.json", [victim, "web-0/not-a-document"])
    _, after = build(cfg, root, "anneal")
    lengths = np.concatenate([np.diff(ShardReader(root.root / ref.prefix).offsets) for ref in sl.shards])
    expected = [i for i in kept if doc_ids[i] != victim]
    assert read_selection(root, after.buckets["web"]).tolist() == expected
    assert (after.buckets["web"].entries, after.buckets["web"].tokens) == (len(expected), int(lengths[expected].sum()))
    assert after.buckets["math"] == before.buckets["math"]  # nothing of math excluded: its slice is unchanged


def manifest_peak_bytes(tmp_path, documents):
    """tracemalloc's peak over validating and building the anneal manifest of two buckets of
    `documents` documents each, in four shards each."""
    import tracemalloc

    root = LocalDataRoot(tmp_path / "root")
    for bucket in ("web", "math"):
        rng = np.random.default_rng(documents)
        docs = [(f"{bucket}-0/{i:09d}", int(rng.integers(40, 600)), float(s)) for i, s in enumerate(rng.random(documents).round(3))]
        write_final_index(root, bucket, docs, per_shard=-(-documents * 6 // 5 // 4))
    cfg = make_cfg(tmp_path)
    tracemalloc.start()
    try:
        _, manifest = build(cfg, root, "anneal")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert manifest.buckets["web"].entries > documents // 5
    return peak


def test_manifest_memory_does_not_grow_with_the_bucket(tmp_path, monkeypatch):
    """Batches of 500 entries and brackets of at most 100 (so both sizes take two histogram passes
    and a bracket): the largest batch read is 500 entries, and the build's traced peak at 4x the
    entries stays within 1.25x (a whole-bucket per-entry table, as doc ids or score arrays, would
    grow it about 4x)."""
    from refinery.curriculum import inventory as inv_mod
    from refinery.curriculum import quality_cut as cut_mod

    monkeypatch.setattr(inv_mod, "ENTRY_BATCH_ROWS", 500)
    monkeypatch.setattr(cut_mod, "BRACKET_ENTRIES", 100)
    largest = []
    reader = inv_mod.entry_batches

    def spy(root, inv, **kwargs):
        for batch in reader(root, inv, **kwargs):
            largest.append(len(batch.tokens))
            yield batch

    monkeypatch.setattr(cut_mod, "entry_batches", spy)
    manifest_peak_bytes(tmp_path / "warm", 1_000)  # the first build's lazy imports are not the build's memory
    small = manifest_peak_bytes(tmp_path / "small", 10_000)
    large = manifest_peak_bytes(tmp_path / "large", 40_000)
    assert max(largest) == 500
    assert large < 1.25 * small, (small, large)
