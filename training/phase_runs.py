"""One run directory per curriculum phase, chained by phase-boundary checkpoints.

`training_run[phase]` trains from the previous phase's boundary checkpoint to its own, in a run
directory of its own, so a finished main phase can branch into several anneal variants (seed 000's
anneal mixture search) without one overwriting another. This module decides where each launch of
`refinery train` starts; the orchestrator only launches, watches and relaunches.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from refinery.config import RefineryConfig
from refinery.layout import CHECKPOINTS_DIR
from training.checkpoint import CheckpointManager
from training.run_store import RunMirror, run_base

if TYPE_CHECKING:
    from refinery.storage import DataRoot


class PhaseOrderError(RuntimeError):
    """A phase was asked to train before the phase it continues from had finished."""


def phase_names(cfg: RefineryConfig) -> list[str]:
    if cfg.curriculum is None:
        raise ValueError("the config declares no curriculum, so there are no phases to train")
    return [p.name for p in cfg.curriculum.phases]


def phase_run_dir(cfg: RefineryConfig, phase: str) -> Path:
    if phase not in phase_names(cfg):
        raise ValueError(f"no phase {phase!r}; the curriculum's phases are {phase_names(cfg)}")
    return run_base(cfg) / phase


def checkpoints(run_dir: Path) -> CheckpointManager:
    return CheckpointManager(run_dir / CHECKPOINTS_DIR, keep_last=1)


def restore_from_data_root(cfg: RefineryConfig, run_dir: Path) -> None:
    """On a remote data root, bring the phase's run directory to this machine (a step may run in a
    fresh pod); a no-op on a local data root."""
    mirror = RunMirror.for_run(cfg, run_dir)
    if mirror is not None:
        mirror.restore()


def boundary_checkpoint(run_dir: Path, phase: str) -> Path | None:
    """The verified checkpoint written when `phase` closed in `run_dir`, if there is one."""
    manager = checkpoints(run_dir)
    for meta in reversed(manager.complete()):
        if meta.get("boundary") == phase and manager.verify(meta["path"]) is None:
            return Path(meta["path"])
    return None


def resume_argument(cfg: RefineryConfig, phase: str) -> str:
    """What `refinery train --resume` gets for the next launch of `phase`.

    The phase's own latest checkpoint when it has one (a relaunch after a crash continues where the
    last attempt saved); otherwise the previous phase's boundary checkpoint; the first phase with no
    checkpoint starts fresh ("auto" finds nothing to load)."""
    own = phase_run_dir(cfg, phase)
    restore_from_data_root(cfg, own)
    if checkpoints(own).complete():
        return "auto"
    names = phase_names(cfg)
    index = names.index(phase)
    if index == 0:
        return "auto"
    previous = names[index - 1]
    restore_from_data_root(cfg, phase_run_dir(cfg, previous))
    start = boundary_checkpoint(phase_run_dir(cfg, previous), previous)
    if start is None:
        raise PhaseOrderError(
            f"training_run[{phase}] starts from the boundary checkpoint of phase {previous!r}, and "
            f"{phase_run_dir(cfg, previous)} has none; materialize training_run[{previous}] first"
        )
    return str(start)


def phase_start_step(cfg: RefineryConfig, root: "DataRoot", phase: str) -> int:
    """The global step at which `phase` begins, from the phase manifests (the trainer's own plan)."""
    from refinery.curriculum import read_manifest
    from training.schedule import StepSchedule

    manifests = [read_manifest(root, name) for name in phase_names(cfg)]
    schedule = StepSchedule.build(manifests, cfg.training.micro_batch_size * cfg.training.grad_accum_steps)
    return schedule.phase_starts[schedule.phase_names.index(phase)]


def training_progress(cfg: RefineryConfig) -> tuple[str, dict] | None:
    """The furthest-along status among the phase run directories: (phase, status), or None."""
    from training.status import read_status

    best: tuple[str, dict] | None = None
    for name in phase_names(cfg):
        status = read_status(phase_run_dir(cfg, name))
        if status is not None and (best is None or status.get("step", 0) > best[1].get("step", 0)):
            best = (name, status)
    return best


def rescan_due(cfg: RefineryConfig, root: "DataRoot", phase: str) -> tuple[bool, str]:
    """Whether training is within `contamination.sensor_steps_before_anneal` steps of `phase`'s
    first step and has not reached it yet, and a sentence saying where it stands."""
    start = phase_start_step(cfg, root, phase)
    progress = training_progress(cfg)
    if progress is None:
        return False, f"no training run has started; phase {phase!r} begins at step {start}"
    run_phase, status = progress
    step, window = int(status.get("step", 0)), cfg.contamination.sensor_steps_before_anneal
    where = f"training ({run_phase}, {status.get('state')}) is at step {step}; phase {phase!r} begins at step {start}"
    if step >= start:
        return False, where + ", so it is too late to re-scan before it"
    if start - step > window:
        return False, where + f", more than {window} steps away"
    return True, where + f", within {window} steps"
