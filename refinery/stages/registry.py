"""The funnel's stages, named once: what each reads, writes, adds, decides and depends on.

A `FunnelStage` is a per-batch asset that writes a table of kept documents (`documents/<name>` with
the text where the text is made or final, `attributes/<name>` as verdicts in between;
refinery/layout.py), its removals (`rejects/<name>`) and, per `Verdict` it records, a stats
folder. Most stages record one verdict of their own name; `deduped` records two (`exact_deduped`,
`near_deduped`), which are assets of their own (global steps over hash ranges and bands) named in
its `steps`, with the other assets that its verdicts are computed by (signatures, clusters, a
model).

Every list of stage names the rest of the code keeps is derived from `STAGES` by the functions
below: the stats order of the funnel report (`funnel_order`), the steps of `refinery why`
(`verdicts`), the attribute tables and the table each narrows (`attribute_stages`), a source's
`skip:` names (`skippable_names`), the config paths each funnel asset reads (`config_read`), and
the funnel assets' dependencies (`funnel_stage(name).upstream`). A per-document stage's record names
its recipe (`build`, refinery/stage_recipes.py), by which the funnel's assets, their workers and the
ablations' judges all build it. A new stage, or an ablation that leaves one out, names it here once.

The functions read `STAGES` when called, so a test that swaps the registry sees its own stages.
Pure data: nothing here imports the rest of the project.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


class UnknownStage(ValueError):
    """A name that is no stage, verdict, `skip:` name or rule family of the registry."""


@dataclass(frozen=True)
class Verdict:
    """One decision a stage records on every document it reads: a step of `refinery why`, a row of a
    document's funnel history, a stats folder (`stats/<name>`) and the `stage` column of its reject
    rows."""

    name: str
    families: tuple[str, ...]  # its rules' reason families: rejects `<family>/<rule>` (c4_lines: rewrites)
    skip: str | None = None  # the source `skip:` entry that bypasses it; None when no source can
    adds: tuple[str, ...] = ()  # the columns it adds to the documents it keeps
    custom_filters: bool = False  # the config's custom filters run inside it (their families are its too)


@dataclass(frozen=True)
class StepAsset:
    """An asset of its own that a stage's verdicts are computed by, with the config paths it reads."""

    name: str
    config: tuple[str, ...]


@dataclass(frozen=True)
class FunnelStage:
    """A per-batch stage asset: `upstream`'s kept documents in, its own table of kept documents and
    its rejects table (both folders named `name`) out."""

    name: str  # the asset, and the folder of its kept documents, rejects and stats
    upstream: str | None  # the stage whose kept documents it reads; None for the first
    stores_text: bool  # documents/<name> holds the text; otherwise attributes/<name> holds verdicts only
    config: tuple[str, ...]  # the dotted config paths its output depends on (assets/provenance.py)
    verdicts: tuple[Verdict, ...]
    steps: tuple[StepAsset, ...] = ()  # the assets between `upstream` and this stage that compute its verdicts
    # "module:function" of its recipe, which builds its per-document Stage from the config
    # (refinery/stage_recipes.py); None for a stage that is no per-document Stage (ingest reads
    # files, dedup's verdicts are global steps)
    build: str | None = None


def _stage(name: str, upstream: str | None, config: tuple[str, ...], families: tuple[str, ...], *,
           stores_text: bool = False, skip: str | None = None, adds: tuple[str, ...] = (),
           custom_filters: bool = False, steps: tuple[StepAsset, ...] = (), build: str | None = None) -> FunnelStage:
    """A stage that records one verdict of its own name."""
    verdict = Verdict(name, families, skip=skip, adds=adds, custom_filters=custom_filters)
    return FunnelStage(name, upstream, stores_text, config, (verdict,), steps, build)


def _recipe(function: str) -> str:
    return f"refinery.stage_recipes:{function}"


