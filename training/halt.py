"""When a run halts, and what a launch may add to each step.

`HaltPolicy` holds the rules that end a run before its curriculum does and leave it `halted` (a
state a resume does not clear by itself): a bucket ran dry without exhaustion allowed, the loss or
gradient stayed non-finite for `training.max_consecutive_nonfinite` steps, or a bucket's validation
loss rose during the phase `training.anneal_halt_on_val_rise` watches (`val_rise`, over the history
`training.validation.Evaluator` keeps). The trainer asks it once before a step (its batch) and once
after (`StepOutcome`), and saves a checkpoint then stops on any `Halt` it returns.

Step hooks run after each step's checkpoint decision (the state a resume would start from is on
disk), with the trainer. A launch installs them through `STEP_HOOKS_ENV`: Python files, joined by
os.pathsep, each defining `install(trainer)`; the variable travels to every rank and to launches
through Dagster, torchrun and Ray. Tests use it to kill a trainer mid-run (tests/helpers/kill_hook.py).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from refinery.config import ValRiseHaltConfig
from training.loader import Exhausted

STEP_HOOKS_ENV = "REFINERY_TRAIN_STEP_HOOKS"

StepHook = Callable[[Any], None]  # called with the trainer after each step


def val_rise(losses: list[float], patience: int, min_delta: float) -> tuple[float, list[float]] | None:
    """The rule: the last `patience` evaluations each lie more than `min_delta` above the best loss
    before them (all within one phase). Returns (that best, the rising losses) when it fires."""
    if len(losses) <= patience:
        return None
    best_before = np.minimum.accumulate(np.asarray(losses, dtype=np.float64))
    recent = range(len(losses) - patience, len(losses))
    if all(losses[i] > best_before[i - 1] + min_delta for i in recent):
        return float(best_before[len(losses) - patience - 1]), [float(losses[i]) for i in recent]
    return None


def rising_buckets(history: dict[str, list[float]], patience: int, min_delta: float) -> dict[str, tuple[float, list[float]]]:
    """Buckets whose validation losses (in evaluation order, one phase) fire `val_rise`."""
    out = {}
    for bucket, losses in sorted(history.items()):
        fired = val_rise(losses, patience, min_delta)
        if fired is not None:
            out[bucket] = fired
    return out


@dataclass(frozen=True)
class Halt:
    kind: str  # status.json's halt_kind: bucket_exhausted | nonfinite_loss | val_loss_rise
    reason: str


@dataclass(frozen=True)
class StepOutcome:
    """What a trained step tells the halt rules."""

    nonfinite_streak: int  # consecutive steps, this one last, with a NaN/Inf loss or gradient
    evaluated: str | None  # the phase whose validation loss the step measured (None: no evaluation)
    val_history: dict[str, dict[str, list[float]]]  # phase -> bucket -> validation losses, in order


@dataclass(frozen=True)
class HaltPolicy:
    max_consecutive_nonfinite: int
    val_rise_rule: ValRiseHaltConfig | None  # training.anneal_halt_on_val_rise

    def before_step(self, batch: Any) -> Halt | None:
        """A halt instead of the step: the loader found a bucket dry (`Exhausted`)."""
        if isinstance(batch, Exhausted):
            return Halt("bucket_exhausted", f"bucket_exhausted: {batch.message}")
        return None

    def after_step(self, outcome: StepOutcome) -> Halt | None:
        """A halt after the step: the non-finite streak reached its limit, or a validation loss rose."""
        if outcome.nonfinite_streak >= self.max_consecutive_nonfinite:
            return Halt("nonfinite_loss", f"nonfinite_loss: {outcome.nonfinite_streak} consecutive steps with a NaN/Inf "
                                          "loss or gradient (limit training.max_consecutive_nonfinite)")
        rule, phase = self.val_rise_rule, outcome.evaluated
        if rule is None or phase != rule.phase:
            return None
        fired = rising_buckets(outcome.val_history.get(phase, {}), rule.patience, rule.min_delta)
        if not fired:
            return None
        detail = "; ".join(f"{b}: best {best:.4f}, then {', '.join(f'{x:.4f}' for x in rising)}"
                           for b, (best, rising) in fired.items())
        return Halt("val_loss_rise", f"val_loss_rise: validation loss of bucket(s) {sorted(fired)} rose during phase "
                                     f"{phase!r} for {rule.patience} evaluation(s) in a row by more than "
                                     f"{rule.min_delta:g} ({detail}); rule training.anneal_halt_on_val_rise")


def install_step_hooks(trainer: Any) -> None:
    """Run `install(trainer)` of each file `STEP_HOOKS_ENV` names."""
    for path in filter(None, os.environ.get(STEP_HOOKS_ENV, "").split(os.pathsep)):
        spec = importlib.util.spec_from_file_location(f"refinery_step_hook_{Path(path).stem}", path)
        if spec is None or spec.loader is None or not Path(path).is_file():
            raise ValueError(f"{STEP_HOOKS_ENV}: {path!r} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.install(trainer)
