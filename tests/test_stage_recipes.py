"""One recipe per stage (refinery/stage_recipes.py): every per-document stage of the registry is
built by the recipe its record names, by the funnel's assets and by the ablations' judges alike. A
stage registered in a test (its module and its registry line, no other file edited) is an asset of
the funnel that runs on its upstream's documents, and judges the documents a `without:` variant
lets back in; every registered stage can be built and judged."""

from __future__ import annotations

import polars as pl
import pytest

from assets import funnel, quality
from helpers import registered_stage as rs
from helpers.materialize import materialize, module_assets
from helpers.verdict_corpus import write_verdict_corpus
from refinery.ablations.selection import Judges, Selection, variant_batches
from refinery.documents import input_shards
from refinery.global_steps.dedup_compute import STAGE as DEDUP_STAGE
from refinery.layout import rejects_key
from assets.provenance import code_version, stage_code_version
from refinery.stage_recipes import build_stage, recipe, stage_code
from refinery.stages import extract, heuristic, registry
from refinery.stages.attributes import read_stage_documents
from refinery.stages.base import Stage


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_verdict_corpus(tmp_path_factory.mktemp("recipes"))


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(registry, "STAGES", rs.with_first_word_filter(registry.STAGES))
    registry.check_registry(registry.STAGES)


def _variant_ids(c, sel: Selection) -> dict[str, str]:
    """doc_id -> text of the variant's documents, over every file."""
    out = {}
    for shard in input_shards(c.cfg):
        for batch in variant_batches(c.root, c.cfg, sel, shard.key):
            out.update(zip(batch["doc_id"].to_list(), batch["text"].to_list()))
    return out


def test_a_registered_stage_is_built_in_the_funnel_and_judges_readmitted_documents(corpus, registered):
    c = corpus
    assets = module_assets(funnel, c.config_path)
    assert rs.NAME in assets
    assert {k.to_user_string() for k in assets[rs.NAME].dependency_keys} == {"quality_scored"}
    pii = module_assets(quality, c.config_path)["pii_redacted"]
    assert {k.to_user_string() for k in pii.dependency_keys} == {rs.NAME}

    for batch in assets[rs.NAME].partitions_def.get_partition_keys():
        assert materialize([assets[rs.NAME]], c.config_path, partition_key=batch).success
    dropped_any = 0
    for shard in input_shards(c.cfg):
        scored = read_stage_documents(c.root, "quality_scored", shard.key, columns=["doc_id"])["doc_id"].to_list()
        kept = read_stage_documents(c.root, rs.NAME, shard.key, columns=["doc_id"])["doc_id"].to_list()
        dropped = c.root.read_parquet(rejects_key(rs.NAME, shard.key))
        assert kept == [d for d in scored if not rs.listed(c.extracted[d])]
        assert sorted(dropped["doc_id"].to_list()) == sorted(d for d in scored if rs.listed(c.extracted[d]))
        assert set(dropped["rule"]) <= {"first_word/listed"}
        dropped_any += dropped.height
    assert dropped_any > 0

    # Left out heuristic: its removals are judged by the stages after it, the new one among them.
    sel = Selection("no_heuristic", "funnel", registry.left_out("heuristic"), None)
    with_stage = _variant_ids(c, sel)
    readmitted = {d for d, fate in c.fate.items() if fate and fate[0] == "heuristic_filtered"}
    assert any(d in readmitted for d in with_stage)
    assert not any(rs.listed(with_stage[d]) for d in with_stage if d in readmitted)
    registry_now = registry.STAGES
    try:
        registry.STAGES = tuple(s for s in registry_now if s.name != rs.NAME)
        without_stage = _variant_ids(c, sel)
    finally:
        registry.STAGES = registry_now
    judged_out = set(without_stage) - set(with_stage)
    assert judged_out and judged_out <= readmitted and set(with_stage) <= set(without_stage)
    assert judged_out == {d for d in without_stage if d in readmitted and rs.listed(without_stage[d])}


def test_a_stage_asset_is_versioned_by_the_code_its_recipe_runs(corpus, registered, monkeypatch):
    """Each recipe-built stage's asset carries the code its recipe says it runs (`runs`) with its
    registry record; a registered stage whose recipe says nothing runs its own module, and one that
    names more code is versioned by it: no asset module names a stage's code."""
    c = corpus
    assets = {**module_assets(funnel, c.config_path), **module_assets(quality, c.config_path)}

    def version(name: str) -> str:
        return assets[name].code_versions_by_key[assets[name].key]

    assert stage_code("extracted_text", c.cfg) == (extract,)
    assert stage_code("heuristic_filtered", c.cfg) == (heuristic,)  # no custom filters in this config
    assert stage_code(rs.NAME, c.cfg) == (rs.build_first_word_filter,)
    built = [s.name for s in registry.STAGES if s.build is not None]
    assert len(built) == 6 and {version(name) for name in built} == {
        stage_code_version(name, code_version(*stage_code(name, c.cfg))) for name in built}
    assert len({version(name) for name in built}) == len(built)
    assert version(rs.NAME) == stage_code_version(rs.NAME, code_version(rs))

    monkeypatch.setattr(rs.build_first_word_filter, "runs", lambda cfg: (rs, heuristic), raising=False)
    moved = module_assets(funnel, c.config_path)[rs.NAME]
    assert moved.code_versions_by_key[moved.key] == stage_code_version(rs.NAME, code_version(rs, heuristic))
    assert moved.code_versions_by_key[moved.key] != version(rs.NAME)


def test_every_registered_stage_can_be_built_and_judged(corpus):
    """Each per-document stage after extracted_text builds by its recipe and runs on documents; a
    stage after it without one is dedup (judged by exact dedup's hash); the judges of a variant run
    every one of them on documents let back in after language ID."""
    c = corpus
    shard = input_shards(c.cfg)[0]
    docs = read_stage_documents(c.root, "quality_scored", shard.key).head(8)
    for stage in registry.STAGES[registry.stage_names().index(registry.TEXT_STAGE) + 1:]:
        if stage.build is None:
            assert stage.name == DEDUP_STAGE
            continue
        built = build_stage(stage.name, c.cfg, shard.source, c.root)
        assert isinstance(built, Stage) and built.name == stage.name
        out = built.run(docs)
        assert out.documents.height + out.rejects.height == docs.height, stage.name
    # Documents that never reached dedup (heuristic removed them), judged as if language ID had
    # removed them, by a variant that leaves both out: every stage after language ID judges them.
    left_out = (*registry.left_out("language"), *registry.left_out("heuristic"))
    judges = Judges(c.root, c.cfg, Selection("no_language_heuristic", "funnel", left_out, None))
    removed = [d for d, fate in c.fate.items() if fate and fate[0] == "heuristic_filtered" and d.startswith(shard.key)]
    unseen = read_stage_documents(c.root, "language_filtered", shard.key).filter(pl.col("doc_id").is_in(removed))
    judged = judges.judge("language_filtered", unseen)
    assert 0 < judged.height <= unseen.height
    assert set(judged["doc_id"]) <= set(removed)


def test_a_stage_without_a_recipe_it_can_be_built_by_is_refused():
    with pytest.raises(registry.UnknownStage, match="'deduped' has no build recipe"):
        recipe("deduped")
    with pytest.raises(ValueError, match="no 'module:function' recipe"):
        registry.check_registry(rs.with_first_word_filter_built_by(registry.STAGES, "helpers.registered_stage"))
    with pytest.raises(ValueError, match="'first_word_filtered' has neither a recipe"):
        registry.check_registry(rs.with_first_word_filter_built_by(registry.STAGES, None))
