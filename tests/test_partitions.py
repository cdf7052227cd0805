"""Input batches: stable keys, the per-file outputs they keep, the fan-out pool, dynamic
registration, and how few runs the demo's plan makes."""

import base64
import json
import re
from pathlib import Path

import dagster as dg
import pytest

from assets.partitions import INPUT_BATCHES, Partitions, register_input_batches
from assets.quality import funnel_chart_metadata
from orchestration.definitions import build_definitions
from orchestration.demo import QUIET_RUN_CONFIG, execution_plan, materialize_graph
from refinery.config import ConfigError, load_config
from refinery.documents import input_batches, input_shards
from refinery.layout import documents_key, kept_documents_key, rejects_key, stats_key
from refinery.reports.funnel import files_stage_stats, funnel_chart_png
from refinery.storage import LocalDataRoot

from helpers import configs
from helpers.texts import PROSE

REPO = Path(__file__).resolve().parents[1]
FUNNEL = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered"]


def write_files(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        lines = [json.dumps({"text": f"Story {i}.{j}. {PROSE}", "url": f"https://{name}.example/{j}"})
                 for j in range(3)]
        (folder / f"{name}.jsonl").write_text("\n".join(lines + ["{broken"]) + "\n")


def write_config(tmp_path: Path, partitions: dict, name: str = "refinery.yaml", web: str = "web/*.jsonl",
                 code: bool = True) -> Path:
    config = {
        "seed": 1,
        "data_root": f"out-{name.split('.')[0]}",
        "buckets": ["web", "code"],
        "sources": [
            {"name": "web", "path": web, "format": "jsonl", "bucket": "web"},
            {"name": "code", "path": "code/*.jsonl", "format": "jsonl", "bucket": "code",
             "skip": ["language", "heuristic"]},
        ][: 2 if code else 1],
        "partitions": partitions,
        "stages": {"quality": {"enabled": False}},  # the funnel alone: no curated bucket to train a classifier
    }
    return configs.write_config(tmp_path, config, name)


def batches_of(config: Path) -> dict[str, list[str]]:
    return {b.key: [s.key for s in b.shards] for b in input_batches(load_config(config))}


# ---- keys --------------------------------------------------------------------------------------------


def test_by_file_keeps_one_partition_per_input_file(tmp_path):
    write_files(tmp_path / "web", ["a", "b"])
    write_files(tmp_path / "code", ["c"])
    config = write_config(tmp_path, {})
    assert batches_of(config) == {"web-a": ["web-a"], "web-b": ["web-b"], "code-c": ["code-c"]}


def test_hash_batches_never_move_a_file_when_input_is_added(tmp_path):
    write_files(tmp_path / "web", [f"f{i:03d}" for i in range(40)])
    write_files(tmp_path / "code", ["c0"])
    config = write_config(tmp_path, {"by": "hash", "count": 4})
    before = batches_of(config)
    assert {k for k in before if k.startswith("web-")} == {"web-b0", "web-b1", "web-b2", "web-b3"}
    assert len([k for k in before if k.startswith("code-")]) == 1
    assert sorted(f for files in before.values() for f in files) == sorted(s.key for s in input_shards(load_config(config)))
    assert all(len(files) >= 4 for key, files in before.items() if key.startswith("web")), before

    # New files sorted before, between and after the old ones: no old file changes batch.
    write_files(tmp_path / "web", ["a000", "f0205", "zzz"] + [f"g{i:03d}" for i in range(20)])
    after = batches_of(config)
    batch_of = {f: key for key, files in after.items() for f in files}
    for key, files in before.items():
        assert all(batch_of[f] == key for f in files), key
    assert sum(map(len, after.values())) == sum(map(len, before.values())) + 23


def test_snapshot_pattern_makes_new_crawls_new_batches(tmp_path):
    write_files(tmp_path / "web" / "CC-MAIN-2024-10", ["x0", "x1", "x2"])
    config = write_config(tmp_path, {"by": "hash", "count": 2, "snapshot_pattern": r"(CC-MAIN-\d{4}-\d{2})"},
                          web="web/*/*.jsonl")
    first = batches_of(config)
    assert first and all(k.startswith("web-CC-MAIN-2024-10-b") for k in first)
    write_files(tmp_path / "web" / "CC-MAIN-2024-18", ["y0", "y1"])
    second = batches_of(config)
    assert {k: v for k, v in second.items() if k in first} == first, "the old crawl's batches are unchanged"
    assert {k for k in second if k not in first} <= {"web-CC-MAIN-2024-18-b0", "web-CC-MAIN-2024-18-b1"}
    assert sum(len(v) for k, v in second.items() if k not in first) == 2


def test_a_pattern_without_one_capture_group_is_a_config_error(tmp_path):
    write_files(tmp_path / "web", ["a"])
    with pytest.raises(ConfigError, match=r"partitions.snapshot_pattern: .*exactly one capture group"):
        load_config(write_config(tmp_path, {"by": "hash", "snapshot_pattern": "CC-MAIN"}))
    with pytest.raises(ConfigError, match=r"partitions.snapshot_pattern: not a regular expression"):
        load_config(write_config(tmp_path, {"by": "hash", "snapshot_pattern": "(CC"}))


# ---- runs --------------------------------------------------------------------------------------------


def outputs(config: Path) -> dict[str, str]:
    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    return {k: root.sha256(k) for kind in ("documents", "attributes", "rejects") for k in root.list(kind)}


def run_funnel(config: Path) -> int:
    with dg.DagsterInstance.ephemeral() as instance:
        return materialize_graph(build_definitions(str(config)), instance, [dg.AssetKey(k) for k in FUNNEL],
                                 log=lambda _: None, run_config=QUIET_RUN_CONFIG)


def test_one_run_over_every_batch_writes_the_same_per_file_bytes_as_runs_per_file(tmp_path):
    write_files(tmp_path / "web", ["a", "b", "c"])
    write_files(tmp_path / "code", ["d", "e"])
    per_file = write_config(tmp_path, {"batches_per_run": 1}, "per_file.yaml")
    batched = write_config(tmp_path, {"by": "hash", "count": 2}, "batched.yaml")
    assert run_funnel(per_file) == len(FUNNEL) * 5, "one run per asset and input file"
    assert run_funnel(batched) == 1, "every batch of the funnel in one run"
    files = [s.key for s in input_shards(load_config(batched))]
    expected = {k for f in files for name in FUNNEL for k in (kept_documents_key(name, f), rejects_key(name, f))}
    assert set(outputs(batched)) == expected
    assert outputs(batched) == outputs(per_file)
    root = LocalDataRoot(tmp_path / "out-batched")
    rejected = sum(root.read_json(stats_key("raw_documents", f))["dropped"].get("ingest/bad_json", 0) for f in files)
    assert rejected == 5, "rejects and stats stay per file: one broken line in each"

    # One funnel chart for a run over many files: the files' stats merged per stage, drawn once.
    merged = files_stage_stats(root, files)
    assert [st.stage for st in merged] == FUNNEL
    assert merged[0].docs_in == sum(root.read_json(stats_key("raw_documents", f))["docs_in"] for f in files) == 20
    chart = funnel_chart_metadata(root, files)["funnel_chart"].value
    png = base64.b64decode(re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", chart).group(1))
    assert png == funnel_chart_png(merged, "funnel of 5 input files")


def test_each_batch_of_a_run_over_many_carries_its_own_numbers(tmp_path):
    """One run over every batch: each batch's materialization has its own files' counts, input file
    count and content hashes, not the run's (issue 25's per-partition truth)."""
    write_files(tmp_path / "web", ["a", "b", "c", "d", "e"])
    config = write_config(tmp_path, {"by": "hash", "count": 3}, code=False)
    batches = batches_of(config)
    assert len(batches) >= 2
    root = LocalDataRoot(tmp_path / "out-refinery")
    with dg.DagsterInstance.ephemeral() as instance:
        assert materialize_graph(build_definitions(str(config)), instance, [dg.AssetKey(k) for k in FUNNEL],
                                 log=lambda _: None, run_config=QUIET_RUN_CONFIG) == 1
        for name in FUNNEL:
            for key, files in batches.items():
                records = instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), asset_partitions=[key]), limit=1).records
                md = {k: v.value for k, v in records[0].asset_materialization.metadata.items()}
                assert md["input_files"] == len(files), (name, key)
                assert md["docs_in"] == sum(root.read_json(stats_key(name, f))["docs_in"] for f in files), (name, key)
                assert set(md["content_hashes"]) == {k for f in files for k in (kept_documents_key(name, f),
                                                                                 rejects_key(name, f))}


