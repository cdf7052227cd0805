"""Checkpoints: atomic, verified by their sidecar, corrupt or partial ones skipped, retention."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from refinery.config import load_config
from synthetic.curriculum import tiny_run
from training.checkpoint import CheckpointManager, load_checkpoint, rng_state, set_rng_state
from training.trainer import RunOptions, Trainer

REPO = Path(__file__).resolve().parents[1]


def state(step):
    return {"model": {"w": torch.full((3,), float(step))}, "train": {"step": step, "name": "x"}, "rng": rng_state()}


def test_latest_skips_corrupt_and_partial_checkpoints(tmp_path, capsys):
    ckpt = CheckpointManager(tmp_path, keep_last=5)
    for step in (1, 2, 3, 4):
        ckpt.save(step, state(step))
    data = bytearray(ckpt.path_for(4).read_bytes())
    data[len(data) // 2] ^= 0xFF
    ckpt.path_for(4).write_bytes(bytes(data))  # bit rot
    ckpt.path_for(3).write_bytes(ckpt.path_for(3).read_bytes()[:100])  # truncated
    ckpt.path_for(5).write_bytes(b"partial")  # a save killed before its sidecar was written
    assert ckpt.latest() == ckpt.path_for(2)
    err = capsys.readouterr().err
    assert "step-00000004.pt: content hash differs" in err and "step-00000003.pt" in err
    loaded = load_checkpoint(ckpt.latest())
    assert loaded["train"] == {"step": 2, "name": "x"} and torch.equal(loaded["model"]["w"], torch.full((3,), 2.0))
    with pytest.raises(ValueError, match="step-00000004.pt: content hash differs.*older checkpoint"):
        load_checkpoint(ckpt.path_for(4))
    with pytest.raises(ValueError, match="no completion sidecar"):
        load_checkpoint(ckpt.path_for(5))


def test_retention_keeps_last_k_and_every_phase_boundary(tmp_path):
    ckpt = CheckpointManager(tmp_path, keep_last=2)
    for step in range(1, 9):
        ckpt.save(step, state(step), boundary="warmup" if step == 3 else None)
    kept = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert kept == ["step-00000003.pt", "step-00000007.pt", "step-00000008.pt"]
    assert json.loads((tmp_path / "step-00000003.json").read_text())["boundary"] == "warmup"
    assert not list(tmp_path.glob(".*tmp"))


def test_checkpoints_load_with_weights_only_and_restore_rng(tmp_path):
    ckpt = CheckpointManager(tmp_path, keep_last=1)
    torch.manual_seed(3)
    np.random.seed(3)
    path = ckpt.save(1, state(1))
    expect = (torch.rand(2), np.random.rand(2))
    set_rng_state(torch.load(path, weights_only=True)["rng"])
    np.testing.assert_array_equal(np.random.rand(2), expect[1])
    assert torch.equal(torch.rand(2), expect[0])


def test_missing_checkpoint_path_says_where_to_look(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoints"):
        load_checkpoint(tmp_path / "nope.pt")


# A trainer whose checkpoint write of step 8 is SIGKILLed after its temporary received bytes.
DIES_WRITING_STEP_8 = """
import os, runpy, signal, sys, torch
save = torch.save
def dying(state, f):
    if state["train"]["step"] == 8:
        f.write(b"partial"); f.flush(); os.kill(os.getpid(), signal.SIGKILL)
    save(state, f)
torch.save = dying
sys.argv = ["training", *sys.argv[1:]]
runpy.run_module("training", run_name="__main__")
"""


def test_a_save_killed_mid_write_leaves_no_temporary_once_the_run_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("REFINERY_VERIFIED_DIR", str(tmp_path / "verified"))
    config = tiny_run(tmp_path, training={"checkpoint_interval": 4})
    run_dir = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", DIES_WRITING_STEP_8, "--config", str(config), "--run-dir",
                             str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    ckpt = run_dir / "checkpoints"
    assert [p.name.split(".")[1] for p in ckpt.glob(".*.tmp")] == ["step-00000008"], "the killed write's temporary"
    status = Trainer(load_config(config), RunOptions(run_dir=str(run_dir))).train()
    assert status["state"] == "completed" and status["step"] > 8
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith(".")) == []


def test_a_save_removes_the_temporaries_of_killed_saves(tmp_path):
    ckpt = CheckpointManager(tmp_path, keep_last=2)
    ckpt.save(1, state(1))
    for name in (".step-00000002.pt.k3j2x9.tmp", ".step-00000002.json.a8c1e0.tmp"):
        (tmp_path / name).write_bytes(b"partial")
    (tmp_path / "notes.tmp").write_text("someone else's")
    ckpt.save(2, state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.tmp", "step-00000001.json", "step-00000001.pt", "step-00000002.json", "step-00000002.pt"]