# In the order documents flow.
STAGES: tuple[FunnelStage, ...] = (
    _stage("raw_documents", None, ("sources", "stages.extract", "stages.record_timeout_s"), ("ingest",),
           stores_text=True),
    _stage("extracted_text", "raw_documents", ("sources", "stages.extract", "stages.record_timeout_s"),
           ("extract",), stores_text=True, build=_recipe("build_extractor")),
    _stage("language_filtered", "extracted_text", ("sources", "stages.language", "stages.record_timeout_s"),
           ("language",), skip="language", adds=("language", "language_score"), build=_recipe("build_language")),
    _stage("heuristic_filtered", "language_filtered",
           ("sources", "stages.heuristic", "stages.custom_filters", "stages.record_timeout_s"),
           ("heuristic", "url", "gopher_quality", "gopher_rep", "c4", "c4_lines", "fineweb"),
           skip="heuristic", custom_filters=True, build=_recipe("build_heuristic")),
    FunnelStage(
        "deduped", "heuristic_filtered", False, ("sources", "stages.exact_dedup", "stages.near_dedup"),
        verdicts=(Verdict("exact_deduped", ("exact_dedup",)),
                  Verdict("near_deduped", ("near_dedup",), skip="near_dedup",
                          adds=("dup_cluster", "dup_cluster_size"))),
        steps=(StepAsset("dedup_signatures", ("sources", "seed", "stages.exact_dedup", "stages.near_dedup")),
               StepAsset("exact_deduped", ("stages.exact_dedup",)),
               StepAsset("near_deduped", ("seed", "stages.near_dedup")),
               StepAsset("near_dup_clusters", ("seed", "stages.near_dedup"))),
    ),
    _stage("quality_scored", "deduped", ("sources", "stages.quality", "stages.record_timeout_s"), ("quality",),
           skip="quality", adds=("quality_score",), build=_recipe("build_quality"),
           steps=(StepAsset("quality_model", ("seed", "buckets", "sources", "stages.quality")),)),
    _stage("pii_redacted", "quality_scored", ("sources", "stages.pii", "stages.safety", "stages.record_timeout_s"),
           ("safety", "pii"), stores_text=True, adds=("pii_counts",), build=_recipe("build_safety_then_redact")),
)


# The first stage whose documents hold text a model can read (an ablation's `raw` variant): a verdict
# before it cannot be left out, its rejects have no text.
TEXT_STAGE = "extracted_text"


# ---- lookups ---------------------------------------------------------------------------------------


def _known(what: str, names: Iterable[str]) -> str:
    return f"known {what}: {', '.join(names)}"


def funnel_stage(name: str) -> FunnelStage:
    """The stage whose asset (and table) is `name`."""
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise UnknownStage(f"no funnel stage {name!r}; {_known('stages', stage_names())}")


def verdicts() -> tuple[Verdict, ...]:
    """Every verdict of the funnel, in funnel order."""
    return tuple(v for stage in STAGES for v in stage.verdicts)


def stage_of(verdict: str) -> FunnelStage:
    """The stage whose table holds the documents `verdict` kept and the rows it rejected."""
    for stage in STAGES:
        if any(v.name == verdict for v in stage.verdicts):
            return stage
    raise UnknownStage(f"no funnel verdict {verdict!r}; {_known('verdicts', (v.name for v in verdicts()))}")


def funnel_verdict(name: str) -> Verdict:
    """The verdict named `name`, by its own name or by the `skip:` name that bypasses it."""
    for v in verdicts():
        if name in (v.name, v.skip):
            return v
    raise UnknownStage(f"no funnel verdict {name!r}; {_known('verdicts', (v.name for v in verdicts()))}; "
                       f"{_known('skip: names', skippable_names())}")


def rule_family(rule: str) -> str:
    """The family of a reject rule, `<family>/<rule>` (`gopher_rep/dup_line_frac` -> `gopher_rep`)."""
    return rule.split("/", 1)[0]


def family_verdict(family: str, custom_families: Iterable[str] = ()) -> Verdict:
    """The verdict whose reject rules carry `family`; `custom_families` (the config's custom filters'
    names) belong to the verdict they run inside."""
    custom = set(custom_families)
    for v in verdicts():
        if family in v.families or (v.custom_filters and family in custom):
            return v
    raise UnknownStage(f"no rule family {family!r}; {_known('families', rule_families(custom_families))}")


def rule_families(custom_families: Iterable[str] = ()) -> tuple[str, ...]:
    """Every reject rule family of the funnel, in funnel order, with the custom filters' in the
    verdict they run inside."""
    custom = tuple(custom_families)
    return tuple(f for v in verdicts() for f in (*v.families, *(custom if v.custom_filters else ())))


@dataclass(frozen=True)
class LeftOut:
    """What an ablation that leaves a name out ignores: a verdict's every reject, or only those of
    its rules in `families`."""

    verdict: str
    families: tuple[str, ...] | None  # None: the whole verdict


def left_out(name: str, custom_families: Iterable[str] = ()) -> tuple[LeftOut, ...]:
    """What `name` means in an ablation's `without:` list: a stage (each verdict it records:
    `deduped` is exact and near dedup), a verdict by its name or its `skip:` name (all of it), or a
    rule family (only that family's rejects). An unknown name raises `UnknownStage` listing the
    names it may be."""
    custom = tuple(custom_families)
    if name not in ablation_names(custom):
        raise UnknownStage(f"{name!r} is no funnel stage, verdict, skip: name or rule family after {TEXT_STAGE}; "
                           f"it may be one of: {', '.join(ablation_names(custom))}")
    if name in stage_names():
        return tuple(LeftOut(v.name, None) for v in funnel_stage(name).verdicts)
    if name in (*(v.name for v in verdicts()), *skippable_names()):
        return (LeftOut(funnel_verdict(name).name, None),)
    return (LeftOut(family_verdict(name, custom).name, (name,)),)


