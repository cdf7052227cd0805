"""The stage registry (refinery/stages/registry.py) is the one place the funnel's stages are named:
every list the rest of the code keeps agrees with it, the demo's graph is wired from it, a stage
added to it shows up in every derived list (and a source may skip it) without being named anywhere
else, and a name that is no stage is refused naming the ones there are."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from refinery.stages import registry
from refinery.stages.registry import FunnelStage, LeftOut, StepAsset, UnknownStage, Verdict

REPO = Path(__file__).resolve().parents[1]


def test_the_registry_is_todays_funnel():
    """Pinned once: the derived lists are the ones the graph had before they were derived."""
    assert registry.funnel_order() == (
        "raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "exact_deduped",
        "near_deduped", "deduped", "quality_scored", "pii_redacted")
    assert registry.attribute_stages() == {"language_filtered": "extracted_text", "heuristic_filtered": "language_filtered",
                                           "deduped": "heuristic_filtered", "quality_scored": "deduped"}
    assert registry.skippable_names() == ("language", "heuristic", "near_dedup", "quality")
    assert registry.config_read()["heuristic_filtered"] == (
        "sources", "stages.heuristic", "stages.custom_filters", "stages.record_timeout_s")
    assert list(registry.config_read()) == [
        "raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "dedup_signatures",
        "exact_deduped", "near_deduped", "near_dup_clusters", "deduped", "quality_model", "quality_scored",
        "pii_redacted"]


def test_every_derived_list_agrees_with_the_registry():
    from assets.provenance import CONFIG_READ
    from refinery.config import BUILTIN_FAMILIES, SKIPPABLE_STAGES, SourceConfig
    from refinery.reports.funnel import FUNNEL_ORDER
    from refinery.layout import ATTRIBUTE_STAGES
    from refinery.lineage import FUNNEL_STAGES
    from refinery.global_steps import dedup_compute
    from refinery.models import quality_training
    from refinery.reports.trail import STAGE_FACTS, STEPS

    verdicts = registry.verdicts()
    assert FUNNEL_ORDER == registry.funnel_order()
    assert [(s.stage, s.documents, s.rejects) for s in STEPS] == [
        (v.name, registry.stage_of(v.name).name, registry.stage_of(v.name).name) for v in verdicts]
    assert [s.stage for s in STEPS][4:6] == ["exact_deduped", "near_deduped"] and STEPS[4].documents == "deduped"
    assert STAGE_FACTS == registry.stage_facts() == {v.name: v.adds for v in verdicts if v.adds}
    assert FUNNEL_STAGES == [(v.name, v.skip, list(v.adds)) for v in verdicts]
    assert ATTRIBUTE_STAGES == registry.attribute_stages()
    assert SKIPPABLE_STAGES == registry.skippable_names()
    assert SourceConfig.model_json_schema()["properties"]["skip"]["items"]["enum"] == list(registry.skippable_names())
    assert {k: v for k, v in CONFIG_READ.items() if k in registry.config_read()} == registry.config_read()
    assert list(CONFIG_READ)[:len(registry.config_read())] == list(registry.config_read())
    assert BUILTIN_FAMILIES == (*registry.rule_families(), "tokenize")
    assert dedup_compute.UPSTREAM == registry.funnel_stage(dedup_compute.STAGE).upstream == "heuristic_filtered"
    assert quality_training.UPSTREAM == registry.funnel_stage("quality_scored").upstream == dedup_compute.STAGE


def test_the_stages_code_agrees_with_its_record():
    """Each stage class's name, reason family, `skip_key` and added columns are its verdict's."""
    from refinery.documents import CLEAN_STAGE
    from refinery.global_steps import near_dedup
    from refinery.stages import extract, ingest, pii, safety
    from refinery.stages.heuristic import HeuristicFilter
    from refinery.stages.language import LanguageFilter
    from refinery.models.quality import QualityScorer

    assert (ingest.STAGE, extract.STAGE, CLEAN_STAGE) == ("raw_documents", "extracted_text", "pii_redacted")
    for cls in (extract.Extractor, LanguageFilter, HeuristicFilter, QualityScorer):
        verdict = registry.funnel_verdict(cls.name)
        assert cls.family in verdict.families
        assert cls.skip_key == verdict.skip
        assert set(cls.writes) - {"text"} == set(verdict.adds)
    clean = registry.funnel_verdict(CLEAN_STAGE)
    assert {safety.SafetyFilter.family, pii.PiiRedactor.family} == set(clean.families)
    assert set(pii.PiiRedactor.writes) - {"text"} == set(clean.adds)
    assert registry.funnel_verdict(near_dedup.NEAR_STAGE).skip == near_dedup.NEAR_SKIP_KEY
    assert registry.stage_of(near_dedup.EXACT_STAGE) is registry.stage_of(near_dedup.NEAR_STAGE)


def test_the_demos_funnel_assets_are_wired_from_the_registry():
    """Every stage and step asset of the registry is an asset of the graph, and each stage's asset
    depends on its upstream's."""
    from orchestration.definitions import build_definitions

    graph = build_definitions(str(REPO / "configs" / "demo.yaml")).resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert set(registry.config_read()) <= keys
    for stage in registry.STAGES:
        parents = {k.to_user_string() for k in graph.get(_key(stage.name)).parent_keys}
        assert parents >= ({stage.upstream} if stage.upstream else set()), stage.name
        assert graph.get(_key(stage.name)).group_name == "funnel"
    assert {k.to_user_string() for k in graph.get(_key("quality_scored")).parent_keys} == {"deduped", "quality_model"}
    assert {k.to_user_string() for k in graph.get(_key("pii_redacted")).parent_keys} == {"quality_scored"}


