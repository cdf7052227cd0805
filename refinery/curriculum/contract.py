"""The validation contract: every blocking error and warning of a curriculum, and the numbers
`refinery validate` prints and every manifest carries, before any compute is spent (seed 000).

Structure (weights, shares, phase names, seq_len against the packed window), the budget (whole
optimizer steps, blend windows) and, when the final shards exist, the inventory (exhaustion against
max_epochs, quality cutoffs, difficulty bands of ordered phases). Exhaustion and budget mismatch
block unless the curriculum allows them (seed 003's flags); a phase ordered by difficulty over a
bucket without difficulty scores always blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from refinery.config import ConfigError, RefineryConfig
from refinery.curriculum.bands import Served, bucket_bands, difficulty_progress
from refinery.curriculum.inventory import BucketInventory, has_final_shards, inventory_slices, read_inventory
from refinery.curriculum.quality_cut import QualitySelection, phase_selections
from refinery.curriculum.schedule import (SUM_TOLERANCE, CurriculumError, Schedule, batch_tokens, build_schedule,
                                          phase_kind)

if TYPE_CHECKING:
    from refinery.storage import DataRoot
    from refinery.tasks import RunTasks


class CurriculumMismatch(ConfigError):
    """The config's curriculum is not the one the phase manifests were built from, or is invalid;
    training would follow a plan nobody wrote. The message lists every difference by field."""


@dataclass(frozen=True)
class Finding:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass
class ValidationReport:
    ok: bool
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    contract: dict[str, Any] | None = None  # None when the schedule itself could not be computed
    # The schedule validated (None: it could not be computed): what the manifests are built from, so
    # one validation computes it once. Not part of the report's JSON.
    schedule: Schedule | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "errors": [str(e) for e in self.errors],
            "warnings": [str(w) for w in self.warnings],
            "contract": self.contract,
        }


def _fmt(n: float) -> str:
    return f"{n:,.0f}" if abs(n) >= 100 else f"{n:,.2f}"


def _check_structure(cfg: RefineryConfig, errors: list[Finding]) -> None:
    cur = cfg.curriculum
    assert cur is not None
    known = set(cfg.buckets)
    names = [p.name for p in cur.phases]
    if len(set(names)) != len(names):
        errors.append(Finding("curriculum.phases[*].name", f"phase names repeat: {names}; give each phase its own name"))
    for i, p in enumerate(cur.phases):
        where = f"curriculum.phases[{i}]"
        if (p.share is None) == (p.tokens is None):
            what = "both `share` and `tokens`" if p.share is not None else "neither `share` nor `tokens`"
            errors.append(Finding(where, f"phase {p.name!r} gives {what}; give exactly one"))
        for b, w in p.weights.items():
            if b not in known:
                errors.append(
                    Finding(f"{where}.weights.{b}", f"unknown bucket {b!r}; declare it under `buckets:` or use one of {sorted(known)}")
                )
            if w < 0:
                errors.append(Finding(f"{where}.weights.{b}", f"weight {w} is negative; weights are fractions of the phase's tokens, set it to 0 or more"))
        total_w = math.fsum(p.weights.values())
        if abs(total_w - 1.0) > SUM_TOLERANCE:
            errors.append(
                Finding(
                    f"{where}.weights",
                    f"weights of phase {p.name!r} sum to {total_w:.6g}, not 1; scale them so they sum to 1 "
                    f"(curriculum.temperature reshapes them afterwards)",
                )
            )
        if p.seq_len > cfg.shards.max_seq_len:
            errors.append(
                Finding(
                    f"{where}.seq_len",
                    f"{p.seq_len} is longer than the packed window shards.max_seq_len = {cfg.shards.max_seq_len}; "
                    f"lower the phase's seq_len or raise shards.max_seq_len and re-run tokenized_shards",
                )
            )
        if i == 0 and p.interpolation > 0:
            errors.append(
                Finding(f"{where}.interpolation", "the first phase has no previous mixture to blend from; set it to 0")
            )
    kind = phase_kind(cur)
    if kind == "mixed" and not any((p.share is None) == (p.tokens is None) for p in cur.phases):
        errors.append(
            Finding("curriculum.phases", "some phases give `share` and others `tokens`; use one kind across the curriculum")
        )
    if kind == "share":
        total_s = math.fsum(p.share for p in cur.phases)  # type: ignore[misc]
        if abs(total_s - 1.0) > SUM_TOLERANCE:
            errors.append(
                Finding(
                    "curriculum.phases[*].share",
                    f"shares sum to {total_s:.6g}, not 1; scale them so they sum to 1 (or give `tokens` durations)",
                )
            )


def _check_budget(cfg: RefineryConfig, schedule: Schedule, errors: list[Finding], warnings: list[Finding]) -> None:
    cur = cfg.curriculum
    assert cur is not None
    sink = warnings if cur.allow_budget_mismatch else errors
    fix = "" if cur.allow_budget_mismatch else " (or set curriculum.allow_budget_mismatch: true)"
    if phase_kind(cur) == "tokens" and schedule.total_tokens != cur.total_tokens:
        sink.append(
            Finding(
                "curriculum.phases[*].tokens",
                f"phase durations sum to {schedule.total_tokens:,}, not curriculum.total_tokens = {cur.total_tokens:,}; "
                f"make them add up{fix}",
            )
        )
    for p in schedule.phases:
        step = batch_tokens(cfg, p.seq_len)
        if p.tokens % step:
            sink.append(
                Finding(
                    f"curriculum.phases[{p.index}]",
                    f"phase {p.name!r} budget {p.tokens:,} tokens is not a whole number of optimizer steps of {step:,} "
                    f"tokens (training.micro_batch_size x grad_accum_steps x seq_len {p.seq_len}), so the trainer "
                    f"would consume {math.ceil(p.tokens / step) * step:,}; make the budget a multiple of {step:,}{fix}",
                )
            )
        if p.blend_tokens > p.tokens:
            errors.append(
                Finding(
                    f"curriculum.phases[{p.index}].interpolation",
                    f"the blend window ({p.blend_tokens:,} tokens) is longer than phase {p.name!r} ({p.tokens:,}); lower it",
                )
            )


def _check_inventory(
    cfg: RefineryConfig,
    schedule: Schedule,
    inventory: dict[str, int],
    selections: dict[str, dict[str, int]],
    errors: list[Finding],
    warnings: list[Finding],
) -> None:
    cur = cfg.curriculum
    assert cur is not None
    exhaust = warnings if cur.allow_bucket_exhaustion else errors
    fix = "" if cur.allow_bucket_exhaustion else ", or set curriculum.allow_bucket_exhaustion: true"
    per_phase = schedule.phase_bucket_tokens()
    demand = per_phase.sum(axis=0)
    for bi, bucket in enumerate(schedule.buckets):
        weighted = [p for p in schedule.phases if p.weights[bi] > 0]
        if not weighted:
            continue
        have = inventory.get(bucket, 0)
        if have == 0:
            errors.append(
                Finding(
                    f"curriculum.phases[{weighted[0].index}].weights.{bucket}",
                    f"bucket {bucket!r} has no tokens in its final shards but phase {weighted[0].name!r} gives it weight "
                    f"{weighted[0].weights[bi]:.3g}; feed the bucket data (check its sources and the funnel's rejects) "
                    f"or set its weight to 0",
                )
            )
            continue
        max_epochs = cur.buckets[bucket].max_epochs if bucket in cur.buckets else 1.0
        if demand[bi] > have * max_epochs:
            exhaust.append(
                Finding(
                    f"curriculum.buckets.{bucket}.max_epochs",
                    f"bucket {bucket!r} needs {_fmt(demand[bi])} tokens but holds {have:,} x max_epochs {max_epochs:g} = "
                    f"{_fmt(have * max_epochs)}; raise max_epochs to at least {demand[bi] / have:.2f}, lower its weights{fix}",
                )
            )
        for p in schedule.phases:
            sel = selections.get(p.name, {}).get(bucket)
            if sel is None or per_phase[p.index, bi] <= 0:
                continue
            if per_phase[p.index, bi] > sel * max_epochs:
                exhaust.append(
                    Finding(
                        f"curriculum.phases[{p.index}].quality_top_fraction",
                        f"phase {p.name!r} needs {_fmt(per_phase[p.index, bi])} tokens of {bucket!r} but its quality "
                        f"cutoff keeps {sel:,} x max_epochs {max_epochs:g}; raise quality_top_fraction or "
                        f"curriculum.buckets.{bucket}.max_epochs, lower the weight{fix}",
                    )
                )


# phase -> bucket -> its bands (BucketBands.to_json()), None where the bucket has no difficulty scores
PhaseBands = dict[str, dict[str, dict[str, Any] | None]]


def _check_order(cfg: RefineryConfig, schedule: Schedule, bands: PhaseBands, errors: list[Finding]) -> None:
    """A phase ordered by difficulty must have scores for every bucket it draws: its own weights, and
    the previous phase's during its blend window (manifests.drawn_buckets)."""
    cur = cfg.curriculum
    assert cur is not None
    for span, phase in zip(schedule.phases, cur.phases):
        if phase.order is None:
            continue
        drawn = span.weights > 0
        if span.index > 0 and span.blend_tokens:
            drawn = drawn | (schedule.phases[span.index - 1].weights > 0)
        for bucket, d in zip(schedule.buckets, drawn.tolist()):
            if d and bucket in bands.get(span.name, {}) and bands[span.name][bucket] is None:
                errors.append(Finding(
                    f"curriculum.phases[{span.index}].order",
                    f"phase {span.name!r} orders bucket {bucket!r} by {phase.order.by}, but its final shards carry no "
                    f"{phase.order.by} scores; difficulty must be enabled (stages.difficulty) and "
                    f"shuffled_shards[{bucket}] rematerialized, or remove the phase's order",
                ))


