"""Schedule variants and the anneal mixture search of the ablations (docs/ablations.md, "Schedule
variants"): the curriculum itself compared, on the `funnel` variant's data, at equal tokens.

The checks here need the config alone (types, names); which phases and buckets a variant names, and
whether its weights sum to 1, are checked against the curriculum by the preflight
(refinery/ablations/schedules.py `schedule_problems`); whether the funnel variant's tokens can fill
a variant's mixture needs the data and is refused when its manifests are written.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from refinery.config.section import Section

# The built-in variants; a user variant names one of them as its `base` and patches its phases.
ScheduleBase = Literal["curriculum", "iid", "no_anneal", "no_length_warmup", "uniform_order"]
SCHEDULE_BASES = get_args(ScheduleBase)
# Schedule and mixture names become phase names (manifests/<phase>.json), so they follow the phase
# name's pattern; the double underscore that joins them to a phase name is refused inside one.
SCHEDULE_NAME = r"^[a-z0-9](?:[a-z0-9]|_(?!_))*$"


class PhasePatch(Section):
    """What a schedule variant changes in one phase of its base: a field left out keeps the base's."""

    weights: dict[str, float] | None = Field(default=None, description="The phase's bucket weights (summing to 1; "
                                             "the curriculum's temperature applies as to its own).")
    seq_len: int | None = Field(default=None, gt=0, description="The phase's seq_len in the curriculum's units "
                                "(scaled to the proxy's as the curriculum's are).")
    lr_scale: float | None = Field(default=None, gt=0.0, description="The phase's LR multiplier.")
    interpolation: float | None = Field(default=None, ge=0.0, lt=0.5, description="The share of the schedule "
                                        "blended from the previous mixture at the phase's start.")


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


