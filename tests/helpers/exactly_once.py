"""Exactly-once delivery under SIGKILL, as a procedure any curriculum can be put through: a reference
run, then a run killed at 10+ steps (around both phase switches among them), each time resumed with
another simulated world size (1, 2, 4) and loader worker count (0, 2), and the assertion that both
consumed the same entry pieces in the same order and ended with the same model.

"Simulated world size W": `--simulate-world-size W` makes one process run the data path of W ranks
(W samplers, each reading its rank's slice of every global batch, each behind its own loader
with the given workers) and assemble the global batch from the slices, so the model maths is that of
one rank while the data sharding is that of W.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from refinery.config import load_config
from training.checkpoint import load_checkpoint
from training.metrics import JsonLines
from training.trainer import RunOptions, Trainer

from helpers.kill_hook import kill_at_step_env

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = [(1, 0), (2, 2), (4, 0), (1, 2), (2, 0), (4, 2)]  # (simulated world size, workers)


def pieces(run_dir: Path) -> list[tuple]:
    """(step, row, bucket, epoch, entry, a, b) of every piece the run's rank 0 consumed, in order."""
    records = JsonLines(run_dir / "consumption-rank0.jsonl").read()
    assert [r["step"] for r in records] == list(range(1, len(records) + 1)), "each step recorded once"
    return [
        (r["step"], row, bucket, epoch, entry, a, b)
        for r in records
        for row, bucket, epoch, entry, a, b in zip(r["row"], r["bucket"], r["epoch"], r["entry"], r["a"], r["b"])
    ]


def assert_exactly_once_under_sigkill(tmp_path: Path, config: Path) -> tuple[Trainer, Path]:
    """Train `config` (recording consumption, checkpoints every 3 steps) uninterrupted and killed
    and resumed as the module doc says; assert the same pieces in the same order and the same
    model. Returns the reference trainer and the killed run's directory."""
    cfg = load_config(config)
    reference = Trainer(cfg, RunOptions(run_dir=str(tmp_path / "reference")))
    assert reference.train()["state"] == "completed"
    total = reference.schedule.total_steps
    b1, b2 = reference.schedule.phase_starts[1:3]
    rng = random.Random(7)
    around_switches = {b1 - 1, b1, b1 + 1, b2 - 1, b2, b2 + 1}
    others = set(rng.sample(sorted(set(range(2, total - 1)) - around_switches), 5))
    kills = sorted(around_switches | others)
    assert len(kills) >= 10

    run_dir = tmp_path / "killed"
    base = [sys.executable, "-m", "training", "--config", str(config), "--run-dir", str(run_dir)]
    for i, step in enumerate(kills):
        world, workers = LAYOUTS[i % len(LAYOUTS)]
        cmd = base + ["--simulate-world-size", str(world), "--num-workers", str(workers)]
        out = subprocess.run(cmd, cwd=REPO, env={**os.environ, **kill_at_step_env(step)},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == -9, f"kill at step {step} (W={world}, workers={workers}): {out.stderr[-2000:]}"
    out = subprocess.run(base + ["--simulate-world-size", "2", "--num-workers", "2"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]

    expect, got = pieces(tmp_path / "reference"), pieces(run_dir)
    replayed = Counter(got) - Counter(expect)
    skipped = Counter(expect) - Counter(got)
    assert (sum(replayed.values()), sum(skipped.values())) == (0, 0)
    assert got == expect, "same global order whatever the world size and worker count"

    final_ref = load_checkpoint(reference.ckpt.latest())
    final_run = load_checkpoint(sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1])
    assert final_run["train"]["step"] == final_ref["train"]["step"] == total
    for name, tensor in final_ref["model"].items():
        torch.testing.assert_close(final_run["model"][name], tensor, rtol=1e-5, atol=1e-6)
    ref_loss = JsonLines(tmp_path / "reference/metrics.jsonl").read()[-1]["loss/total"]
    run_loss = JsonLines(run_dir / "metrics.jsonl").read()[-1]["loss/total"]
    assert run_loss == pytest.approx(ref_loss, rel=1e-5)
    return reference, run_dir
