"""`refinery compare ROOT_A ROOT_B`: identical roots are said to be so, and a changed document is named by
its file, with stats and timings set aside. The roots are demo-shaped (the layout refinery/layout.py
names, a training run's folder included) but written here: a whole graph run twice would cost minutes,
and the scale-out walk-through test compares two real roots (docs/scale-out.md)."""

import json
from pathlib import Path

import polars as pl
import torch

from orchestration.cli import main as refinery
from refinery.commands.compare import compare_roots
from refinery.layout import documents_key, stats_key
from refinery.storage import LocalDataRoot
from refinery.storage.base import sha256_file

from helpers.configs import write_config
from helpers.final_shards import config_dict


def write_demo_like_root(folder: Path, seconds: float, texts: tuple[str, ...] = ("alpha beta", "gamma delta")) -> Path:
    """A data root as a run writes it; `seconds` stands for the run's timings, which differ run to run."""
    root = LocalDataRoot(str(folder))
    docs = pl.DataFrame({"doc_id": ["web-00/0", "web-00/1"], "url": ["https://a.example/0", "https://a.example/1"],
                         "text": list(texts)})
    root.write_parquet(documents_key("pii_redacted", "web-00"), docs)
    root.write_parquet(documents_key("pii_redacted", "web-01"), docs.with_columns(pl.col("doc_id") + "b"))
    root.write_bytes("shards/final/web/shard-00000.bin", bytes(range(64)))
    root.write_json("manifests/main.json", {"phase": "main", "buckets": {"web": {"tokens": 64, "sha256": "ab"}}})
    root.write_json(stats_key("pii_redacted", "web-00"), {"total": 2, "kept": 2, "wall_s": seconds})
    run = folder / "runs" / "demo" / "main"
    (run / "checkpoints").mkdir(parents=True)
    # every RNG state a checkpoint saves is seeded from the run's seed (training/checkpoint.py seed_all)
    rng = {"torch": torch.arange(4, dtype=torch.uint8), "python": [7, 1], "numpy": {"pos": 3}}
    torch.save({"model": {"w": torch.arange(6.0)}, "train": {"step": 3, "tokens": 384}, "rng": rng},
               run / "checkpoints" / "step-00000003.pt")
    (run / "checkpoints" / "step-00000003.json").write_text(json.dumps(
        {"step": 3, "sha256": sha256_file(run / "checkpoints" / "step-00000003.pt"),
         "bytes": (run / "checkpoints" / "step-00000003.pt").stat().st_size}))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss/total": 7.0 - s, "time/step_s": seconds * s,
                    "throughput/tokens_per_s_per_gpu": 128 / seconds}) + "\n" for s in (1, 2, 3)))
    (run / "status.json").write_text(json.dumps({
        "state": "completed", "step": 3, "updated": f"2026-11-28T09:0{int(seconds)}:00Z",
        "checkpoint": str(run / "checkpoints" / "step-00000003.pt")}))
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents").write_bytes(str(seconds).encode())
    (run / "launch-1.log").write_text(f"took {seconds} s\n")
    return folder


def test_two_runs_of_one_config_are_identical_apart_from_stats_and_timings(tmp_path, capsys):
    a = write_demo_like_root(tmp_path / "local", seconds=1.5)
    b = write_demo_like_root(tmp_path / "ray", seconds=4.0)
    result = compare_roots(a, b)
    assert result.same and not result.differ and not result.only_in_a and not result.only_in_b
    assert result.identical == [
        "documents/pii_redacted/web-00.parquet", "documents/pii_redacted/web-01.parquet", "manifests/main.json",
        "runs/demo/main/checkpoints/step-00000003.json", "runs/demo/main/checkpoints/step-00000003.pt",
        "runs/demo/main/metrics.jsonl", "runs/demo/main/status.json",
        "shards/final/web/shard-00000.bin"]
    assert result.set_aside == ["runs/demo/main/launch-1.log", "runs/demo/main/tensorboard/events.out.tfevents",
                                "stats/pii_redacted/web-00.json"]

    assert refinery(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    # These stats files are not a stage's, so no funnel summary: the file list alone.
    assert out[1].startswith("no funnel summary: a stats, manifest or shard index file is not what a run writes")
    files = out.index("Files: every output but stats and timings")
    assert out[files + 1:files + 6] == ["identical: 8 file(s)", "  documents/pii_redacted/: 2", "  manifests/: 1",
                        "  runs/demo/main/: 2", "  runs/demo/main/checkpoints/: 2"]
    assert "differ: 0 file(s)" in out and out[-1] == "SAME: every compared output is identical"


def test_one_changed_document_names_its_file(tmp_path, capsys):
    a = write_demo_like_root(tmp_path / "a", seconds=1.0)
    b = write_demo_like_root(tmp_path / "b", seconds=1.0, texts=("alpha beta", "gamma delta!"))
    (b / "manifests" / "main.json").write_text(json.dumps(
        {"phase": "main", "buckets": {"web": {"tokens": 65, "sha256": "cd"}}}))
    torch.save({"model": {"w": torch.arange(6.0) + 1}, "train": {"step": 3, "tokens": 384},
                "rng": {"torch": torch.arange(4, dtype=torch.uint8) + 1, "python": [8, 1], "numpy": {"pos": 3}}},
               b / "runs" / "demo" / "main" / "checkpoints" / "step-00000003.pt")
    (b / "shards" / "final" / "web" / "shard-00001.bin").write_bytes(b"\0")

    assert refinery(["compare", str(a), str(b), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["same"] is False
    assert report["differ"] == {
        "documents/pii_redacted/web-00.parquet": "bytes differ",
        "documents/pii_redacted/web-01.parquet": "bytes differ",
        "manifests/main.json": "fields differ: buckets/web/sha256, buckets/web/tokens",
        "runs/demo/main/checkpoints/step-00000003.pt": "fields differ: model/w, rng/python[0], rng/torch",
    }
    assert report["only_in_b"] == ["shards/final/web/shard-00001.bin"] and report["only_in_a"] == []
    assert "runs/demo/main/metrics.jsonl" in report["identical"]

    assert refinery(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "  documents/pii_redacted/web-00.parquet: bytes differ\n" in out
    assert "only in B: 1 file(s)\n  shards/final/web/shard-00001.bin\n" in out
    assert out.rstrip().endswith("DIFFERENT: 5 file(s) differ or are in one root only")


def test_a_config_names_its_data_root_and_a_missing_root_is_refused(tmp_path, capsys):
    config = write_config(tmp_path, {**config_dict(tmp_path), "data_root": "out"})
    a = write_demo_like_root(tmp_path / "out", seconds=1.0)
    b = write_demo_like_root(tmp_path / "other", seconds=2.0)
    assert refinery(["compare", str(config), str(b)]) == 0
    assert f"comparing {a} (A) with {b} (B)" in capsys.readouterr().out
    assert refinery(["compare", str(config), str(a)]) == 2  # the config's own root: one folder
    assert "are one folder" in capsys.readouterr().err
    assert refinery(["compare", str(a), str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'} is not a folder; give two local data roots" in capsys.readouterr().err
