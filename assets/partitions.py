"""Partition definitions, all derived from the config so keys are stable for a given config."""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from refinery.config import RefineryConfig
from refinery.documents import input_shards


@dataclass(frozen=True)
class Partitions:
    input_shards: dg.StaticPartitionsDefinition  # one per input file
    buckets: dg.StaticPartitionsDefinition  # web, code, math, ...
    phases: dg.StaticPartitionsDefinition | None  # curriculum phases, when a curriculum is declared

    @classmethod
    def from_config(cls, cfg: RefineryConfig) -> "Partitions":
        shards = [s.key for s in input_shards(cfg)]
        if not shards:
            # Dagster needs at least one key; an empty input set is reported by raw_documents.
            shards = ["no-input-files"]
        phases = (
            dg.StaticPartitionsDefinition([p.name for p in cfg.curriculum.phases]) if cfg.curriculum else None
        )
        return cls(
            input_shards=dg.StaticPartitionsDefinition(shards),
            buckets=dg.StaticPartitionsDefinition(list(cfg.buckets)),
            phases=phases,
        )