@pytest.mark.slow
def test_a_worker_pool_writes_the_same_bytes_as_one_process(tmp_path):
    write_files(tmp_path / "web", ["a", "b", "c", "d"])
    one = write_config(tmp_path, {"by": "hash", "count": 1, "workers": 1}, "one.yaml", code=False)
    pool = write_config(tmp_path, {"by": "hash", "count": 1, "workers": 2}, "pool.yaml", code=False)
    run_funnel(one)
    run_funnel(pool)
    assert outputs(pool) == outputs(one) and len(outputs(one)) == 4 * len(FUNNEL) * 2


def test_dynamic_batches_are_registered_in_chunks_and_only_once(tmp_path):
    write_files(tmp_path / "web", [f"f{i}" for i in range(12)])
    config = write_config(tmp_path, {"by": "hash", "count": 5, "dynamic": True, "register_chunk": 2})
    cfg = load_config(config)
    defs = build_definitions(str(config))
    assert isinstance(Partitions.from_config(cfg).input_batches, dg.DynamicPartitionsDefinition)
    sensor = defs.resolve_sensor_def("input_batches_sensor")
    with dg.DagsterInstance.ephemeral() as instance:
        with dg.build_sensor_context(instance=instance, resources=defs.resources) as context:
            requests = sensor(context).dynamic_partitions_requests
        keys = [b.key for b in input_batches(cfg)]
        assert [len(r.partition_keys) for r in requests] == [2] * (len(keys) // 2) + [1] * (len(keys) % 2)
        assert [k for r in requests for k in r.partition_keys] == keys
        assert register_input_batches(cfg, instance) == len(keys)
        assert instance.get_dynamic_partitions(INPUT_BATCHES) == keys
        with dg.build_sensor_context(instance=instance, resources=defs.resources) as context:
            assert isinstance(sensor(context), dg.SkipReason)
        write_files(tmp_path / "web", ["new"])
        assert register_input_batches(load_config(config), instance) <= 1
        assert len(instance.get_dynamic_partitions(INPUT_BATCHES)) == len(input_batches(load_config(config)))

        # The registered keys are what a run covers: every file of every batch, in one run.
        assert materialize_graph(build_definitions(str(config)), instance, [dg.AssetKey("raw_documents")],
                                 log=lambda _: None, run_config=QUIET_RUN_CONFIG) == 1
        root = LocalDataRoot(tmp_path / "out-refinery")
        assert sorted(root.list("documents/raw_documents")) == sorted(
            documents_key("raw_documents", s.key) for s in input_shards(load_config(config)))


def test_the_demo_plan_runs_the_funnel_in_a_handful_of_runs():
    defs = build_definitions(str(REPO / "configs" / "demo.yaml"))
    plan = execution_plan(defs)
    names = [[k.to_user_string() for k in step.keys] for step in plan]
    assert names[0] == ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "dedup_signatures"]
    funnel_steps = names[: names.index(next(n for n in names if "pii_redacted" in n)) + 1]
    assert len(funnel_steps) == 4, funnel_steps  # batches, hash ranges, bands (+ clusters), batches again
    assert all(plan[i].per_run is None for i in range(len(funnel_steps))), "each one run over every partition"
    cfg = load_config(REPO / "configs" / "demo.yaml")
    runs = sum(1 if s.per_run is None else len(s.partitions_def.get_partition_keys()) for s in plan)
    # tokenized_shards joins the last funnel run (same batches, after the tokenizer); then one run per
    # bucket for shuffled_shards, lineage_index, and one run per phase for each of phase_manifests,
    # contamination_scan and training_run
    assert "tokenized_shards" in funnel_steps[-1]
    assert runs == len(funnel_steps) + len(cfg.buckets) + 1 + 3 * len(cfg.curriculum.phases) == 22
