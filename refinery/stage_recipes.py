"""How each per-document stage of the registry is built from the config: the recipe its record
names (`FunnelStage.build`, "module:function"), one function from a `StageBuild` to a `Stage`.

Everything that runs a stage builds it here, so that it is built one way: the funnel's file tasks
(refinery/stage_file_tasks.py, the assets in assets/ make one per stage with a recipe) and the
ablations' judges (refinery/ablations/selection.py `Judges`), which run the stages after a
readmitted document's rejection on it. A variant's judges build with `leaves_out` set to what the
variant lets back in; a recipe that changes what it builds for a left-out verdict (the quality
threshold, the safety filter) reads it, the others ignore it (their removals are let back in by the
judges). A recipe also says what code its stage runs (`runs`): the modules whose source is the
stage's code version (assets/provenance.py `code_version`), so that editing them marks the stage's
asset stale; a recipe that says nothing runs its own module's code. A new stage is its module, its
config section and its registry line naming its recipe.

Records name their recipes instead of holding them so that the registry stays data that imports
nothing: a recipe imports the config and its stage, which import the registry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE
from refinery.models import quality as q
from refinery.models import quality_features, quality_fit
from refinery.models import quality_training as qt
from refinery.stages import custom, extract, heuristic, language, pii_context
from refinery.stages import pii as pii_stage
from refinery.stages import registry
from refinery.stages.base import Stage, StageOutput
from refinery.storage import DataRoot


def leaves_nothing_out(verdict: str, rule: str) -> bool:
    """The funnel's `leaves_out`: every removal stands."""
    return False


@dataclass
class StageBuild:
    """What a recipe builds a stage from."""

    cfg: RefineryConfig
    source: str  # the source whose files it runs on (its `rules_off`)
    root: DataRoot | None = None  # where the run published its models; None for a stage that reads none
    # (verdict, rule) -> whether the removal is one the variant being judged lets back in
    leaves_out: Callable[[str, str], bool] = leaves_nothing_out
    shared: dict = field(default_factory=dict)  # what the builds for several sources share: a loaded model

    def quality_model(self) -> tuple[q.QualityModel, dict]:
        """The published quality model and its pointer, loaded once for every build sharing `shared`."""
        if self.root is None:
            raise ValueError("this stage scores with the published quality model: build it with the data root")
        if "quality_model" not in self.shared:
            self.shared["quality_model"] = qt.load_published_model(self.root)
        return self.shared["quality_model"]


Recipe = Callable[[StageBuild], Stage]
# The config -> the modules (or classes) whose source is a stage's code.
StageCode = Callable[[RefineryConfig], tuple[Any, ...]]


def runs(code: StageCode) -> Callable[[Recipe], Recipe]:
    """Mark a recipe with the code its stage runs (`stage_code`)."""
    def mark(build: Recipe) -> Recipe:
        build.runs = code  # type: ignore[attr-defined]
        return build

    return mark


def recipe(name: str) -> Recipe:
    """The recipe the registry's record of stage `name` names."""
    named = registry.funnel_stage(name).build
    if named is None:
        raise registry.UnknownStage(f"stage {name!r} has no build recipe: it is no per-document stage")
    module, _, function = named.partition(":")
    return getattr(importlib.import_module(module), function)


def stage_code(name: str, cfg: RefineryConfig) -> tuple[Any, ...]:
    """What stage `name` runs under `cfg`, as its recipe says (`runs`): the modules (or classes) its
    asset's code version hashes; the recipe itself (so its module) when it says nothing."""
    build = recipe(name)
    code = getattr(build, "runs", None)
    return (build,) if code is None else code(cfg)


def build_stage(name: str, cfg: RefineryConfig, source: str, root: DataRoot | None = None, *,
                leaves_out: Callable[[str, str], bool] = leaves_nothing_out, shared: dict | None = None) -> Stage:
    """Stage `name` for `source`'s files, by its recipe, with the config's per-record time budget."""
    stage = recipe(name)(StageBuild(cfg, source, root, leaves_out, {} if shared is None else shared))
    stage.record_timeout_s = cfg.stages.record_timeout_s
    return stage


# ---- the built-in stages' recipes (their docstrings are their assets' descriptions) ----------------


@runs(lambda cfg: (extract,))
def build_extractor(build: StageBuild) -> Stage:
    """HTML to text with resiliparse (main content); text passes through; other content types and
    empty extractions are rejected."""
    return extract.Extractor(build.cfg.stages.extract)


@runs(lambda cfg: (language,))
def build_language(build: StageBuild) -> Stage:
    """fastText lid.176 on the whole text; keeps the configured languages at or above min_score."""
    return language.LanguageFilter.from_config(build.cfg.stages.language, build.cfg.resolve)


def heuristic_code(cfg: RefineryConfig) -> tuple[Any, ...]:
    """The built-in rules' module, then the class of each of the config's custom filters, so that
    editing a filter's code marks heuristic_filtered (and what follows) stale."""
    return (heuristic, *(custom.custom_filter_class(spec, cfg.base_dir) for spec in cfg.stages.custom_filters))


@runs(heuristic_code)
def build_heuristic(build: StageBuild) -> Stage:
    """URL blocklist, Gopher quality and repetition, C4 line rules and FineWeb quality rules, each
    rule named and counted; then the config's custom filters."""
    cfg = build.cfg
    return custom.with_custom_filters(heuristic.HeuristicFilter(cfg.stages.heuristic, cfg.source(build.source).rules_off),
                                      cfg)


class Unscored(Stage):
    """quality_scored with the classifier off: every document kept, no score."""

    name = q.QualityScorer.name

    def run(self, docs) -> StageOutput:
        return q.unscored(docs)

    def config_summary(self) -> dict[str, Any]:
        return {"enabled": False}


# The classifier's code: its features and fit decide the scores as much as the scorer does.
@runs(lambda cfg: (q, quality_features, quality_fit, qt))
def build_quality(build: StageBuild) -> Stage:
    """quality_score on every document; drops those below stages.quality.threshold."""
    if not build.cfg.stages.quality.enabled:
        return Unscored()
    model, pointer = build.quality_model()
    # Left out: scored (a variant's quality_top ranks by it) but never dropped on score.
    enforce = not build.leaves_out(q.QualityScorer.name, "quality/below_threshold")
    return q.QualityScorer(model, build.cfg.stages.quality.threshold, enforce, pointer["model_hash"])


@runs(lambda cfg: (pii_stage, pii_context, q))
def build_safety_then_redact(build: StageBuild) -> Stage:
    """Safety filter (blocked words and domains), then PII replaced by typed placeholders; documents
    whose text changed are scored again with the published quality model."""
    stages = build.cfg.stages
    rescore = build.quality_model()[0].score if stages.quality.enabled else None
    if build.leaves_out(CLEAN_STAGE, "safety/"):  # redaction is no verdict: it always runs
        return pii_stage.PiiRedactor.from_config(stages.pii, rescore)
    return pii_stage.SafetyThenRedact.from_config(stages, rescore)
