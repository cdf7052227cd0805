"""The Definitions that workspace.yaml loads: every asset group, job, schedule, sensor and resource.

The graph is built from the config named by REFINERY_CONFIG (default configs/demo.yaml), because
partition keys (input batches, buckets, phases) come from it. Each asset module contributes a
`build_definitions(cfg, partitions)`; this file only merges them. The config's preflight runs first
(refinery/preflight.py): a config with problems fails to load with one error that lists them all,
before any asset can run.
"""

from __future__ import annotations

import warnings

import dagster as dg

from assets import (ablation_schedules, ablations, contamination, curriculum, dedup, funnel, quality, report, tokens,
                    training)
from assets.partitions import Partitions
from assets.provenance import config_versioned
from orchestration import automation, schedules, sensors
from orchestration.resources import build_resources, config_path_from_env
from refinery import preflight

# The asset groups, then schedules and sensors: each contributes `build_definitions(cfg, partitions)`.
DEFINITION_MODULES = (funnel, contamination, curriculum, quality, tokens, dedup, training, report, ablations,
                      ablation_schedules, schedules, sensors, automation)


def build_definitions(config_path: str) -> dg.Definitions:
    cfg = preflight.require(config_path, preflight.DEFINITIONS)
    parts = Partitions.from_config(cfg)
    pieces = [module.build_definitions(cfg, parts) for module in DEFINITION_MODULES]
    merged = dg.Definitions.merge(*pieces, dg.Definitions(resources=build_resources(config_path)))
    # Each asset's code version also carries the config it reads, so a changed value makes it stale.
    with warnings.catch_warnings():  # Dagster 1.13 marks map_asset_specs preview
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return merged.map_asset_specs(func=config_versioned(cfg))


defs = build_definitions(config_path_from_env())
