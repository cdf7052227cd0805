"""`refinery demo --changed` names what changed (issue 51): after a threshold edit the plan names the
config field with its old and new values, and `--until phase_manifests` materializes every data step
and nothing of the training group, saying what it leaves stale past it."""

import dagster as dg
import pytest
import yaml

from orchestration.changed import CODE_CHANGED, stale_plan
from orchestration.definitions import build_definitions
from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph, run_changed, until_selection

from helpers.materialize import in_memory_instance
from helpers.tiny_graph import tiny_graph_config, write_pages

pytestmark = pytest.mark.slow
FIELD = "stages.heuristic.gopher_quality.min_words"


def test_a_threshold_edit_is_named_and_until_stops_before_training(tmp_path):
    write_pages(tmp_path / "in", files=2)
    config = tiny_graph_config(tmp_path, tmp_path / "in", tmp_path / "out")
    defs = build_definitions(str(config))
    selection = until_selection(defs, "phase_manifests")
    assert dg.AssetKey("tokenized_shards") in selection and dg.AssetKey("training_run") not in selection
    with in_memory_instance(tmp_path / "dagster") as instance:
        materialize_graph(defs, instance, selection, log=lambda line: None, run_config=QUIET_RUN_CONFIG)
        assert instance.get_materialized_partitions(dg.AssetKey("phase_manifests")) == {"warmup", "main"}
        assert not instance.get_materialized_partitions(dg.AssetKey("training_run"))

        data = yaml.safe_load(config.read_text())
        data["stages"]["heuristic"] = {"gopher_quality": {"min_words": 30}}
        config.write_text(yaml.safe_dump(data))
        defs = build_definitions(str(config))
        plan = {p.key.to_user_string(): p for p in stale_plan(defs, instance, selection)}
        heuristic = plan["heuristic_filtered"]
        assert list(heuristic.reasons) == [CODE_CHANGED]
        assert f"{FIELD} 50 -> 30" in heuristic.details
        assert f"{FIELD} 50 -> 30" in heuristic.line()
        assert "raw_documents" not in plan and "training_run" not in plan

        lines: list[str] = []
        run_changed(defs, instance, log=lines.append, run_config=QUIET_RUN_CONFIG, selection=selection)
        left = lines[lines.index(next(x for x in lines if x.startswith("Left stale past --until"))) + 1:]
        assert any(x.startswith("  training_run:") for x in left)
        assert any(x.startswith("  contamination_scan:") for x in left)
        assert not instance.get_materialized_partitions(dg.AssetKey("training_run"))
        assert not stale_plan(defs, instance, selection)  # everything up to the manifests is fresh again