def _key(name: str):
    import dagster as dg

    return dg.AssetKey(name)


# A stage added to the registry: a toxicity score between quality and PII, skippable, with a step
# asset that trains its model. Nothing else in the code names it.
TOXICITY = FunnelStage(
    "toxicity_scored", "quality_scored", False, ("sources", "stages.toxicity"),
    (Verdict("toxicity_scored", ("toxicity",), skip="toxicity", adds=("toxicity_score",)),),
    steps=(StepAsset("toxicity_model", ("seed", "stages.toxicity")),),
)


def with_toxicity(stages: tuple[FunnelStage, ...]) -> tuple[FunnelStage, ...]:
    """`stages` with TOXICITY before pii_redacted, which now reads it."""
    at = [s.name for s in stages].index("pii_redacted")
    return (*stages[:at], TOXICITY, dataclasses.replace(stages[at], upstream=TOXICITY.name), *stages[at + 1:])


def test_a_stage_added_to_the_registry_appears_in_every_derived_list(monkeypatch):
    monkeypatch.setattr(registry, "STAGES", with_toxicity(registry.STAGES))
    registry.check_registry(registry.STAGES)
    from refinery.reports.trail import Step, funnel_steps

    order = registry.funnel_order()
    assert order[order.index("quality_scored") + 1:] == ("toxicity_scored", "pii_redacted")
    assert registry.attribute_stages()["toxicity_scored"] == "quality_scored"
    assert "pii_redacted" not in registry.attribute_stages()  # it still stores the text
    assert registry.skippable_names() == ("language", "heuristic", "near_dedup", "quality", "toxicity")
    assert registry.stage_facts()["toxicity_scored"] == ("toxicity_score",)
    assert list(registry.config_read())[-3:] == ["toxicity_model", "toxicity_scored", "pii_redacted"]
    assert Step("toxicity_scored", "toxicity_scored", "toxicity_scored") in funnel_steps()
    assert registry.funnel_stage("pii_redacted").upstream == "toxicity_scored"
    assert registry.left_out("toxicity") == (LeftOut("toxicity_scored", None),)
    assert "toxicity" in registry.rule_families() and "toxicity_scored" in registry.ablation_names()


