"""The whole run: the root section `RefineryConfig` and the checks of fields that name other fields
(buckets, phases, rules). Nothing here imports or runs user code: custom filters are built by
refinery/preflight.py."""

from __future__ import annotations

import hashlib
import json
import os

from pydantic import Field, field_validator, model_validator

from refinery.config.ablation_schedules import schedule_problems
from refinery.config.ablations import AblationsConfig
from refinery.config.contamination import ContaminationConfig
from refinery.config.curriculum import CurriculumConfig
from refinery.config.execution import ExecutionConfig
from refinery.config.section import SAFE_PATH_PART, Section
from refinery.config.sources import PartitionsConfig, SourceConfig
from refinery.config.stages import StagesConfig
from refinery.config.tokens import ShardsConfig, TokenizerConfig
from refinery.config.training import LAUNCH_FIELDS, TrainingConfig


class RefineryConfig(Section):
    """The whole run: where outputs go, the inputs, every stage's settings, the curriculum and the trainer."""

    seed: int = 0  # every sampled choice (shuffles, holdouts, tokenizer sample) derives from it
    # A local folder or s3://bucket/prefix: every table, shard, manifest and checkpoint of the run.
    data_root: str
    # The curriculum's buckets; every source feeds one. Names become folder names under the data root.
    buckets: list[str] = Field(min_length=1)
    sources: list[SourceConfig] = Field(min_length=1)
    partitions: PartitionsConfig = PartitionsConfig()
    execution: ExecutionConfig = ExecutionConfig()
    stages: StagesConfig = StagesConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    shards: ShardsConfig = ShardsConfig()
    curriculum: CurriculumConfig | None = None  # none: the graph stops at the shards; training needs one
    training: TrainingConfig = TrainingConfig()
    contamination: ContaminationConfig = ContaminationConfig()
    ablations: AblationsConfig | None = None  # none: no proxy-model ablations (docs/ablations.md)

    # Where the YAML lived; relative paths in it resolve against this folder.
    base_dir: str = Field(default=".", exclude=True)

    @field_validator("buckets")
    @classmethod
    def _unique_buckets(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"bucket names repeat: {v}")
        return v

    @model_validator(mode="after")
    def _cross_refs(self) -> "RefineryConfig":
        # Every problem at once, one `field: message` line each (_validation_problems splits them).
        problems = cross_reference_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    # ---- derived values -------------------------------------------------------------------------

    def resolve(self, path: str) -> str:
        """A path from the config, made absolute against the config's folder (URLs pass through)."""
        if "://" in path or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(self.base_dir, path))

    def source(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(name)

    def fingerprint(self) -> str:
        """A short hash of everything that shapes outputs (not where they are written, nor how the
        work is partitioned or where it runs: a document's outputs are per input file whatever the batch
        or the machine; nor the ablations, whose outputs live under ablations/ with their own)."""
        payload = self.model_dump(mode="json", exclude={"data_root": True, "base_dir": True, "partitions": True,
                                                        "ablations": True,
                                                        "execution": True, "training": set(LAUNCH_FIELDS)})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]




def cross_reference_problems(cfg: RefineryConfig) -> list[str]:
    """Fields that name other fields (buckets, phases, rules) and name nothing: `field: message` each."""
    problems: list[str] = []
    known = set(cfg.buckets)
    for i, b in enumerate(cfg.buckets):
        if not SAFE_PATH_PART.match(b):
            problems.append(f"buckets[{i}]: {b!r} is not safe as a folder name (buckets name folders of the data "
                            f"root); use letters, digits, '_', '-' and '.', starting with a letter or digit")
    names = [s.name for s in cfg.sources]
    if len(set(names)) != len(names):
        problems.append(f"sources: names repeat: {names}")
    for i, src in enumerate(cfg.sources):
        try:
            cfg.stages.heuristic.check_rule_names(src.rules_off, f"sources[{i}].rules_off")
        except ValueError as err:
            problems.append(str(err))
        if src.bucket not in known:
            problems.append(f"sources[{i}].bucket: unknown bucket {src.bucket!r}; declare it under `buckets:` "
                            f"(now {sorted(known)}) or use one of those")
    filters = [f.name for f in cfg.stages.custom_filters]  # building them is the preflight's (user code)
    if len(set(filters)) != len(filters):
        problems.append(f"stages.custom_filters: names repeat: {filters}")
    q = cfg.stages.quality
    for field, buckets in (("positive_buckets", q.positive_buckets), ("negative_buckets", q.negative_buckets)):
        if field not in q.model_fields_set:
            continue  # the defaults name the usual buckets; refinery.preflight checks them against the sources
        for b in buckets:
            if b not in known:
                problems.append(f"stages.quality.{field}: unknown bucket {b!r}; use one of {sorted(known)}")
    phases = [p.name for p in cfg.curriculum.phases] if cfg.curriculum is not None else []
    for field, phase in (("training.anneal_halt_on_val_rise.phase",
                          cfg.training.anneal_halt_on_val_rise.phase if cfg.training.anneal_halt_on_val_rise else None),
                         ("contamination.anneal_phase", cfg.contamination.anneal_phase)):
        if phase is None or phase in phases:
            continue
        problems.append(f"{field}: no phase {phase!r}; use one of {phases}" if phases else
                        f"{field}: names phase {phase!r}, but the config has no curriculum; declare `curriculum:` "
                        f"with its phases, or remove {field.rsplit('.', 1)[-1]}")
    if cfg.curriculum is not None:
        for name in cfg.curriculum.buckets:
            if name not in known:
                problems.append(f"curriculum.buckets.{name}: unknown bucket {name!r}; use one of {sorted(known)}")
    if cfg.ablations is not None:
        problems += ablation_problems(cfg)
    return problems


