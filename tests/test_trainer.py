"""The training loop on a tiny synthetic curriculum: metrics, per-phase seq_len and LR, boundary
checkpoints, NaN handling, SIGTERM, phase ranges and the CLI."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from orchestration.cli import main
from refinery.config import load_config
from training.status import read_status
from synthetic.curriculum import tiny_run
from training.checkpoint import ResumeRefused
from training.model import GPT
from training.trainer import RunOptions, Trainer


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One uninterrupted run, shared by the read-only checks below."""
    config = tiny_run(tmp_path_factory.mktemp("run"))
    trainer = Trainer(load_config(config))
    status = trainer.train()
    return config, trainer, status, trainer.metrics.read()


def test_run_completes_with_stable_metric_keys(finished):
    _, trainer, status, metrics = finished
    assert status["state"] == "completed" and status["finished"] and status["step"] == trainer.schedule.total_steps
    assert [m["step"] for m in metrics] == list(range(1, trainer.schedule.total_steps + 1))
    for key in ("loss/total", "loss/web", "tokens/web", "tokens/math", "time/data_wait_s", "lr", "phase", "step"):
        assert key in metrics[-1], key
    assert metrics[-1]["tokens/web"] + metrics[-1]["tokens/math"] == metrics[-1]["tokens"]
    assert metrics[-1]["loss/total"] < metrics[0]["loss/total"]
    assert set(status["summary"]) == {"warmup", "main", "anneal"}


def test_seq_len_switches_at_the_exact_boundary_step(finished):
    _, trainer, _, metrics = finished
    boundary = trainer.schedule.phase_starts[2]  # metrics' step = steps done, so step index s is line s
    assert [m["seq_len"] for m in metrics[boundary - 1 : boundary + 1]] == [32, 64]
    assert [m["phase_name"] for m in metrics[boundary - 1 : boundary + 1]] == ["main", "anneal"]


def test_every_phase_boundary_has_a_kept_checkpoint(finished):
    _, trainer, _, _ = finished
    boundaries = {m["boundary"]: m["step"] for m in trainer.ckpt.complete() if m["boundary"]}
    assert boundaries == {name: trainer.schedule.phase_starts[i + 1] for i, name in enumerate(trainer.schedule.phase_names)}


