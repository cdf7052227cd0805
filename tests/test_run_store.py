"""The trainer on an s3:// data root (moto, in-process): shards come through the local cache tier,
checkpoints, status and metrics are mirrored to the data root, and a fresh machine resumes from
there with the same result as an uninterrupted local run."""

from pathlib import Path

import pytest
import yaml

from refinery.config import load_config
from refinery.storage import LocalDataRoot
from refinery.storage_s3 import S3DataRoot
from training.metrics import JsonLines
from training.run_store import run_base
from training.synthetic import tiny_run
from training.trainer import RunOptions, Trainer

from test_storage import moto_s3  # noqa: F401  (fixture)

URL = "s3://bkt/tiny"


def s3_copy_of(config: Path, tmp_path: Path, **training) -> Path:
    """Upload the synthetic data root to S3 and write a config that points at it."""
    data = yaml.safe_load(config.read_text())
    local = LocalDataRoot(Path(config).parent / data["data_root"] if not Path(data["data_root"]).is_absolute()
                          else data["data_root"])
    remote = S3DataRoot(URL, cache_dir=tmp_path / "upload-cache")
    for key in local.list(""):
        remote.write_bytes(key, local.read_bytes(key))
    data["data_root"] = URL
    data["training"] = {**data.get("training", {}), **training}
    path = tmp_path / "s3.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_training_on_s3_mirrors_the_run_and_resumes_on_a_fresh_machine(tmp_path, monkeypatch, moto_s3):  # noqa: F811
    local_config = tiny_run(tmp_path / "local")
    reference = Trainer(load_config(local_config), RunOptions(run_dir=str(tmp_path / "reference")))
    assert reference.train()["state"] == "completed"
    expected = JsonLines(tmp_path / "reference/metrics.jsonl").read()

    config = s3_copy_of(local_config, tmp_path)
    cfg = load_config(config)
    first_phase = cfg.curriculum.phases[0].name
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(tmp_path / "machine-1"))
    assert Trainer(cfg, RunOptions(stop_after_phase=first_phase)).train()["state"] == "completed"
    local_run = run_base(cfg)
    assert str(local_run).startswith(str(tmp_path / "machine-1")), "the working copy is in the local cache"

    remote = S3DataRoot(URL, cache_dir=tmp_path / "check")
    run_keys = remote.list(cfg.training.run_dir)
    local_ckpts = sorted(p.name for p in (local_run / "checkpoints").glob("step-*"))
    assert sorted(k.rsplit("/", 1)[1] for k in run_keys if "/checkpoints/" in k) == local_ckpts, \
        "every local checkpoint and sidecar is on S3, pruned ones are gone from both"
    assert {f"{cfg.training.run_dir}/status.json", f"{cfg.training.run_dir}/metrics.jsonl"} <= set(run_keys)
    shards = list((tmp_path / "machine-1").rglob("shard-*.bin"))
    assert shards, "shards were read through the local cache tier"

    # Another machine: an empty cache; the run comes back from S3 and finishes the curriculum.
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(tmp_path / "machine-2"))
    status = Trainer(cfg, RunOptions()).train()
    assert status["state"] == "completed" and status["step"] == expected[-1]["step"]
    got = JsonLines(run_base(cfg) / "metrics.jsonl").read()
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    assert got[-1]["loss/total"] == pytest.approx(expected[-1]["loss/total"], rel=1e-5)


def test_shards_larger_than_the_cache_bound_are_refused_at_start(tmp_path, monkeypatch, moto_s3):  # noqa: F811
    config = s3_copy_of(tiny_run(tmp_path / "local"), tmp_path, shard_cache_gb=1e-6)
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(tmp_path / "machine"))
    with pytest.raises(ValueError, match=r"more than training.shard_cache_gb=1e-06 holds"):
        Trainer(load_config(config), RunOptions())
