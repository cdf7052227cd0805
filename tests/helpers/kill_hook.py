"""The chaos tests' crash: a step hook that SIGKILLs the trainer right after a given step (after
that step's checkpoint, if it writes one). Installed through `training.halt.STEP_HOOKS_ENV`, so it
reaches trainers launched in a subprocess, under torchrun, Dagster or Ray (REFINERY_* variables
travel with those launches)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from training.halt import STEP_HOOKS_ENV

KILL_AT_STEP_ENV = "REFINERY_TRAIN_KILL_AT_STEP"


def kill_at_step_env(step: int) -> dict[str, str]:
    """The environment that makes every trainer launched with it SIGKILL itself after `step`."""
    return {STEP_HOOKS_ENV: str(Path(__file__).resolve()), KILL_AT_STEP_ENV: str(step)}


def install(trainer: Any) -> None:
    step = int(os.environ[KILL_AT_STEP_ENV])

    def kill_after(t: Any) -> None:
        if t.step == step:
            os.kill(os.getpid(), signal.SIGKILL)

    trainer.step_hooks.append(kill_after)
