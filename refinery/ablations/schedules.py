"""Schedule variants and anneal branches (docs/ablations.md, "Schedule variants"): the curriculum's
phase table, scaled to the ablation budget and the proxy's seq_len, and the tables derived from it,
each trained on the `funnel` variant's data root for the same total tokens as the data variants.

Scaling. Each phase keeps its share of the curriculum's tokens (its end rounded to whole proxy
steps of `ablations.micro_batch_size x ablations.seq_len`, so every phase serves whole steps at any
of the seq_lens below), its weights after the curriculum's temperature (the derived curricula run at
temperature 1, so the mixture is the curriculum's own), its lr_scale, interpolation, quality cut and
RoPE setting and difficulty `order`. Its seq_len keeps its ratio to the curriculum's longest:
L * ablations.seq_len / Lmax, so the last phase of seed 000's table trains at the proxy's window. The
order's bands are cut, as the main graph's, over the entries each phase serves of the funnel
variant's data, whose documents carry the main graph's difficulty scores (refinery/ablations/
build.py scores them with its published reference model when `stages.difficulty` is enabled).

The built-ins (`base`):

- `curriculum`: that table.
- `iid`: the curriculum's token-weighted average mixture (`Schedule.bucket_tokens`, blend windows
  included) at the proxy's window, in two phases of that one mixture split where the curriculum's
  last phase starts: the trainer decays the LR linearly through the last phase, so the split keeps
  the same LR schedule, and a bucket's stream goes on across the split (one selection, one cursor).
  Its total tokens are the curriculum's, every bucket's planned tokens are the curriculum's.
  No phase is ordered: iid is a shuffle.
- `no_anneal`: the last phase trains on the mixture, quality cut and order of `main` (the phase
  before it when none is called so); its share, seq_len and lr_scale, hence the LR schedule, unchanged.
- `no_length_warmup`: every phase at the last phase's seq_len.
- `uniform_order`: the curriculum with every phase's `order` dropped and nothing else changed: the
  same phases, mixtures and entries per bucket, served in a uniform shuffle per pass.

A variant's `phases` patches then set a phase's weights, seq_len, lr_scale, interpolation or order.

Phase names. Every variant's phases live beside the `funnel` variant's own in its root, so each is
prefixed: `s_<schedule>__<phase>` for a schedule, `a_<mixture>__<phase>` for an anneal branch's last
phase. An anneal branch is the `curriculum` table with its last phase's weights replaced; its other
phases *are* the curriculum's (same names, same manifests), and it trains in the curriculum run's
run base, so its last phase starts from the curriculum's pre-anneal boundary checkpoint exactly as
`training_run` starts a phase from the previous one's (training/phase_runs.py), in a run directory
of its own that never touches the curriculum's.

Each variant's derived curriculum is written at `<funnel root>/schedules/<run name>.json` with its
manifests; `run_config` reads it back, so a proxy run trains exactly what was written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from refinery.config import ConfigError, RefineryConfig
from refinery.config.ablation_schedules import CURRICULUM, IID_PHASES, PhasePatch, base_of
from refinery.config.ablations import FUNNEL_VARIANT
from refinery.curriculum.schedule import PhasePlan, Schedule, apply_temperature, phase_budgets, place_phases
from refinery.storage import DataRoot

SCHEDULE, ANNEAL = "schedule", "anneal"  # the two kinds of run
PREFIX = {SCHEDULE: "s", ANNEAL: "a"}
DEFINITIONS_PREFIX = "schedules"  # in the funnel variant's root


class ScheduleError(ConfigError):
    """A schedule variant that cannot be trained on the data as configured; names the field (the
    commands exit 2 with it)."""


@dataclass(frozen=True)
class ProxyPhase:
    """One phase of a derived curriculum, in proxy units."""

    name: str
    tokens: int
    seq_len: int
    lr_scale: float
    weights: dict[str, float]  # after the curriculum's temperature; the derived curriculum runs at 1
    interpolation: float
    quality_top_fraction: float | None
    quality_cut: str
    rope_scaling: Any
    order: dict[str, Any] | None = None  # the phase's OrderConfig as JSON; None: a uniform shuffle

    def to_config(self, prefix: str) -> dict[str, Any]:
        out = {"name": f"{prefix}__{self.name}", "tokens": self.tokens, "seq_len": self.seq_len,
               "lr_scale": self.lr_scale, "weights": self.weights, "interpolation": self.interpolation,
               "quality_top_fraction": self.quality_top_fraction, "quality_cut": self.quality_cut}
        optional = {"rope_scaling": self.rope_scaling, "order": self.order}
        return {**out, **{k: v for k, v in optional.items() if v is not None}}


def run_prefix(kind: str, name: str) -> str:
    return f"{PREFIX[kind]}_{name}"


def run_name(kind: str, name: str) -> str:
    """The name a run's results are stored and reported under (`schedule.iid`, `anneal.docs_heavy`):
    a dot, which no schedule or mixture name holds, keeps it apart from the data variants'."""
    return f"{kind}.{name}"


