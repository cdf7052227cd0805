"""The per-phase fields are declared once (refinery/curriculum/phase_fields.py): every record that
carries one is held to the declaration, and a field added to it the way a contributor would is
pinned in the manifest and refused on a config/manifest mismatch without any comparison list edited."""

import dataclasses

import pytest
from pydantic import Field

from refinery.config import CurriculumConfig, PhaseConfig, RefineryConfig, parse_config
from refinery.curriculum import (PHASE_FIELDS, CurriculumMismatch, PhaseField, PhaseManifest, PhasePlan, PhaseSpan,
                                 build_phase_manifest, read_manifest, refuse_mismatch, validate_data_root,
                                 write_manifest)
from refinery.curriculum import manifests, phase_fields
from refinery.curriculum.phase_fields import PLAN, SPAN
from refinery.storage import LocalDataRoot

from helpers.final_shards import DOCS_PER_BUCKET, config_dict, sample_docs, write_final_shards

# What a manifest holds of its own, not a field of the config's phase.
MANIFEST_OWN = {"index", "buckets", "validation", "config_fingerprint", "version"}


def undeclared(phase_cls=PhaseConfig, manifest_cls=PhaseManifest, declared=PHASE_FIELDS) -> dict[str, set[str]]:
    """Per record, the attributes it carries that the declaration does not name, and the other way round."""
    config = {name for f in declared for name in f.config_fields}
    plan = {f.name for f in declared if PLAN in f.schedule}
    span = {f.name for f in declared if SPAN in f.schedule}
    pinned = {f.manifest for f in declared if f.manifest}
    span_own = {"index", "start", "end", "blend_tokens"}  # placed on the token axis by place_phases
    return {
        "config": set(phase_cls.model_fields) ^ config,
        "plan": {f.name for f in dataclasses.fields(PhasePlan)} ^ plan,
        "span": ({f.name for f in dataclasses.fields(PhaseSpan)} - span_own) ^ span,
        "manifest": ({f.name for f in dataclasses.fields(manifest_cls)} - MANIFEST_OWN) ^ pinned,
    }


def test_every_record_carries_what_the_declaration_says():
    assert undeclared() == {"config": set(), "plan": set(), "span": set(), "manifest": set()}


# ---- a contributor adds a per-phase field: the config's phase, the manifest, and one declaration ----


class DropoutPhase(PhaseConfig):
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)


class DropoutCurriculum(CurriculumConfig):
    phases: list[DropoutPhase] = Field(min_length=1)


class DropoutConfig(RefineryConfig):
    curriculum: DropoutCurriculum | None = None


@dataclasses.dataclass(frozen=True)
class DropoutManifest(PhaseManifest):
    dropout: float = 0.0


def dropout_config(tmp_path, dropout: float) -> DropoutConfig:
    d = config_dict(tmp_path)
    d["curriculum"]["phases"][1]["dropout"] = dropout
    return DropoutConfig.model_validate({**d, "base_dir": str(tmp_path)})


def test_an_undeclared_field_is_found_in_each_record_that_carries_it():
    found = undeclared(DropoutPhase, DropoutManifest)
    assert found == {"config": {"dropout"}, "plan": set(), "span": set(), "manifest": {"dropout"}}


def test_a_declared_field_is_pinned_and_its_mismatch_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(phase_fields, "PHASE_FIELDS", (*PHASE_FIELDS, PhaseField("dropout", manifest="dropout")))
    monkeypatch.setattr(manifests, "PhaseManifest", DropoutManifest)  # the attribute added to PhaseManifest
    assert undeclared(DropoutPhase, DropoutManifest, phase_fields.PHASE_FIELDS)["config"] == set()
    root = LocalDataRoot(tmp_path / "root")
    for b, n in DOCS_PER_BUCKET.items():
        write_final_shards(root, b, sample_docs(b, n))
    built = dropout_config(tmp_path, 0.1)
    report, inventory, selections = validate_data_root(built, root)
    for phase in ("main", "anneal"):
        write_manifest(root, build_phase_manifest(built, root, phase, report, inventory, selections))
    assert read_manifest(root, "anneal").dropout == 0.1 and read_manifest(root, "main").dropout == 0.0
    refuse_mismatch(built, root)  # what was built from trains
    with pytest.raises(CurriculumMismatch) as err:
        refuse_mismatch(dropout_config(tmp_path, 0.2), root)
    assert "curriculum.phases[1] (anneal).dropout: the config says 0.2, the manifest 0.1" in str(err.value)
    assert "phases[0]" not in str(err.value)


def test_a_cut_ranked_otherwise_than_its_manifest_is_refused(tmp_path):
    """quality_cut was left out of the hand list the comparison used to keep: a global cut trained
    on manifests cut per language passed. Declared, it is compared."""
    root = LocalDataRoot(tmp_path / "root")
    for b, n in DOCS_PER_BUCKET.items():
        write_final_shards(root, b, sample_docs(b, n))
    built = parse_config(config_dict(tmp_path))  # the anneal's cut: per_language, the default
    report, inventory, selections = validate_data_root(built, root)
    for phase in ("main", "anneal"):
        write_manifest(root, build_phase_manifest(built, root, phase, report, inventory, selections))
    refuse_mismatch(built, root)
    d = config_dict(tmp_path)
    d["curriculum"]["phases"][1]["quality_cut"] = "global"
    with pytest.raises(CurriculumMismatch) as err:
        refuse_mismatch(parse_config(d), root)
    assert "curriculum.phases[1] (anneal).quality_cut: the config says global, the manifest's cut is per_language" \
        in str(err.value)
    d["curriculum"]["phases"][0]["quality_cut"] = "global"  # a phase without a cut: nothing ranked, nothing differs
    assert "phases[0]" not in str(pytest.raises(CurriculumMismatch, refuse_mismatch, parse_config(d), root).value)