def ablation_names(custom_families: Iterable[str] = ()) -> tuple[str, ...]:
    """Every name an ablation's `without:` list may take: the stages after `TEXT_STAGE`, their
    verdicts, `skip:` names and rule families."""
    after = STAGES[stage_names().index(TEXT_STAGE) + 1:]
    custom = tuple(custom_families)
    names = [*(s.name for s in after), *(v.name for s in after for v in s.verdicts),
             *(v.skip for s in after for v in s.verdicts if v.skip),
             *(f for s in after for v in s.verdicts for f in (*v.families, *(custom if v.custom_filters else ())))]
    return tuple(dict.fromkeys(names))


# ---- the derived lists -----------------------------------------------------------------------------


def stage_names() -> tuple[str, ...]:
    """The per-batch stage assets, in funnel order."""
    return tuple(stage.name for stage in STAGES)


def funnel_order() -> tuple[str, ...]:
    """Every stats folder of the funnel in the order documents flow: a stage's verdicts of other
    names (its global steps' decisions), then the stage itself."""
    return tuple(name for stage in STAGES
                 for name in (*(v.name for v in stage.verdicts if v.name != stage.name), stage.name))


def attribute_stages() -> dict[str, str]:
    """The stages that store their kept documents as an attribute table, each with the stage whose
    documents it narrows."""
    return {stage.name: stage.upstream for stage in STAGES if not stage.stores_text and stage.upstream}


def skippable_names() -> tuple[str, ...]:
    """A source's `skip:` names, in funnel order."""
    return tuple(v.skip for v in verdicts() if v.skip)


def stage_facts() -> dict[str, tuple[str, ...]]:
    """Verdict -> the columns it adds, for the verdicts that add any."""
    return {v.name: v.adds for v in verdicts() if v.adds}


def config_read() -> dict[str, tuple[str, ...]]:
    """Each funnel asset (stages and their step assets, in funnel order) -> the config paths it reads."""
    out: dict[str, tuple[str, ...]] = {}
    for stage in STAGES:
        out.update({step.name: step.config for step in stage.steps})
        out[stage.name] = stage.config
    return out


def check_registry(stages: tuple[FunnelStage, ...]) -> None:
    """Refuse a registry with a stage named twice, an upstream that is not an earlier stage, a
    verdict that is neither its stage nor one of its step assets, a name (step asset, verdict,
    `skip:` name, rule family) that stands for two different things, a recipe that is no
    "module:function", or a stage after TEXT_STAGE with neither a recipe nor step assets."""
    if TEXT_STAGE not in {stage.name for stage in stages}:
        raise ValueError(f"TEXT_STAGE {TEXT_STAGE!r} is not a stage")
    seen: set[str] = set()
    means: dict[str, str] = {}

    def claim(value: str, meaning: str) -> None:
        if means.setdefault(value, meaning) != meaning:
            raise ValueError(f"{value!r} names both {means[value]} and {meaning}")

    after_text = False
    for stage in stages:
        if stage.build is not None and ":" not in stage.build:
            raise ValueError(f"stage {stage.name!r}: build {stage.build!r} is no 'module:function' recipe")
        if after_text and stage.build is None and not stage.steps:
            raise ValueError(f"stage {stage.name!r} has neither a recipe (build) nor step assets: nothing builds it, "
                             f"and no ablation could judge the documents it would let back in")
        after_text = after_text or stage.name == TEXT_STAGE
        if stage.name in seen:
            raise ValueError(f"stage {stage.name!r} occurs twice")
        if stage.upstream is not None and stage.upstream not in seen:
            raise ValueError(f"stage {stage.name!r}: upstream {stage.upstream!r} is not an earlier stage")
        seen.add(stage.name)
        own = {stage.name, *(step.name for step in stage.steps)}
        for v in stage.verdicts:
            if v.name not in own:
                raise ValueError(f"verdict {v.name!r} of {stage.name!r} is neither that stage nor one of its "
                                 f"step assets")
            for value in (v.name, v.skip, *v.families):
                if value is not None:
                    claim(value, f"verdict {v.name!r}")
        for other in sorted(own - {v.name for v in stage.verdicts}):
            claim(other, f"asset {other!r} of stage {stage.name!r}")

check_registry(STAGES)
