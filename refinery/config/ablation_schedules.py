"""Schedule variants and the anneal mixture search of the ablations (docs/ablations.md, "Schedule
variants"): the curriculum itself compared, on the `funnel` variant's data, at equal tokens.

The sections check types and names; `schedule_problems` (the preflight's, refinery/config/run.py)
checks the phases and buckets a variant names and its weights against the curriculum, the
seq_lens the proxy must scale, and that a table ordered by difficulty has scores to order by (the
`funnel` variant's documents are scored with the main graph's reference model only when
`stages.difficulty` is enabled); whether the funnel variant's tokens can fill a variant's mixture
needs the data and is refused when its manifests are written (refinery/ablations/schedules.py).
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from pydantic import Field

from refinery.config.curriculum import OrderConfig
from refinery.config.section import Section

# The built-in variants; a user variant names one of them as its `base` and patches its phases.
ScheduleBase = Literal["curriculum", "iid", "no_anneal", "no_length_warmup", "uniform_order"]
SCHEDULE_BASES = get_args(ScheduleBase)
# Schedule and mixture names become phase names (manifests/<phase>.json), so they follow the phase
# name's pattern; the double underscore that joins them to a phase name is refused inside one.
SCHEDULE_NAME = r"^[a-z0-9](?:[a-z0-9]|_(?!_))*$"
CURRICULUM = "curriculum"
# The built-ins that keep the curriculum's `order` (no_anneal's last phase takes main's); `iid` is a
# shuffle and `uniform_order` the curriculum without it.
ORDER_KEEPING_BASES = ("curriculum", "no_anneal", "no_length_warmup")
IID_PHASES = ("iid", "iid_decay")  # one mixture; the split only places the LR decay (refinery/ablations/schedules.py)
# As the curriculum's own (refinery/curriculum/schedule.py, which the config may not import): weights
# are typed by people, a sum within this of 1 is 1.
SUM_TOLERANCE = 1e-6


class PhasePatch(Section):
    """What a schedule variant changes in one phase of its base: a field left out keeps the base's."""

    weights: dict[str, float] | None = Field(default=None, description="The phase's bucket weights (summing to 1; "
                                             "the curriculum's temperature applies as to its own).")
    seq_len: int | None = Field(default=None, gt=0, description="The phase's seq_len in the curriculum's units "
                                "(scaled to the proxy's as the curriculum's are).")
    lr_scale: float | None = Field(default=None, gt=0.0, description="The phase's LR multiplier.")
    interpolation: float | None = Field(default=None, ge=0.0, lt=0.5, description="The share of the schedule "
                                        "blended from the previous mixture at the phase's start.")
    order: OrderConfig | None = Field(default=None, description="The phase's difficulty order within each bucket "
                                      "(as a curriculum phase's `order`); `uniform_order` is the base without any.")


class ScheduleVariantConfig(Section):
    """One schedule variant: a built-in (`base`, by default the variant's own name when it is one)
    with optional `phases` patches (phase name -> fields)."""

    base: ScheduleBase | None = Field(
        default=None, description="The built-in it starts from; none: the variant's name, which must be one.")
    phases: dict[str, PhasePatch] = Field(default_factory=dict, description="Phase name (of the curriculum, or "
                                          "`iid` for an iid base) -> what the variant changes in it.")


class AnnealSearchConfig(Section):
    """Anneal mixtures branched from the pre-anneal boundary checkpoint of each seed's `curriculum`
    schedule run: each trains only the last phase, with its own weights."""

    mixtures: dict[str, dict[str, float]] = Field(min_length=1, description="Name -> the last phase's bucket "
                                                  "weights (summing to 1).")


def base_of(name: str, spec: ScheduleVariantConfig) -> str:
    return spec.base or name


def _weights_problems(cfg: Any, field: str, weights: dict[str, float]) -> list[str]:
    problems = [f"{field}.{b}: unknown bucket {b!r}; use one of {sorted(cfg.buckets)}" for b in weights
                if b not in cfg.buckets]
    if any(w < 0 for w in weights.values()):
        problems.append(f"{field}: weights must be non-negative, got {weights}")
    elif abs(sum(weights.values()) - 1.0) > SUM_TOLERANCE:
        problems.append(f"{field}: the weights sum to {sum(weights.values()):.6g}, not 1; give each bucket its "
                        f"fraction of the phase's tokens")
    return problems