# ---- the tables ---------------------------------------------------------------------------------


def proxy_seq_len(cfg: RefineryConfig, seq_len: int) -> int:
    """A curriculum seq_len in proxy tokens: its ratio to the curriculum's longest, times ablations.seq_len."""
    assert cfg.curriculum is not None and cfg.ablations is not None
    longest = max(p.seq_len for p in cfg.curriculum.phases)
    return seq_len * cfg.ablations.seq_len // longest


def _mixture(cfg: RefineryConfig, weights: dict[str, float]) -> dict[str, float]:
    assert cfg.curriculum is not None
    p = apply_temperature(np.array([weights.get(b, 0.0) for b in cfg.buckets]), cfg.curriculum.temperature)
    return {b: float(w) for b, w in zip(cfg.buckets, p) if w > 0}


def curriculum_phases(cfg: RefineryConfig, budget: int) -> list[ProxyPhase]:
    """The config's curriculum scaled to `budget` tokens (a whole number of proxy steps)."""
    cur, ab = cfg.curriculum, cfg.ablations
    assert cur is not None and ab is not None
    step = ab.micro_batch_size * ab.seq_len
    steps, ends, acc = budget // step, [], 0
    durations = phase_budgets(cur)
    for d in durations:
        acc += d
        ends.append(round(steps * acc / sum(durations)) * step)
    phases, start = [], 0
    for p, end in zip(cur.phases, ends):
        if end <= start:
            raise ScheduleError(f"ablations.tokens: at {budget:,} tokens phase {p.name!r} of the curriculum gets no "
                                f"whole proxy step of {step:,} tokens; raise the budget or the phase's share")
        phases.append(ProxyPhase(
            p.name, end - start, proxy_seq_len(cfg, p.seq_len), p.lr_scale, _mixture(cfg, p.weights), p.interpolation,
            p.quality_top_fraction, p.quality_cut,
            p.rope_scaling.model_dump(mode="json") if hasattr(p.rope_scaling, "model_dump") else p.rope_scaling,
            None if p.order is None else p.order.model_dump(mode="json")))
        start = end
    return phases


def schedule_of(cfg: RefineryConfig, phases: list[ProxyPhase]) -> Schedule:
    """The schedule maths of a derived table (refinery/curriculum/schedule.py), over the config's buckets."""
    buckets = tuple(cfg.buckets)
    return place_phases(buckets, [PhasePlan(p.name, p.tokens, p.seq_len, p.lr_scale,
                                            np.array([p.weights.get(b, 0.0) for b in buckets]), p.interpolation,
                                            p.quality_top_fraction) for p in phases])