def contract(cfg: RefineryConfig, schedule: Schedule, inventory: dict[str, int] | None,
             bands: PhaseBands | None = None) -> dict[str, Any]:
    """The numbers `refinery validate` prints and every manifest carries. A curriculum with an
    ordered phase adds each phase's `order` and `difficulty`: the bands per ordered phase and
    bucket, and the mean difficulty served at each tenth of the phase (None: unknown)."""
    cur = cfg.curriculum
    assert cur is not None
    per_phase = schedule.phase_bucket_tokens()
    demand = per_phase.sum(axis=0)
    buckets = {}
    for bi, b in enumerate(schedule.buckets):
        have = None if inventory is None else inventory.get(b, 0)
        max_epochs = cur.buckets[b].max_epochs if b in cur.buckets else 1.0
        buckets[b] = {
            "tokens": float(demand[bi]),
            "inventory_tokens": have,
            "max_epochs": max_epochs,
            "effective_epochs": None if not have else float(demand[bi] / have),
            "shortfall": None if have is None else float(max(0.0, demand[bi] - have * max_epochs)),
        }
    ordered = [p for p in cur.phases if p.order is not None]
    extra: dict[str, Any] = {}
    if ordered:
        known = bands is not None
        extra["difficulty"] = {
            "bands": bands if known else None,
            "progress": difficulty_progress(cfg, schedule, bands) if known else {p.name: None for p in ordered},
        }
    return {
        **extra,
        "total_tokens": cur.total_tokens,
        "schedule_tokens": schedule.total_tokens,
        "temperature": cur.temperature,
        "inventory_known": inventory is not None,
        "phases": [
            {
                "name": p.name,
                "start": p.start,
                "end": p.end,
                "tokens": p.tokens,
                "share": p.tokens / schedule.total_tokens,
                "seq_len": p.seq_len,
                "lr_scale": p.lr_scale,
                "blend_tokens": p.blend_tokens,
                "quality_top_fraction": p.quality_top_fraction,
                "weights": {b: float(w) for b, w in zip(schedule.buckets, p.weights)},
                "bucket_tokens": {b: float(t) for b, t in zip(schedule.buckets, per_phase[p.index])},
                **({"order": cur.phases[p.index].order.model_dump(mode="json")} if cur.phases[p.index].order else {}),
            }
            for p in schedule.phases
        ],
        "buckets": buckets,
        "mean_seq_len": schedule.mean_seq_len(),
        "attention": schedule.attention_saving(),
    }


