"""The curriculum as data: phases over a token budget, checked before any compute and pinned in
per-phase manifests.

schedule.py holds the schedule maths (phase spans, blended mixtures, seq_len, the LR shape) and the
one builder of phase spans; inventory.py reads what the final shards hold per bucket, and
quality_cut.py what a quality cutoff keeps of it; bands.py cuts an ordered phase's entries into difficulty bands and
writes the band files; contract.py is the validation contract `refinery validate` prints;
manifests.py writes and reads the phase manifests and checks the config against them;
phase_fields.py declares the per-phase fields once, for the config, the schedule and the manifests.
"""

from refinery.curriculum.contract import (CurriculumMismatch, Finding, ValidationReport, contract, refuse_invalid,
                                          structure_findings, validate, validate_data_root)
from refinery.curriculum.inventory import BucketInventory, CountedTasks, ShardRef, has_final_shards, read_bucket_inventory, read_inventory
from refinery.curriculum.quality_cut import QualitySelection, phase_selections, select_top_quality
from refinery.curriculum.manifests import MANIFEST_VERSION, BucketSlice, ManifestError, PhaseManifest, apply_exclusions, build_phase_manifest, drawn_buckets, manifest_differences, read_manifest, read_selection, refuse_mismatch, schedule_from_manifests, selection_npy, stored_manifests, write_manifest
from refinery.curriculum.phase_fields import PHASE_FIELDS, WEIGHT_TOLERANCE, PhaseField
from refinery.curriculum.schedule import (SUM_TOLERANCE, CurriculumError, PhasePlan, PhaseSpan, Schedule,
                                          apply_temperature, batch_tokens, build_schedule, phase_budgets, phase_kind,
                                          place_phases, warmup_tokens)

__all__ = [
    "MANIFEST_VERSION", "PHASE_FIELDS", "SUM_TOLERANCE", "WEIGHT_TOLERANCE",
    "BucketInventory", "BucketSlice", "CountedTasks", "CurriculumError", "CurriculumMismatch", "Finding", "ManifestError",
    "PhaseField", "PhaseManifest", "PhasePlan", "PhaseSpan", "QualitySelection", "Schedule", "ShardRef", "ValidationReport",
    "apply_exclusions", "apply_temperature", "batch_tokens", "build_phase_manifest", "build_schedule", "contract", "drawn_buckets",
    "has_final_shards", "manifest_differences", "phase_budgets", "phase_kind",
    "phase_selections", "place_phases", "read_bucket_inventory", "read_inventory", "read_manifest", "read_selection",
    "refuse_invalid", "refuse_mismatch", "schedule_from_manifests", "select_top_quality", 
    "selection_npy", "stored_manifests", "structure_findings", "validate", "validate_data_root", "warmup_tokens",
    "write_manifest",
]