def test_lr_follows_warmup_stable_and_linear_anneal_times_lr_scale(finished):
    """The formula written out: warmup over 3 steps of phase 0's batch, constant 1, then a linear
    decay to 0 over the last phase's tokens, times lr_scale (anneal 0.5); read at each step's middle
    token, kept inside the step's phase."""
    config, trainer, _, metrics = finished
    cfg = load_config(config)
    sched = trainer.schedule
    spans = sched.tokens.phases
    G, peak = cfg.training.micro_batch_size * cfg.training.grad_accum_steps, cfg.training.lr
    warmup = 3 * G * 32
    last = spans[-1]

    def expected(step):
        phase = sched.phase_at(step)
        t = min(sched.tokens_before(step) + G * sched.seq_len_at(step) // 2, spans[phase].end - 1)
        mult = 1.0 if t < last.start else (last.end - t) / (last.end - last.start)
        if t < warmup:
            mult *= t / warmup
        return peak * mult * [1.0, 1.0, 0.5][phase]

    anneal_start = sched.phase_starts[2]
    for step in (0, 1, 2, 5, anneal_start - 1, anneal_start, anneal_start + 3, sched.total_steps - 1):
        assert metrics[step]["lr"] == pytest.approx(expected(step), rel=1e-9), step
    assert metrics[anneal_start]["lr"] < 0.5 * metrics[anneal_start - 1]["lr"] + 1e-12
    assert metrics[-1]["lr"] > 0 and metrics[-1]["lr"] < metrics[anneal_start]["lr"]


def test_a_nonfinite_loss_skips_the_step_then_halts_after_n_in_a_row(tmp_path):
    config = tiny_run(tmp_path, training={"max_consecutive_nonfinite": 3})
    trainer = Trainer(load_config(config))
    forward = trainer.model.forward
    poisoned = {4, 9, 10, 11}  # step indexes whose loss is made NaN

    def nan_on_poisoned_steps(*args, **kwargs):
        logits, loss = forward(*args, **kwargs)
        return logits, loss * float("nan") if trainer.step in poisoned else loss

    trainer.ddp = nan_on_poisoned_steps
    snapshots = {}
    trainer.metrics.sinks.append(lambda m: snapshots.__setitem__(m["step"], trainer.model.lm_head.weight.clone()))
    status = trainer.train()
    metrics = trainer.metrics.read()
    assert [m["step"] for m in metrics if m["nonfinite"]] == [5, 10, 11, 12]
    assert torch.equal(snapshots[4], snapshots[5]), "a NaN step must not update the weights"
    assert not torch.equal(snapshots[5], snapshots[6]), "training goes on after an isolated NaN"
    assert status["state"] == "halted" and status["step"] == 12
    assert status["reason"].startswith("nonfinite_loss: 3 consecutive steps")
    assert trainer.ckpt.latest() == trainer.ckpt.path_for(12)


def test_the_device_side_nonfinite_skip_leaves_weights_and_adam_step_count_unchanged(tmp_path, monkeypatch):
    """The CUDA path's skip (the fused AdamW's found_inf set from a device-side flag, the step queued
    before the read) run on CPU, whose fused AdamW takes found_inf too: the NaN steps are skipped
    and counted exactly as on the host path."""
    configure = GPT.configure_optimizer

    def fused_optimizer(self, lr, weight_decay, betas=(0.9, 0.95)):
        optimizer = configure(self, lr, weight_decay, betas)
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)

    monkeypatch.setattr(GPT, "configure_optimizer", fused_optimizer)
    config = tiny_run(tmp_path, training={"max_consecutive_nonfinite": 3})
    trainer = Trainer(load_config(config))
    assert trainer.skip_nonfinite_on_device
    forward = trainer.model.forward
    poisoned = {4, 9, 10, 11}

    def nan_on_poisoned_steps(*args, **kwargs):
        logits, loss = forward(*args, **kwargs)
        return logits, loss * float("nan") if trainer.step in poisoned else loss

    trainer.ddp = nan_on_poisoned_steps
    weight = trainer.model.lm_head.weight
    snapshots = {}
    trainer.metrics.sinks.append(lambda m: snapshots.__setitem__(
        m["step"], (weight.clone(), float(trainer.optimizer.state[weight]["step"]))))
    status = trainer.train()
    assert [m["step"] for m in trainer.metrics.read() if m["nonfinite"]] == [5, 10, 11, 12]
    assert torch.equal(snapshots[4][0], snapshots[5][0]), "a NaN step must not update the weights"
    assert snapshots[4][1] == snapshots[5][1] == 4.0, "nor count as an Adam step"
    assert not torch.equal(snapshots[5][0], snapshots[6][0]) and snapshots[6][1] == 5.0
    assert snapshots[12][1] == 8.0 and not hasattr(trainer.optimizer, "found_inf")
    assert status["state"] == "halted" and status["step"] == 12


def test_the_lookahead_forced_on_cpu_trains_the_same_losses_and_weights(tmp_path, finished):
    """The CUDA path's lookahead (the next batch fetched and its device inputs built inside the
    step) changes when work is done, not what is trained; it never reaches across a phase's end."""
    _, reference, _, reference_metrics = finished
    trainer = Trainer(load_config(tiny_run(tmp_path)))
    trainer.lookahead = True
    built_ahead = []
    train_step = trainer.train_step

    def recording_step(batch, lr, inputs=None, before_read=None):
        built_ahead.append(inputs is not None)
        return train_step(batch, lr, inputs, before_read)

    trainer.train_step = recording_step
    assert trainer.train()["state"] == "completed"
    metrics = trainer.metrics.read()
    assert [m["loss/total"] for m in metrics] == [m["loss/total"] for m in reference_metrics]
    assert [m["grad_norm"] for m in metrics] == [m["grad_norm"] for m in reference_metrics]
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, reference.model.state_dict()[name]), name
    starts = trainer.schedule.phase_starts[:-1]
    assert built_ahead == [step not in starts for step in range(trainer.schedule.total_steps)]