def validate(
    cfg: RefineryConfig,
    inventory: dict[str, int] | None = None,
    selections: dict[str, dict[str, int]] | None = None,
    bands: PhaseBands | None = None,
) -> ValidationReport:
    """Every blocking error and warning of the curriculum, and its contract.

    `inventory` is tokens per bucket in the final shards (None: unknown, only the schedule is
    checked); `selections` is, for each phase with a quality cutoff, the tokens each bucket keeps;
    `bands`, for each ordered phase, each bucket's difficulty bands (`phase_bands`)."""
    if cfg.curriculum is None:
        raise CurriculumError("curriculum: no curriculum declared; add a `curriculum:` section (see configs/demo.yaml)")
    errors: list[Finding] = []
    warnings: list[Finding] = []
    _check_structure(cfg, errors)
    try:
        schedule = build_schedule(cfg)
    except CurriculumError:
        return ValidationReport(ok=False, errors=errors, warnings=warnings)
    _check_budget(cfg, schedule, errors, warnings)
    if inventory is None:
        warnings.append(
            Finding("inventory", "unknown (no final shards yet); only the schedule was checked, materialize shuffled_shards")
        )
    else:
        _check_inventory(cfg, schedule, inventory, selections or {}, errors, warnings)
    if bands is not None:
        _check_order(cfg, schedule, bands, errors)
    return ValidationReport(ok=not errors, errors=errors, warnings=warnings,
                            contract=contract(cfg, schedule, inventory, bands), schedule=schedule)


