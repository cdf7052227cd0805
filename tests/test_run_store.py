"""The trainer on an s3:// data root (moto, in-process): shards come through the local cache tier,
checkpoints, status and metrics are mirrored to the data root, and a fresh machine resumes from
there with the same result as an uninterrupted local run."""

import json
from pathlib import Path

import pytest
import yaml

from refinery.config import load_config
from refinery.storage import LocalDataRoot
from refinery.storage.s3 import S3DataRoot
from training.metrics import JsonLines
from training.run_store import RunMirror, run_base
from synthetic.curriculum import SyntheticBucket, tiny_run
from training.trainer import RunOptions, Trainer

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


def test_training_on_s3_mirrors_the_run_and_resumes_on_a_fresh_machine(tmp_path, monkeypatch, moto_s3):
    local_config = tiny_run(tmp_path / "local")
    spec = yaml.safe_load(local_config.read_text())
    spec.setdefault("training", {})["record_consumption"] = True
    local_config.write_text(yaml.safe_dump(spec))
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
    assert f"{cfg.training.run_dir}/status.json" in run_keys
    for log in ("metrics.jsonl", "consumption-rank0.jsonl"):
        segments = sorted(k for k in run_keys if f"/logs/{log}/" in k)
        assert len(segments) > 1 and b"".join(remote.read_bytes(k) for k in segments) == (local_run / log).read_bytes(), \
            f"{log}: the segments on S3 hold every line once, in order"
    shards = list((tmp_path / "machine-1").rglob("shard-*.bin"))
    assert shards, "shards were read through the local cache tier"

    # Another machine: an empty cache; the run comes back from S3 and finishes the curriculum.
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(tmp_path / "machine-2"))
    status = Trainer(cfg, RunOptions()).train()
    assert status["state"] == "completed" and status["step"] == expected[-1]["step"]
    got = JsonLines(run_base(cfg) / "metrics.jsonl").read()
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    assert got[-1]["loss/total"] == pytest.approx(expected[-1]["loss/total"], rel=1e-5)
    assert JsonLines(run_base(cfg) / "consumption-rank0.jsonl").read() == \
        JsonLines(tmp_path / "reference/consumption-rank0.jsonl").read(), "the consumption audit moved with the run"


def lines(n: int, start: int = 0) -> bytes:
    return b"".join(json.dumps({"step": i}).encode() + b"\n" for i in range(start, start + n))


def test_logs_go_up_in_segments_of_new_lines_and_come_back_cut_to_the_resumed_step(tmp_path, capsys):
    root, run = LocalDataRoot(tmp_path / "root"), tmp_path / "machine-1"
    run.mkdir()
    log = run / "metrics.jsonl"
    mirror = RunMirror(root, "runs/r", run)
    log.write_bytes(lines(3))
    mirror.push_log(log)
    log.write_bytes(lines(5) + b'{"step": 5, "lo')  # a line being written when the checkpoint comes
    mirror.push_log(log)
    mirror.push_log(log)  # nothing new: no segment
    keys = root.list("runs/r/logs/metrics.jsonl")
    assert [k.rsplit("/", 1)[1] for k in keys] == ["000000000000-000000000003.jsonl", "000000000003-000000000005.jsonl"]
    assert b"".join(root.read_bytes(k) for k in keys) == lines(5), "each whole line once, the torn one not yet"

    # Resume from step 3 elsewhere: restore joins the segments, the cut back drops steps 4-5, and
    # the sync leaves the root holding what the new machine holds.
    other = tmp_path / "machine-2"
    assert RunMirror(root, "runs/r", other).restore() == 1
    assert (other / "metrics.jsonl").read_bytes() == lines(5)
    (other / "metrics.jsonl").write_bytes(lines(4))
    resumed = RunMirror(root, "runs/r", other)
    resumed.sync_log(other / "metrics.jsonl")
    keys = root.list("runs/r/logs/metrics.jsonl")
    assert [k.rsplit("/", 1)[1] for k in keys] == ["000000000000-000000000003.jsonl", "000000000003-000000000004.jsonl"]
    (other / "metrics.jsonl").write_bytes(lines(4) + lines(2, start=4))
    resumed.push_log(other / "metrics.jsonl")
    third = tmp_path / "machine-3"
    RunMirror(root, "runs/r", third).restore()
    assert (third / "metrics.jsonl").read_bytes() == lines(6)

    # A segment lost on the root: the log comes back up to the gap, and says so.
    root.delete(keys[1])
    fourth = tmp_path / "machine-4"
    RunMirror(root, "runs/r", fourth).restore()
    assert (fourth / "metrics.jsonl").read_bytes() == lines(3)
    assert "lines 3-4 of metrics.jsonl are missing on the data root; restored the first 3" in capsys.readouterr().out


def test_a_run_whose_shards_exceed_the_cache_bound_trains_through_a_bounded_local_copy(tmp_path, monkeypatch, moto_s3):
    """The trainer pins only the shards its pool holds open: with a cache bound far below the
    manifests' shards and a pool of two, every step trains, the losses are those of the same run on
    a local root, and the local copy never holds more than the pool's shards and the one file a
    prefetch has just landed (the cache keeps its newest file until the next eviction, and a
    prefetch on another thread can land it between an unpin and the measurement)."""
    buckets = {"web": SyntheticBucket(240, 60, shards=6), "math": SyntheticBucket(40, 40, max_epochs=4, shards=2)}
    local_config = tiny_run(tmp_path / "local", buckets=buckets)
    reference = Trainer(load_config(local_config), RunOptions(run_dir=str(tmp_path / "reference")))
    assert reference.train()["state"] == "completed"
    config = s3_copy_of(local_config, tmp_path, shard_cache_gb=1e-6)
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(tmp_path / "machine"))
    trainer = Trainer(load_config(config), RunOptions(num_workers=0))
    trainer.data.pool.capacity = 2
    cache = trainer.data.pool.cache.root.cache
    held = []
    unpin = cache.unpin

    def unpin_and_measure(keys):
        unpin(keys)
        held.append(cache.total_bytes())

    monkeypatch.setattr(cache, "unpin", unpin_and_measure)
    assert trainer.train()["state"] == "completed"
    losses = [r["loss"] for r in JsonLines(trainer.run_dir / "metrics.jsonl").read() if "loss" in r]
    assert losses == [r["loss"] for r in JsonLines(tmp_path / "reference/metrics.jsonl").read() if "loss" in r]
    local = tmp_path / "local" / "root"
    sizes = sorted(sum(p.stat().st_size for p in local.glob(ref.prefix + ".*"))
                   for ref in {r.prefix: r for m in trainer.schedule.manifests for b in m.buckets.values() for r in b.shards}.values())
    assert len(sizes) == 8 and sum(sizes) > sum(sizes[-2:])
    assert held and max(held) <= sum(sizes[-3:]), "at most the pool's two shards (and one landing prefetch) stay local"