def test_the_modules_derive_their_lists_from_a_registry_with_an_added_stage():
    """In a fresh process whose registry has the added stage before anything imports it: the module
    constants, the config's `skip:` values and CONFIG_READ all carry it."""
    code = f"""
import dataclasses, json, sys
sys.path.insert(0, {str(REPO)!r})
from refinery.stages import registry
from tests.test_stage_registry import with_toxicity
registry.STAGES = with_toxicity(registry.STAGES)
from assets.provenance import CONFIG_READ
from refinery.config import BUILTIN_FAMILIES, SKIPPABLE_STAGES, SourceConfig
from refinery.reports.funnel import FUNNEL_ORDER
from refinery.layout import ATTRIBUTE_STAGES, kept_documents_key
from refinery.lineage import FUNNEL_STAGES
from refinery.reports.trail import STAGE_FACTS, STEPS
source = SourceConfig(name="web", path="*.jsonl", format="jsonl", bucket="web", skip=["toxicity"])
print(json.dumps({{"order": FUNNEL_ORDER, "steps": [s.stage for s in STEPS], "facts": STAGE_FACTS,
    "lineage": FUNNEL_STAGES, "attributes": ATTRIBUTE_STAGES, "skip": SKIPPABLE_STAGES, "source_skip": source.skip,
    "config_read": CONFIG_READ.get("toxicity_scored"), "model": CONFIG_READ.get("toxicity_model"),
    "families": BUILTIN_FAMILIES, "table": kept_documents_key("toxicity_scored", "web/a")}}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["order"][-3:] == ["quality_scored", "toxicity_scored", "pii_redacted"]
    assert seen["steps"][-3:] == ["quality_scored", "toxicity_scored", "pii_redacted"]
    assert seen["facts"]["toxicity_scored"] == ["toxicity_score"]
    assert ["toxicity_scored", "toxicity", ["toxicity_score"]] in seen["lineage"]
    assert seen["attributes"]["toxicity_scored"] == "quality_scored"
    assert seen["skip"][-1] == "toxicity" and seen["source_skip"] == ["toxicity"]
    assert seen["config_read"] == ["sources", "stages.toxicity"] and seen["model"] == ["seed", "stages.toxicity"]
    assert "toxicity" in seen["families"]
    assert seen["table"] == "attributes/toxicity_scored/web/a.parquet"


def test_a_source_may_not_skip_a_stage_the_registry_does_not_name():
    from pydantic import ValidationError

    from refinery.config import SourceConfig

    with pytest.raises(ValidationError, match="skip"):
        SourceConfig(name="web", path="*.jsonl", format="jsonl", bucket="web", skip=["toxicity"])


def test_ablation_names_resolve_to_verdicts_and_rule_families():
    assert registry.left_out("heuristic") == registry.left_out("heuristic_filtered") == (
        LeftOut("heuristic_filtered", None),)
    assert registry.left_out("near_dedup") == (LeftOut("near_deduped", None),)
    assert registry.left_out("deduped") == (LeftOut("exact_deduped", None), LeftOut("near_deduped", None))
    assert registry.left_out("gopher_rep") == (LeftOut("heuristic_filtered", ("gopher_rep",)),)
    assert registry.left_out("exact_dedup") == (LeftOut("exact_deduped", ("exact_dedup",)),)
    assert registry.left_out("safety") == (LeftOut("pii_redacted", ("safety",)),)
    # A custom filter's family is the verdict it runs inside.
    assert registry.left_out("no_shouting", ["no_shouting"]) == (LeftOut("heuristic_filtered", ("no_shouting",)),)
    assert registry.rule_family("gopher_rep/dup_line_frac") == "gopher_rep"
    assert registry.family_verdict("url").name == "heuristic_filtered"


@pytest.mark.parametrize("name", ["toxicity", "ingest", "extracted_text", "raw_documents", "Heuristic", ""])
def test_an_unknown_or_unablatable_name_is_refused_naming_the_known_ones(name):
    """Before extracted_text a document has no text to train on: its verdicts cannot be left out."""
    with pytest.raises(UnknownStage, match=r"it may be one of: language_filtered, .*gopher_rep"):
        registry.left_out(name)


def test_an_unknown_stage_or_verdict_is_refused_naming_the_known_ones():
    with pytest.raises(UnknownStage, match="no funnel stage 'toxicity_scored'; known stages: raw_documents"):
        registry.funnel_stage("toxicity_scored")
    with pytest.raises(UnknownStage, match="known skip: names: language, heuristic, near_dedup, quality"):
        registry.funnel_verdict("toxicity")
    with pytest.raises(UnknownStage, match="no funnel verdict 'deduped'"):
        registry.stage_of("deduped")
    with pytest.raises(UnknownStage, match="no rule family 'toxicity'"):
        registry.family_verdict("toxicity")


def test_a_registry_that_cannot_be_wired_is_refused():
    stages = registry.STAGES
    with pytest.raises(ValueError, match="upstream 'quality_scored' is not an earlier stage"):
        registry.check_registry((TOXICITY, *stages))
    with pytest.raises(ValueError, match="'language' names both verdict 'language_filtered' and verdict 'toxicity_scored'"):
        clash = dataclasses.replace(TOXICITY, verdicts=(Verdict("toxicity_scored", ("toxicity",), skip="language"),))
        registry.check_registry((*stages, clash))
    with pytest.raises(ValueError, match="verdict 'toxic' of 'toxicity_scored' is neither that stage nor one of its"):
        registry.check_registry((*stages, dataclasses.replace(TOXICITY, verdicts=(Verdict("toxic", ("toxicity",)),))))
    with pytest.raises(ValueError, match="stage 'deduped' occurs twice"):
        registry.check_registry((*stages, stages[4]))
    with pytest.raises(ValueError, match="'quality_model' names both asset 'quality_model' of stage 'quality_scored' and"):
        steps = (StepAsset("quality_model", ()),)
        registry.check_registry((*stages, dataclasses.replace(TOXICITY, steps=steps)))


def test_editing_a_stages_record_changes_its_assets_version_and_no_others(monkeypatch):
    """An asset's code version covers its registry record: rewiring a stage (its upstream, verdicts,
    added columns) marks that stage changed for `refinery demo --changed`, and only that stage."""
    from assets.provenance import stage_code_version

    names = [s.name for s in registry.STAGES]
    before = {name: stage_code_version(name, "code") for name in names}
    edited = tuple(dataclasses.replace(s, upstream="extracted_text") if s.name == "heuristic_filtered" else s
                   for s in registry.STAGES)
    monkeypatch.setattr(registry, "STAGES", edited)
    after = {name: stage_code_version(name, "code") for name in names}
    assert [name for name in names if before[name] != after[name]] == ["heuristic_filtered"]
