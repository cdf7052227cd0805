"""phase_manifests as tasks: the manifests, selections and band files are the same bytes from one
process and from a pool of two workers, each pass runs a task per final shard, and a missing or
damaged entry table is refused by name, whichever process read it."""

from __future__ import annotations

import shutil

import pytest

from refinery.fanout import task_pool
from assets.resource import RefineryResource
from refinery.config import load_config
from refinery.curriculum import CountedTasks, CurriculumError, build_phase_manifest, validate_data_root, write_manifest
from refinery.curriculum import bands as bands_mod
from refinery.curriculum import inventory as inv_mod
from refinery.storage import LocalDataRoot
from refinery.tasks import in_process

from helpers.configs import write_config
from helpers.final_shards import DOCS_PER_BUCKET, config_dict, sample_difficulty, sample_docs, write_final_shards

EASY = {"by": "difficulty", "direction": "easy_first", "bands": 4}
HARD = {"by": "difficulty", "direction": "hard_first", "bands": 3}
PER_SHARD = 8  # entries per final shard: web's 48 entries in 6 shards, math's 24 in 3


def write_corpus(tmp_path) -> tuple[str, LocalDataRoot]:
    """Final shards of both buckets with quality and difficulty scores, a config with two workers
    whose main phase is ordered easy_first and whose anneal keeps a quality quarter ordered
    hard_first, and one web document the contamination policy dropped from the anneal."""
    root = LocalDataRoot(tmp_path / "root")
    docs = {b: sample_docs(b, n) for b, n in DOCS_PER_BUCKET.items()}
    for b, d in docs.items():
        write_final_shards(root, b, d, per_shard=PER_SHARD, difficulty=sample_difficulty(d))
    d = config_dict(tmp_path)
    d["curriculum"]["phases"][0]["order"] = EASY
    d["curriculum"]["phases"][1]["order"] = HARD
    d["partitions"] = {"workers": 2}
    kept_web = sorted((s, doc) for doc, _, s in docs["web"] if s is not None)[-1][1]
    root.write_json("contamination/anneal/excluded_doc_ids.json", [kept_web])
    return str(write_config(tmp_path, d)), root


def build_all(cfg, root, run_tasks) -> tuple[dict[str, bytes], int]:
    """Every phase's manifest built with `run_tasks`: the files under manifests/ and the tasks run."""
    shutil.rmtree(root.root / "manifests", ignore_errors=True)
    counted = CountedTasks(run_tasks)
    report, inventory, selections = validate_data_root(cfg, root, counted)
    for phase in cfg.curriculum.phases:
        write_manifest(root, build_phase_manifest(cfg, root, phase.name, report, inventory, selections, counted))
    return {key: root.read_bytes(key) for key in root.list("manifests")}, counted.tasks


def test_manifests_are_the_same_bytes_from_one_process_and_from_two_workers(tmp_path):
    config_path, root = write_corpus(tmp_path)
    cfg = load_config(config_path)
    one, one_tasks = build_all(cfg, root, in_process(root))
    assert sorted(one) == ["manifests/anneal.json", "manifests/anneal/math-bands.npy",
                           "manifests/anneal/math-selection.npy", "manifests/anneal/web-bands.npy",
                           "manifests/anneal/web-selection.npy", "manifests/main.json",
                           "manifests/main/math-bands.npy", "manifests/main/web-bands.npy"]
    with task_pool(RefineryResource(config_path=config_path)) as pool:
        two, two_tasks = build_all(cfg, root, pool)
    assert two == one
    assert two_tasks == one_tasks


def test_each_pass_runs_a_task_per_final_shard(tmp_path, monkeypatch):
    config_path, root = write_corpus(tmp_path)
    cfg = load_config(config_path)
    shards = {b: len(root.read_json(f"shards/final/{b}/index.json")["shards"]) for b in cfg.buckets}
    assert shards == {"web": 6, "math": 3}
    read = []
    reader = inv_mod.slice_batches

    def spy(root, part, columns):
        read.append((part.bucket, part.first, part.rows, part.to_end))
        yield from reader(root, part, columns)

    monkeypatch.setattr(inv_mod, "slice_batches", spy)
    monkeypatch.setattr(bands_mod, "slice_batches", spy)
    counted = CountedTasks(in_process(root))
    inventory = validate_data_root(cfg, root, counted)[1]
    # validation alone: the anneal's per-language quality cutoff (a census of the languages, then a
    # histogram and a bracket per language: one language here), then the bands of both ordered
    # phases (two histograms a shard, a count per batch of 65,536 rows)
    per_bucket = {b: 3 * n + 2 * (2 * n + 1) for b, n in shards.items()}
    assert counted.tasks == sum(per_bucket.values())
    web = [(first, rows, to_end) for bucket, first, rows, to_end in read if bucket == "web"]
    shard_slices = [(PER_SHARD * k, PER_SHARD, k == 5) for k in range(6)]
    assert web[:18] == shard_slices * 3  # census, histogram and bracket: each shard's rows, the last to the end
    assert (0, inventory["web"].entries, True) in web  # the bands' count: one batch, the whole table


def missing(path):
    path.unlink()


def not_parquet(path):
    path.write_bytes(b"not parquet")


@pytest.mark.parametrize("damage, message, pool", [
    (missing, r"not a readable entry table \(FileNotFoundError", False),
    (not_parquet, r"not a readable entry table \(ArrowInvalid", True),  # raised in a worker, re-raised here
])
def test_a_missing_or_damaged_entry_table_is_refused_by_name(tmp_path, damage, message, pool):
    config_path, root = write_corpus(tmp_path)
    cfg = load_config(config_path)
    damage(root.root / "shards/final/math/entries.parquet")
    with pytest.raises(CurriculumError, match=rf"shards/final/math/entries.parquet: {message}.*; "
                                              r"re-materialize shuffled_shards\[math\]"):
        if pool:
            with task_pool(RefineryResource(config_path=config_path)) as run_tasks:
                validate_data_root(cfg, root, run_tasks)
        else:
            validate_data_root(cfg, root, in_process(root))