def test_sigterm_checkpoints_and_reports_failed_then_auto_resume_finishes(tmp_path):
    config = tiny_run(tmp_path, training={"checkpoint_interval": 1000})
    cfg = load_config(config)
    trainer = Trainer(cfg)
    trainer.metrics.sinks.append(lambda m: m["step"] == 5 and os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a child that inherited SIGTERM ignored
    try:
        status = trainer.train()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert status["state"] == "failed" and status["reason"].startswith("preempted: SIGTERM at step 5")
    assert trainer.ckpt.latest() == trainer.ckpt.path_for(5)
    resumed = Trainer(cfg)
    assert resumed.train()["state"] == "completed"
    assert resumed.metrics.read()[4]["step"] == 5 and len(resumed.metrics.read()) == resumed.schedule.total_steps


def test_one_phase_per_invocation_from_the_previous_boundary_checkpoint(tmp_path, finished):
    config = tiny_run(tmp_path)
    cfg = load_config(config)
    first = Trainer(cfg, RunOptions(stop_after_phase="warmup", run_dir=str(tmp_path / "phase-warmup")))
    status = first.train()
    assert status["state"] == "completed" and not status["finished"] and status["phase"] == "main"
    assert status["step"] == first.schedule.phase_starts[1]
    boundary = status["checkpoint"]
    second = Trainer(cfg, RunOptions(resume=boundary, stop_after_phase="main", run_dir=str(tmp_path / "phase-main")))
    assert second.train()["step"] == first.schedule.phase_starts[2]
    third = Trainer(cfg, RunOptions(resume=second.checkpoint_path, run_dir=str(tmp_path / "phase-anneal")))
    assert third.train()["finished"]
    whole = finished[3]
    phased = first.metrics.read() + second.metrics.read() + third.metrics.read()  # each run_dir logs its own steps
    assert [m["step"] for m in phased] == [m["step"] for m in whole]
    assert [m["loss/total"] for m in phased] == pytest.approx([m["loss/total"] for m in whole], rel=1e-5)


def test_cli_prints_per_phase_per_bucket_table_and_json(tmp_path, capsys):
    config = tiny_run(tmp_path)
    assert main(["train", "--config", str(config), "--stop-after-phase", "warmup"]) == 0
    table = capsys.readouterr().out
    assert "phase" in table and "warmup       web" in table and "state: completed" in table
    assert main(["train", "--config", str(config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["state"] == "completed" and out["finished"]
    assert {(r["phase"], r["bucket"]) for r in out["phases"]} >= {("warmup", "web"), ("anneal", "math")}
    assert all(r["tokens"] > 0 and r["loss"] > 0 for r in out["phases"])
    assert main(["train", "--config", str(config), "--resume", "never"]) == 3
    assert "already has checkpoints" in capsys.readouterr().err


def test_bad_options_fail_with_the_fix(tmp_path):
    config = tiny_run(tmp_path, training={"micro_batch_size": 3, "grad_accum_steps": 1})
    with pytest.raises(ValueError, match="does not split over 2 ranks"):
        Trainer(load_config(config), RunOptions(simulate_world_size=2))
    with pytest.raises(ValueError, match="no such phase"):
        Trainer(load_config(config), RunOptions(stop_after_phase="nope")).train()
    assert read_status(tmp_path / "root/runs/demo")["state"] == "failed"
    assert issubclass(ResumeRefused, RuntimeError)