def _seq_len_problem(cfg: Any, field: str, seq_len: int) -> str | None:
    assert cfg.curriculum is not None and cfg.ablations is not None
    longest = max(p.seq_len for p in cfg.curriculum.phases)
    window = cfg.ablations.seq_len
    if seq_len > longest:
        return (f"{field}: {seq_len} is longer than the curriculum's longest phase ({longest}), which the proxy's "
                f"window ablations.seq_len ({window}) stands for; give at most {longest}")
    scaled, rest = divmod(seq_len * window, longest)
    if rest or scaled == 0 or window % scaled:
        return (f"{field}: {seq_len} scales to {seq_len * window / longest:g} proxy tokens (x ablations.seq_len "
                f"{window} / the longest phase's {longest}), not a whole divisor of {window}; give a seq_len whose "
                f"ratio to {longest} is 1/2^k")
    return None


def schedule_problems(cfg: Any) -> list[str]:
    """`ablations.schedules` and `ablations.anneal_search` fields that name phases or buckets that do
    not exist, weights that do not sum to 1, seq_lens the proxy cannot scale, or a curriculum the
    proxy cannot run."""
    ab = cfg.ablations
    assert ab is not None
    if not ab.schedules and ab.anneal_search is None:
        return []
    cur = cfg.curriculum
    if cur is None:
        return ["ablations.schedules: schedule variants scale the config's curriculum, and it has none; declare "
                "`curriculum:` with its phases"]
    problems: list[str] = []
    names = [p.name for p in cur.phases]
    for i, p in enumerate(cur.phases):
        problem = _seq_len_problem(cfg, f"curriculum.phases[{i}].seq_len ({p.name})", p.seq_len)
        problems += [problem] if problem else []
    ordered = [p.name for p in cur.phases if p.order is not None]
    for name, spec in ab.schedules.items():
        field = f"ablations.schedules.{name}"
        if not re.match(SCHEDULE_NAME, name):
            problems.append(f"{field}: the name becomes part of phase names; use lowercase letters, digits and single "
                            f"'_', starting with a letter or digit")
        base = base_of(name, spec)
        if base not in SCHEDULE_BASES:
            problems.append(f"{field}.base: {name!r} is no built-in schedule ({', '.join(SCHEDULE_BASES)}); give "
                            f"`base:` one of them")
            continue
        if base == "uniform_order" and not ordered and not spec.phases:
            problems.append(f"{field}: no curriculum phase has an `order`, so it trains what `curriculum` trains; "
                            f"remove it")
        orders = ordered if base in ORDER_KEEPING_BASES else []
        orders = orders + [p for p, patch in spec.phases.items() if patch.order is not None and p not in orders]
        if orders and not cfg.stages.difficulty.enabled:
            problems.append(f"{field}: phases {orders} order by difficulty, and the `funnel` variant's documents are "
                            f"scored by the main graph's difficulty model only when it has one; set "
                            f"stages.difficulty.enabled: true")
        known = list(IID_PHASES) if base == "iid" else names
        if base == "iid" and len(cur.phases) == 1:
            known = known[:1]
        for phase, patch in spec.phases.items():
            pfield = f"{field}.phases.{phase}"
            if phase not in known:
                problems.append(f"{pfield}: no phase {phase!r} in the {base} table; use one of {known}")
                continue
            if patch.weights is not None:
                problems += _weights_problems(cfg, f"{pfield}.weights", patch.weights)
            if patch.seq_len is not None:
                problem = _seq_len_problem(cfg, f"{pfield}.seq_len", patch.seq_len)
                problems += [problem] if problem else []
    if ab.anneal_search is not None:
        if CURRICULUM not in ab.schedules:
            problems.append("ablations.anneal_search: every mixture branches from the `curriculum` schedule run; add "
                            "`curriculum: {}` to ablations.schedules")
        if len(cur.phases) < 2:
            problems.append("ablations.anneal_search: the curriculum has one phase, so there is no pre-anneal "
                            "checkpoint to branch from; give it at least two phases")
        for mixture, weights in ab.anneal_search.mixtures.items():
            field = f"ablations.anneal_search.mixtures.{mixture}"
            if not re.match(SCHEDULE_NAME, mixture):
                problems.append(f"{field}: the name becomes part of a phase name; use lowercase letters, digits and "
                                f"single '_', starting with a letter or digit")
            problems += _weights_problems(cfg, field, weights)
    return problems