def iid_phases(cfg: RefineryConfig, curriculum: list[ProxyPhase]) -> list[ProxyPhase]:
    assert cfg.ablations is not None
    planned = schedule_of(cfg, curriculum).bucket_tokens()
    total = sum(planned.values())
    mixture = {b: t / total for b, t in planned.items() if t > 0}
    last = curriculum[-1]
    head = sum(p.tokens for p in curriculum[:-1])
    plain = ProxyPhase(IID_PHASES[0], head, cfg.ablations.seq_len, 1.0, mixture, 0.0, None, "per_language", None)
    if not head:
        return [replace(plain, tokens=last.tokens)]
    return [plain, replace(plain, name=IID_PHASES[1], tokens=last.tokens)]


def _main_phase(phases: list[ProxyPhase]) -> ProxyPhase:
    return next((p for p in phases[:-1] if p.name == "main"), phases[-2])


def base_phases(cfg: RefineryConfig, base: str, budget: int) -> list[ProxyPhase]:
    phases = curriculum_phases(cfg, budget)
    if base == "iid":
        return iid_phases(cfg, phases)
    if base == "no_anneal":
        main = _main_phase(phases)
        return [*phases[:-1], replace(phases[-1], weights=main.weights, quality_top_fraction=main.quality_top_fraction,
                                      quality_cut=main.quality_cut, order=main.order)]
    if base == "no_length_warmup":
        return [replace(p, seq_len=phases[-1].seq_len) for p in phases]
    if base == "uniform_order":
        return [replace(p, order=None) for p in phases]
    return phases  # curriculum


def patched(cfg: RefineryConfig, phases: list[ProxyPhase], patches: dict[str, PhasePatch]) -> list[ProxyPhase]:
    out = []
    for p in phases:
        patch = patches.get(p.name)
        if patch is not None:
            p = replace(p, **{k: v for k, v in {
                "weights": _mixture(cfg, patch.weights) if patch.weights is not None else None,
                "seq_len": proxy_seq_len(cfg, patch.seq_len) if patch.seq_len is not None else None,
                "lr_scale": patch.lr_scale, "interpolation": patch.interpolation,
                "order": patch.order.model_dump(mode="json") if patch.order is not None else None}.items()
                if v is not None})
        out.append(p)
    return out


def variant_phases(cfg: RefineryConfig, name: str, budget: int) -> list[ProxyPhase]:
    """The phase table of schedule variant `name` at `budget` tokens."""
    assert cfg.ablations is not None
    spec = cfg.ablations.schedules[name]
    return patched(cfg, base_phases(cfg, base_of(name, spec), budget), spec.phases)


def anneal_phases(cfg: RefineryConfig, mixture: str, budget: int) -> list[ProxyPhase]:
    """The `curriculum` table with its last phase's weights replaced by the mixture's."""
    assert cfg.ablations is not None and cfg.ablations.anneal_search is not None
    phases = variant_phases(cfg, CURRICULUM, budget)
    weights = _mixture(cfg, cfg.ablations.anneal_search.mixtures[mixture])
    return [*phases[:-1], replace(phases[-1], weights=weights)]


def curriculum_config(cfg: RefineryConfig, kind: str, name: str, budget: int) -> dict[str, Any]:
    """The `curriculum:` section a run of `kind` (schedule, anneal) and `name` trains."""
    assert cfg.curriculum is not None
    if kind == SCHEDULE:
        phases = [p.to_config(run_prefix(SCHEDULE, name)) for p in variant_phases(cfg, name, budget)]
    else:
        table = anneal_phases(cfg, name, budget)
        phases = [p.to_config(run_prefix(SCHEDULE, CURRICULUM)) for p in table[:-1]]
        phases.append(table[-1].to_config(run_prefix(ANNEAL, name)))
    # Exhaustion allowed as in build.py: `check_fill` refuses a table the bucket cannot fill with a
    # row of slack per phase, so this is a guard against the sampler's last row, not a plan.
    return {"total_tokens": budget, "temperature": 1.0, "allow_bucket_exhaustion": True,
            "buckets": {b: p.model_dump(mode="json") for b, p in cfg.curriculum.buckets.items()}, "phases": phases}


