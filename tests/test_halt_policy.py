"""The halt rules as one policy (training/halt.py), decided from a step's outcome, and step hooks
installed from outside the trainer (what the chaos tests' kill uses)."""

from __future__ import annotations

import pytest

from refinery.config import ValRiseHaltConfig, load_config
from synthetic.curriculum import tiny_run
from training.halt import STEP_HOOKS_ENV, Halt, HaltPolicy, StepOutcome, install_step_hooks
from training.loader import Exhausted
from training.trainer import RunOptions, Trainer

RULE = ValRiseHaltConfig(phase="anneal", patience=2, min_delta=0.05)
RISING = {"anneal": {"web": [3.0, 2.9, 3.0, 3.1], "code": [2.0, 1.9, 1.8, 1.7]}}


def test_an_exhausted_batch_halts_before_the_step_and_a_batch_does_not():
    policy = HaltPolicy(3, None)
    assert policy.before_step(Exhausted("math", 7, "math ran dry")) == Halt("bucket_exhausted",
                                                                            "bucket_exhausted: math ran dry")
    assert policy.before_step(object()) is None


def test_the_nonfinite_streak_halts_at_its_limit_and_before_a_validation_rise():
    policy = HaltPolicy(3, RULE)
    assert policy.after_step(StepOutcome(2, None, {})) is None
    halt = policy.after_step(StepOutcome(3, "anneal", RISING))
    assert halt is not None and halt.kind == "nonfinite_loss"
    assert halt.reason.startswith("nonfinite_loss: 3 consecutive steps")


def test_a_validation_rise_halts_only_when_the_watched_phase_was_evaluated():
    policy = HaltPolicy(3, RULE)
    halt = policy.after_step(StepOutcome(0, "anneal", RISING))
    assert halt == Halt("val_loss_rise", "val_loss_rise: validation loss of bucket(s) ['web'] rose during phase "
                        "'anneal' for 2 evaluation(s) in a row by more than 0.05 (web: best 2.9000, then 3.0000, "
                        "3.1000); rule training.anneal_halt_on_val_rise")
    assert policy.after_step(StepOutcome(0, None, RISING)) is None  # no evaluation this step
    assert policy.after_step(StepOutcome(0, "main", {"main": RISING["anneal"]})) is None  # a phase not watched
    assert HaltPolicy(3, None).after_step(StepOutcome(0, "anneal", RISING)) is None  # no rule


def test_step_hooks_from_the_environment_run_after_each_step_past_its_checkpoint(tmp_path, monkeypatch):
    hook = tmp_path / "record_steps.py"
    hook.write_text("def install(trainer):\n"
                    "    trainer.seen = []\n"
                    "    trainer.step_hooks.append(lambda t: t.seen.append((t.step, t.checkpoint_path)))\n")
    monkeypatch.setenv(STEP_HOOKS_ENV, str(hook))
    trainer = Trainer(load_config(tiny_run(tmp_path / "run", training={"checkpoint_interval": 4})),
                      RunOptions(run_dir=str(tmp_path / "out")))
    assert trainer.train()["state"] == "completed"
    steps = [s for s, _ in trainer.seen]
    assert steps == list(range(1, trainer.schedule.total_steps + 1))
    assert all(path.endswith(f"step-{4:08d}.pt") for s, path in trainer.seen if s in (4, 5, 6, 7))


def test_a_step_hook_that_is_not_a_python_file_is_refused_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(STEP_HOOKS_ENV, str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match=STEP_HOOKS_ENV):
        install_step_hooks(object())
