"""Partition definitions, all derived from the config so keys are stable for a given config.

The per-document stages are partitioned by input batch (`partitions:` in the config, see
refinery/documents/inputs.py:batch_key). Static batch keys are read from the input files when the
definitions load; dynamic ones (`partitions.dynamic: true`) live in the Dagster instance, where
`register_input_batches` (the demo) and the `input_batches_sensor` (orchestration/sensors.py) add
the keys of new input.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import dagster as dg

from refinery.config import RefineryConfig
from refinery.documents import input_batches

# Dagster marks `backfill_policy` beta; every per-batch asset sets it, and the warning would
# repeat for each of them whenever the definitions load.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)

INPUT_BATCHES = "input_batches"  # the DynamicPartitionsDefinition's name in the instance


@dataclass(frozen=True)
class Partitions:
    input_batches: dg.PartitionsDefinition  # a batch of input files (one file with partitions.by: file)
    buckets: dg.StaticPartitionsDefinition  # web, code, math, ...
    phases: dg.StaticPartitionsDefinition | None  # curriculum phases, when a curriculum is declared
    batch_backfill: dg.BackfillPolicy  # how a backfill splits the input batches into runs
    split_backfill: dg.BackfillPolicy  # the same for hash ranges and LSH bands
    ablation_variants: dg.StaticPartitionsDefinition | None = None  # the `ablations` section's variants
    ablation_runs: dg.MultiPartitionsDefinition | None = None  # variant x seed


    @classmethod
    def from_config(cls, cfg: RefineryConfig) -> "Partitions":
        phases = (
            dg.StaticPartitionsDefinition([p.name for p in cfg.curriculum.phases]) if cfg.curriculum else None
        )
        return cls(
            input_batches=_input_batches_definition(cfg),
            buckets=dg.StaticPartitionsDefinition(list(cfg.buckets)),
            phases=phases,
            batch_backfill=_backfill_policy(cfg.partitions.batches_per_run),
            split_backfill=_backfill_policy(None if cfg.partitions.batches_per_run is None else 1),
            **_ablation_definitions(cfg),
        )


def _ablation_definitions(cfg: RefineryConfig) -> dict[str, dg.PartitionsDefinition]:
    """The ablation assets' partitions: one per variant, and one per variant and seed (`0` .. `seeds - 1`)."""
    if cfg.ablations is None:
        return {}
    variants = dg.StaticPartitionsDefinition(list(cfg.ablations.variants))
    seeds = dg.StaticPartitionsDefinition([str(s) for s in range(cfg.ablations.seeds)])
    return {"ablation_variants": variants,
            "ablation_runs": dg.MultiPartitionsDefinition({"variant": variants, "seed": seeds})}


def _backfill_policy(partitions_per_run: int | None) -> dg.BackfillPolicy:
    if partitions_per_run is None:
        return dg.BackfillPolicy.single_run()
    return dg.BackfillPolicy.multi_run(max_partitions_per_run=partitions_per_run)


def _input_batches_definition(cfg: RefineryConfig) -> dg.PartitionsDefinition:
    if cfg.partitions.dynamic:
        return dg.DynamicPartitionsDefinition(name=INPUT_BATCHES)
    # Dagster needs at least one key; an empty input set is reported by raw_documents.
    return dg.StaticPartitionsDefinition([b.key for b in input_batches(cfg)] or ["no-input-files"])


def unregistered_batches(cfg: RefineryConfig, instance: dg.DynamicPartitionsStore) -> list[str]:
    """Batch keys of the current input that the instance does not hold yet, in input order."""
    known = set(instance.get_dynamic_partitions(INPUT_BATCHES))
    return [b.key for b in input_batches(cfg) if b.key not in known]


def register_input_batches(cfg: RefineryConfig, instance: dg.DagsterInstance) -> int:
    """Add the new batch keys to the instance, `partitions.register_chunk` at a time (one large
    insert is what makes SQLite fail at tens of thousands of keys); returns how many were added."""
    new = unregistered_batches(cfg, instance)
    for chunk in chunked(new, cfg.partitions.register_chunk):
        instance.add_dynamic_partitions(INPUT_BATCHES, chunk)
    return len(new)


def chunked(keys: list[str], size: int) -> list[list[str]]:
    """`keys` in requests of at most `size` (`partitions.register_chunk`)."""
    return [keys[i : i + size] for i in range(0, len(keys), size)]
