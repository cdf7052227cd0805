"""The per-phase fields of a curriculum, declared once.

A phase field lives in up to four records: the config (`PhaseConfig`), the schedule (`PhasePlan`,
and the `PhaseSpan` placed from it), the phase manifest (`PhaseManifest`) and, built from the
manifests alone, the trainer's schedule (training/schedule.py). `PHASE_FIELDS` says for each field
which records carry it and how a config and a manifest compare on it. The schedule's builders copy
what it names, the manifest builder pins what it names, and `phase_differences` (what
`refuse_mismatch` refuses on) iterates it: a field added here is carried and compared with no other
list to edit. tests/test_phase_fields.py holds the records to it.

This module sits at the bottom of refinery/curriculum/ (it imports only the config), so the
schedule, the contract and the manifests can all read it without a cycle; the span and the manifest
it reads are passed in, not imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import ValidationError

from refinery.config import PhaseConfig, RopeScalingConfig

# Weights in a manifest went through JSON and the temperature; a difference below this is rounding.
WEIGHT_TOLERANCE = 1e-9

PLAN, SPAN = "plan", "span"


def rope_scaling_spec(declared: Any) -> str | dict[str, Any] | None:
    """A phase's `rope_scaling` as the manifest stores it: the string, None, or every YaRN field
    (defaults included, so a config and a manifest compare field by field). Raises
    pydantic.ValidationError on YaRN fields the config schema refuses."""
    if isinstance(declared, dict):
        declared = RopeScalingConfig.model_validate(declared)
    return declared.model_dump(mode="json") if isinstance(declared, RopeScalingConfig) else declared


def order_spec(order: Any) -> dict[str, Any] | None:
    """A phase's `order` (an OrderConfig, or a manifest's dict) as the fields a config and a manifest
    compare: by, direction, bands; None = uniform."""
    if order is None:
        return None
    fields = order.model_dump(mode="json") if hasattr(order, "model_dump") else order
    return {k: fields[k] for k in ("by", "direction", "bands")}


def unequal(field: "PhaseField", where: str, phase: PhaseConfig, ours: Any, theirs: Any) -> list[str]:
    """The comparison of most fields: the config's value as pinned against the manifest's."""
    return [] if ours == theirs else [f"{where}.{field.name}: the config says {ours}, the manifest {theirs}"]


def budget_differs(field: "PhaseField", where: str, phase: PhaseConfig, ours: Any, theirs: Any) -> list[str]:
    given = "tokens" if phase.tokens is not None else "share"
    return [] if ours == theirs else [f"{where}.{given}: the config gives {ours:,} tokens, the manifest {theirs:,}"]


def weights_differ(field: "PhaseField", where: str, phase: PhaseConfig, ours: Any, theirs: Any) -> list[str]:
    """Per bucket of the schedule, after temperature, within WEIGHT_TOLERANCE."""
    return [f"{where}.weights.{b}: the config gives {w:.6g} (after temperature), the manifest {theirs.get(b, 0.0):.6g}"
            for b, w in ours.items() if abs(w - theirs.get(b, 0.0)) > WEIGHT_TOLERANCE]


def cut_differs(field: "PhaseField", where: str, phase: PhaseConfig, ours: Any, theirs: Any) -> list[str]:
    if ours == theirs:
        return []
    return [f"{where}.quality_top_fraction: the config says {phase.quality_top_fraction}, the manifest "
            f"{'has' if theirs else 'has no'} quality cutoff"]


def ranking_differs(field: "PhaseField", where: str, phase: PhaseConfig, ours: Any, theirs: Any) -> list[str]:
    """How a cut ranks, where both have a cut (a cut on one side only is quality_top_fraction's difference)."""
    if ours is None or theirs is None or ours == theirs:
        return []
    return [f"{where}.quality_cut: the config says {ours}, the manifest's cut is {theirs}"]


def stored_ranking(manifest: Any) -> str | None:
    """How the manifest's quality cut ranked: a per-language cut pins each language's cutoff
    (BucketSlice.quality_cutoffs), a global one only the bucket's; None without a cut."""
    cut = [b for b in manifest.buckets.values() if b.quality_cutoff is not None]
    if not cut:
        return None
    return "per_language" if any(b.quality_cutoffs is not None for b in cut) else "global"


def stored_rope_scaling(manifest: Any) -> Any:
    """The manifest's rope_scaling as the config's would be pinned; as written when the schema refuses it."""
    try:
        return rope_scaling_spec(manifest.rope_scaling)
    except ValidationError:
        return manifest.rope_scaling


@dataclass(frozen=True)
class PhaseField:
    """One field of a curriculum phase.

    `name` is PhaseConfig's attribute (and the schedule's, in the records `schedule` lists: PLAN,
    SPAN). `manifest` is PhaseManifest's attribute that pins it as `pin` gives it (None: the manifest
    shows it another way, read by `stored`). `pin(phase, span, buckets)` is the config's value as
    the manifest holds it (default: the attribute as is); `stored(manifest)` the manifest's value
    to compare (default: its `manifest` attribute); `compare` says what differs, one sentence per
    difference. `given_by` names the
    config attributes it is given by when they are not `name` alone; `derived`: the schedule computes
    its plan's value from the config (the budget, the weights after temperature) instead of copying it;
    `with_files`: the manifest's attribute is written with the files it names by a builder of its own
    (manifests.order_manifest: the band files), not by `manifest_fields`."""

    name: str
    schedule: tuple[str, ...] = ()
    manifest: str | None = None
    pin: Callable[[PhaseConfig, Any, tuple[str, ...]], Any] | None = None
    stored: Callable[[Any], Any] | None = None
    compare: Callable[["PhaseField", str, PhaseConfig, Any, Any], list[str]] = unequal
    given_by: tuple[str, ...] = ()
    derived: bool = False
    with_files: bool = False

    @property
    def config_fields(self) -> tuple[str, ...]:
        return self.given_by or (self.name,)

    def pinned(self, phase: PhaseConfig, span: Any, buckets: tuple[str, ...]) -> Any:
        return getattr(phase, self.name) if self.pin is None else self.pin(phase, span, buckets)

    def read(self, manifest: Any) -> Any:
        return getattr(manifest, self.manifest or self.name) if self.stored is None else self.stored(manifest)


PHASE_FIELDS: tuple[PhaseField, ...] = (
    PhaseField("name", (PLAN, SPAN), manifest="phase"),
    PhaseField("tokens", (PLAN,), manifest="token_budget", given_by=("share", "tokens"), derived=True,
               pin=lambda phase, span, buckets: span.tokens, compare=budget_differs),
    PhaseField("seq_len", (PLAN, SPAN), manifest="seq_len"),
    PhaseField("lr_scale", (PLAN, SPAN), manifest="lr_scale"),
    PhaseField("interpolation", (PLAN,), manifest="interpolation"),
    PhaseField("rope_scaling", manifest="rope_scaling", pin=lambda phase, span, buckets: rope_scaling_spec(phase.rope_scaling),
               stored=stored_rope_scaling),
    PhaseField("weights", (PLAN, SPAN), manifest="weights", compare=weights_differ, derived=True,
               pin=lambda phase, span, buckets: {b: float(w) for b, w in zip(buckets, span.weights)}),
    # The manifest pins an order with its band files; its spec is compared.
    PhaseField("order", manifest="order", with_files=True, pin=lambda phase, span, buckets: order_spec(phase.order),
               stored=lambda manifest: order_spec(manifest.order)),
    # A cut shows in the manifest as its buckets' quality cutoffs (and their kept selections).
    PhaseField("quality_top_fraction", (PLAN, SPAN), compare=cut_differs,
               pin=lambda phase, span, buckets: phase.quality_top_fraction is not None,
               stored=lambda manifest: any(b.quality_cutoff is not None for b in manifest.buckets.values())),
    PhaseField("quality_cut", compare=ranking_differs, stored=stored_ranking,
               pin=lambda phase, span, buckets: phase.quality_cut if phase.quality_top_fraction is not None else None),
)


def schedule_fields(record: str) -> list[PhaseField]:
    """The fields `record` (PLAN or SPAN) carries under their config name."""
    return [f for f in PHASE_FIELDS if record in f.schedule]


def manifest_fields(phase: PhaseConfig, span: Any, buckets: tuple[str, ...]) -> dict[str, Any]:
    """PhaseManifest's attributes that pin the phase's fields, as the manifest builder writes them."""
    return {f.manifest: f.pinned(phase, span, buckets) for f in PHASE_FIELDS if f.manifest is not None and not f.with_files}


def phase_differences(where: str, phase: PhaseConfig, span: Any, buckets: tuple[str, ...], manifest: Any) -> list[str]:
    """What differs between a config phase (placed as `span` on a schedule over `buckets`) and its
    manifest, field by field of PHASE_FIELDS."""
    return [line for f in PHASE_FIELDS
            for line in f.compare(f, where, phase, f.pinned(phase, span, buckets), f.read(manifest))]