def phase_bands(cfg: RefineryConfig, root: "DataRoot", inventory: dict[str, BucketInventory],
                selections: dict[str, dict[str, QualitySelection]], run_tasks: "RunTasks | None" = None) -> PhaseBands:
    """For each ordered phase, each non-empty bucket's difficulty bands over the entries the phase
    serves (its quality cutoff's, or all), streamed from the entry tables (bands.py) by tasks run by
    `run_tasks` (default: in this process)."""
    assert cfg.curriculum is not None
    out: PhaseBands = {}
    for p in cfg.curriculum.phases:
        if p.order is None:
            continue
        descending = p.order.direction == "hard_first"
        out[p.name] = {}
        for b, inv in inventory.items():
            if not inv.entries or inv.entries_table is None:
                continue
            sel = selections.get(p.name, {}).get(b)
            served = Served(quality_cut=None if sel is None else sel.cut)
            found = bucket_bands(root, inventory_slices(inv), served, p.order.bands, descending, run_tasks)
            out[p.name][b] = None if found is None else found.to_json()
    return out


def validate_data_root(cfg: RefineryConfig, root: "DataRoot", run_tasks: "RunTasks | None" = None) -> tuple[ValidationReport, dict[str, BucketInventory] | None, dict[str, dict[str, QualitySelection]]]:
    """Validate against what the data root holds: inventory from the final shards' index.json when
    there are any, and the quality cutoffs' selections and the difficulty bands streamed from their
    entry tables, a task per final shard run by `run_tasks` (default: in this process)."""
    if not has_final_shards(root, cfg.buckets):
        return validate(cfg), None, {}
    inventory = read_inventory(root, cfg.buckets)
    selections = phase_selections(cfg, root, inventory, run_tasks)
    report = validate(
        cfg,
        {b: inv.tokens for b, inv in inventory.items()},
        {ph: {b: s.tokens for b, s in sel.items()} for ph, sel in selections.items()},
        phase_bands(cfg, root, inventory, selections, run_tasks),
    )
    if report.contract is not None and selections:
        report.contract["quality_cut"] = quality_cut_shares(cfg, selections)
    return report, inventory, selections


def quality_cut_shares(cfg: RefineryConfig, selections: dict[str, dict[str, QualitySelection]]) -> dict[str, Any]:
    """For each phase with a quality cut: how it ranks (per_language or global) and, per bucket and
    language, the bucket's documents, those kept and the language's share of each."""
    assert cfg.curriculum is not None
    kinds = {p.name: p.quality_cut for p in cfg.curriculum.phases}
    return {phase: {"cut": kinds[phase], "buckets": {b: s.languages for b, s in sel.items()}}
            for phase, sel in selections.items()}


def structure_findings(cfg: RefineryConfig) -> list[Finding]:
    """The curriculum's blocking errors that need no inventory (see `refuse_invalid`)."""
    return checked_structure(cfg)[0]


def checked_structure(cfg: RefineryConfig) -> tuple[list[Finding], Schedule | None]:
    """`structure_findings`, and the schedule when there are none."""
    errors: list[Finding] = []
    _check_structure(cfg, errors)
    if errors:
        return errors, None
    try:
        return errors, build_schedule(cfg)
    except CurriculumError as err:
        return [Finding("curriculum", str(err))], None


def refuse_invalid(cfg: RefineryConfig) -> Schedule:
    """Raise CurriculumMismatch naming each field when the curriculum's structure is invalid
    (weights or shares not summing to 1, repeated phase names, unknown buckets, ...): the checks of
    `validate` that need no inventory and that no manifest can make right. Returns the schedule."""
    if cfg.curriculum is None:
        raise CurriculumMismatch("curriculum: no curriculum declared; add a `curriculum:` section (see configs/demo.yaml)")
    errors, schedule = checked_structure(cfg)
    if schedule is None:
        lines = "\n".join(f"  {e}" for e in errors)
        raise CurriculumMismatch(f"invalid curriculum; nothing was trained:\n{lines}")
    return schedule