def ablation_problems(cfg: RefineryConfig) -> list[str]:
    """`ablations` fields that name stages, rule families, buckets and eval domains that do not exist."""
    # Here, not at the top: loading a config without ablations imports nothing of refinery.stages.
    from refinery.stages.registry import UnknownStage, ablation_names, left_out

    assert cfg.ablations is not None
    ab, problems = cfg.ablations, []
    custom = [f.name for f in cfg.stages.custom_filters]
    names = ablation_names(custom)
    seen: dict[tuple, str] = {}
    for variant, spec in ab.variants.items():
        for i, name in enumerate(spec.without or []):
            if name not in names:
                problems.append(f"ablations.variants.{variant}.without[{i}]: {name!r} is no funnel stage, verdict, "
                                f"skip: name or rule family after extracted_text; use one of {list(names)}")
        if spec.quality_top is not None and not cfg.stages.quality.enabled:
            problems.append(f"ablations.variants.{variant}.quality_top: stages.quality.enabled is false, so no "
                            f"document has a quality_score to cut by; enable the quality stage or drop quality_top")
        try:
            ignored = frozenset(lo for name in spec.without or [] for lo in left_out(name, custom))
        except UnknownStage:
            continue
        selects = (spec.base, ignored, spec.quality_top)
        if selects in seen:
            problems.append(f"ablations.variants.{variant}: empty: it selects what {seen[selects]!r} selects, so "
                            f"comparing them measures only the seeds; change or remove one")
        seen.setdefault(selects, variant)
    step = ab.micro_batch_size * ab.seq_len
    if ab.tokens is not None and ab.tokens % step:
        problems.append(f"ablations.tokens: {ab.tokens:,} is not a whole number of proxy optimizer steps of {step:,} "
                        f"tokens (ablations.micro_batch_size x ablations.seq_len); give a multiple of {step:,}")
    if ab.model.n_embd % ab.model.n_head:
        problems.append(f"ablations.model.n_embd: {ab.model.n_embd} is not a multiple of ablations.model.n_head "
                        f"{ab.model.n_head}; each attention head takes an equal slice of the embedding")
    for i, b in enumerate(ab.eval_buckets or []):
        if b not in cfg.buckets:
            problems.append(f"ablations.eval_buckets[{i}]: unknown bucket {b!r}; use one of {sorted(cfg.buckets)}")
    domains = [*cfg.buckets, *(e.name for e in cfg.contamination.eval_sets)]
    for i, path in enumerate(ab.eval_sets):
        name = eval_set_domain(path)
        if not SAFE_PATH_PART.match(name):
            problems.append(f"ablations.eval_sets[{i}]: its domain {name!r} (the file's name before its first '.') "
                            f"is not a plain name; name the file with letters, digits, '_', '-'")
        elif name in domains:
            problems.append(f"ablations.eval_sets[{i}]: its domain {name!r} (the file's name) is also a bucket or "
                            f"another eval set; rename the file")
        domains.append(name)
    return problems + schedule_problems(cfg)


def eval_set_domain(path: str) -> str:
    """The evaluation domain of an `ablations.eval_sets` file: its name without folders and suffixes."""
    return os.path.basename(path).split(".")[0]
