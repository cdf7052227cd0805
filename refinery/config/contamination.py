"""The contamination gate: eval sets whose text must not leak into a phase's training data."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from refinery.config.section import Section


class EvalSetConfig(Section):
    """One eval set whose text must not leak into training data."""

    name: str
    path: str  # JSONL of {"id": ..., "text": ...}, relative to the config file


class ContaminationConfig(Section):
    """The contamination gate: every phase's manifest documents are scanned for word n-grams of the eval
    sets before that phase may train (docs/curriculum.md). With no eval set a phase is "not scanned":
    the `contamination_below_limit` check warns (it does not block training) and `refinery scan` exits 1."""

    eval_sets: list[EvalSetConfig] = Field(default_factory=list)
    ngram: int = Field(default=13, ge=3)
    max_contaminated_docs: int = Field(default=0, ge=0)
    # "none": report and block; "drop": remove contaminated documents and rebuild the phase's manifest.
    policy: Literal["none", "drop"] = "none"
    rescan_cron: str = "0 */6 * * *"
    sensor_steps_before_anneal: int = Field(default=20, ge=0)
    anneal_phase: str | None = None  # default: the curriculum's last phase