def check_fill(cfg: RefineryConfig, kind: str, name: str, phases: list[ProxyPhase], bucket_tokens: dict[str, int]) -> None:
    """Refuse a table that plans more of a bucket than the funnel variant holds (less a row per
    phase: the sampler keeps a bucket within a row of its plan in each)."""
    planned = schedule_of(cfg, phases).bucket_tokens()
    field = f"ablations.schedules.{name}" if kind == SCHEDULE else f"ablations.anneal_search.mixtures.{name}"
    for bucket, tokens in planned.items():
        available = bucket_tokens.get(bucket, 0) - len(phases) * max(p.seq_len for p in phases)
        if tokens > 0 and math.ceil(tokens) > available:
            raise ScheduleError(f"{field}: plans {math.ceil(tokens):,} tokens of bucket {bucket!r} at the ablation "
                                f"budget, and the {FUNNEL_VARIANT!r} variant holds {bucket_tokens.get(bucket, 0):,}; "
                                f"lower the bucket's weights or ablations.tokens")


def funnel_demand(cfg: RefineryConfig, budget: int) -> dict[str, int]:
    """Per bucket, the most tokens any declared schedule variant or anneal mixture plans of the
    funnel variant's data at `budget`, with `check_fill`'s row of slack per phase: the funnel
    variant stores at least this much of each bucket (refinery/ablations/bounded.py), so a table its
    own mixture does not cover (a docs-heavy anneal) still fills. A table the schedule checks refuse
    adds nothing: its run refuses it, naming the field."""
    ab = cfg.ablations
    assert ab is not None
    tables = []
    for make, names in ((variant_phases, ab.schedules),
                        (anneal_phases, ab.anneal_search.mixtures if ab.anneal_search else {})):
        for name in names:
            try:
                tables.append(make(cfg, name, budget))
            except ScheduleError:
                continue
    demand: dict[str, int] = {}
    for phases in tables:
        slack = len(phases) * max(p.seq_len for p in phases)
        for bucket, tokens in schedule_of(cfg, phases).bucket_tokens().items():
            if tokens > 0:
                demand[bucket] = max(demand.get(bucket, 0), math.ceil(tokens) + slack)
    return demand


# ---- on the data root ---------------------------------------------------------------------------


def definition_key(kind: str, name: str) -> str:
    return f"{DEFINITIONS_PREFIX}/{run_prefix(kind, name)}.json"


def write_definition(funnel_root: DataRoot, cfg: RefineryConfig, kind: str, name: str, budget: int,
                     bucket_tokens: dict[str, int]) -> dict[str, Any]:
    """Check that the run's table fits the funnel variant's tokens and store its curriculum; returns it."""
    phases = variant_phases(cfg, name, budget) if kind == SCHEDULE else anneal_phases(cfg, name, budget)
    check_fill(cfg, kind, name, phases, bucket_tokens)
    curriculum = curriculum_config(cfg, kind, name, budget)
    funnel_root.write_json(definition_key(kind, name), curriculum)
    return curriculum


def read_definition(funnel_root: DataRoot, kind: str, name: str) -> dict[str, Any]:
    key = definition_key(kind, name)
    if not funnel_root.exists(key):
        field = "ablations.schedules" if kind == SCHEDULE else "ablations.anneal_search.mixtures"
        raise ScheduleError(f"{field}.{name}: not written yet ({funnel_root.display(key)}); materialize its run first")
    return funnel_root.read_json(key)


def phases_of(curriculum: dict[str, Any]) -> list[ProxyPhase]:
    """The phase table of a written curriculum section (`curriculum_config`)."""
    return [ProxyPhase(p["name"], p["tokens"], p["seq_len"], p["lr_scale"], p["weights"], p["interpolation"],
                       p.get("quality_top_fraction"), p.get("quality_cut", "per_language"), p.get("rope_scaling"),
                       p.get("order"))
            for p in curriculum["phases"]]
