"""Declarative automation (docs/automation.md): which asset carries which condition, and a new input
batch flowing from raw_documents to the phase manifests and scans, each asset once, training never.

The flow test runs no asset: it records materializations as runless events and asks Dagster's
evaluator, tick by tick, what the automation sensor would launch.
"""

from pathlib import Path

import dagster as dg
import pytest

from assets.partitions import INPUT_BATCHES
from orchestration.automation import SENSOR_NAME
from orchestration.definitions import build_definitions
from refinery.config import load_config
from refinery.documents import input_batches

from helpers.configs import demo_config, write_config
from helpers.materialize import in_memory_instance

PHASES = ["anneal", "main", "reasoning", "warmup"]
BATCH_STAGES = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "dedup_signatures"]


def write_demo_config(tmp_path: Path, dynamic: bool) -> Path:
    data = demo_config(tmp_path / "out")
    data["partitions"]["dynamic"] = dynamic
    return write_config(tmp_path, data)


def conditions(defs: dg.Definitions) -> dict[str, str | None]:
    graph = defs.resolve_asset_graph()
    return {key.to_user_string(): (graph.get(key).automation_condition.get_label()
                                   if graph.get(key).automation_condition else None)
            for key in graph.get_all_asset_keys()}


def test_every_asset_but_training_has_its_condition(tmp_path):
    defs = build_definitions(str(write_demo_config(tmp_path, dynamic=False)))
    assert conditions(defs) == {
        **{name: "eager" for name in [*BATCH_STAGES, "exact_deduped", "near_dup_clusters", "quality_scored",
                                      "pii_redacted", "funnel_report", "tokenized_shards", "shuffled_shards",
                                      "phase_manifests", "contamination_scan"]},
        "near_deduped": "eager after exact_deduped",
        "deduped": "eager after near_dup_clusters",
        "lineage_index": "eager after shuffled_shards",
        "tokenizer": "on_missing",
        "difficulty_model": "on_missing",  # like the tokenizer it is keyed to: built once, then reused
        "quality_model": "on_missing",
        "training_run": None,  # accelerator time, gated by the contamination checks: launched by a person
    }
    sensor = defs.get_sensor_def(SENSOR_NAME)
    assert isinstance(sensor, dg.AutomationConditionSensorDefinition)
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    targeted = sensor.asset_selection.resolve(defs.resolve_asset_graph())
    assert dg.AssetKey("training_run") not in targeted and dg.AssetKey("raw_documents") in targeted


def requested(result: dg.EvaluateAutomationConditionsResult, graph) -> dict[str, set]:
    return {key.to_user_string(): set(result.get_requested_partitions(key))
            for key in graph.get_all_asset_keys() if result.get_num_requested(key)}


@pytest.mark.slow
def test_a_new_input_batch_flows_to_the_manifests_and_scans_once(tmp_path):
    config = write_demo_config(tmp_path, dynamic=True)
    defs = build_definitions(str(config))
    graph = defs.resolve_asset_graph()
    *old, new = [b.key for b in input_batches(load_config(config))]
    with in_memory_instance(tmp_path / "never_materialized") as instance:
        instance.add_dynamic_partitions(INPUT_BATCHES, old)
        assert dg.evaluate_automation_conditions(defs=defs, instance=instance).total_requested == 0, \
            "a graph never materialized is left to the first backfill"
    with in_memory_instance(tmp_path / "as_the_demo_leaves_it") as instance:
        def record(name: str, partitions) -> None:
            for partition in partitions:
                instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=name, partition=partition))

        instance.add_dynamic_partitions(INPUT_BATCHES, old)
        for key in graph.toposorted_asset_keys:  # the graph as the demo leaves it
            pdef = graph.get(key).partitions_def
            record(key.to_user_string(), pdef.get_partition_keys(dynamic_partitions_store=instance) if pdef else [None])
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0, "a materialized graph launches nothing when the sensor starts"

        instance.add_dynamic_partitions(INPUT_BATCHES, [new])  # what input_batches_sensor does for new files
        cursor, ticks = first.cursor, []
        for _ in range(12):
            result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            cursor, launched = result.cursor, requested(result, graph)
            if not launched:
                break
            ticks.append(launched)
            for name, partitions in launched.items():  # the launched runs succeed
                record(name, partitions)

    batches, buckets = {*old, new}, {"web", "code", "math", "books", "wiki"}
    assert ticks == [
        {name: {new} for name in BATCH_STAGES},  # the new batch through the per-batch funnel, one run
        {"exact_deduped": {f"r{i:02d}-of-04" for i in range(4)}},  # dedup is global: every range,
        {"near_deduped": {f"b{i:02d}" for i in range(16)}},  # every band, after the ranges,
        {"near_dup_clusters": {None}},
        # every batch again, tokenized in the same run (same partitions)
        {name: batches for name in ("deduped", "quality_scored", "pii_redacted", "tokenized_shards")},
        {"shuffled_shards": buckets, "funnel_report": {None}},
        {"phase_manifests": set(PHASES), "contamination_scan": set(PHASES), "lineage_index": {None}},
    ]
