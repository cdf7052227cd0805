"""Checkpoints: atomic, verified by their sidecar, corrupt or partial ones skipped, retention."""

import json

import numpy as np
import pytest
import torch

from training.checkpoint import CheckpointManager, load_checkpoint, rng_state, set_rng_state


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
