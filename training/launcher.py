"""Train one curriculum phase in a subprocess, relaunched from its latest checkpoint when it dies.

A launch that dies (crash, SIGKILL, OOM, preemption: any exit status but 0, 2 and 3) is relaunched
from the latest checkpoint, at most `training.max_resume_attempts` times, with exponential backoff
from `training.resume_backoff_s`. A halt or a refusal (exit status `EXIT_HALTED`) and a config or
input problem (2) are terminal and never relaunched: the same exhaustion, the same checkpoint that
does not fit, would only come back. Each launch runs in the
phase's run directory (training/phase_runs.py) and writes `launch-<n>.log` there.

The caller says how one launch runs (the `training_run` asset wraps it in a Dagster Pipes session
and launches the Pipes child) and where messages go; this module knows nothing of Dagster.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from refinery.config import RefineryConfig
from training.cli import EXIT_HALTED
from training.phase_runs import phase_run_dir, resume_argument
from training.status import StatusFileError, read_status

POLL_S = 0.5
LOG_TAIL_CHARS = 2000
EXIT_INPUT = 2  # `refinery train`: a config or input problem, nothing trained


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"

# One launch: (resume argument, log path) -> (exit code, the last status the launch reported, the
# fallback when the run directory has no status file).
LaunchOnce = Callable[[str, Path], tuple[int, dict[str, Any]]]


@dataclass
class PhaseTraining:
    """Where a phase's training stands after its launches: the run directory, the final status, one
    record per launch attempt, and the last launch's log."""

    phase: str
    run_dir: Path
    status: dict[str, Any]
    attempts: list[dict[str, Any]]
    log_path: Path

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if self.log_path.is_file() else ""


class PhaseTrainingFailed(RuntimeError):
    """The phase did not complete; `training` says how far it got. `relaunchable` is false for a halt."""

    def __init__(self, message: str, training: PhaseTraining, relaunchable: bool):
        super().__init__(message)
        self.training, self.relaunchable = training, relaunchable


def run_logged(command: list[str], cwd: Path, env: dict[str, str], log_path: Path, poll: Callable[[], None]) -> int:
    """Run `command` with its output appended to `log_path`, calling `poll()` every `POLL_S` while it
    runs and once more after it exits; returns its exit code."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        while True:
            code = proc.poll()
            poll()
            if code is not None:
                return code
            time.sleep(POLL_S)


def train_phase(cfg: RefineryConfig, phase: str, launch_once: LaunchOnce, log: Callable[[str], None],
                warn: Callable[[str], None], sleep: Callable[[float], None] = time.sleep) -> PhaseTraining:
    """Launch until the phase completes; raises `PhaseTrainingFailed` on a halt or when the
    relaunches run out, and `training.phase_runs.PhaseOrderError` when an earlier phase must train first."""
    tc = cfg.training
    run_dir = phase_run_dir(cfg, phase)
    run_dir.mkdir(parents=True, exist_ok=True)
    attempts: list[dict[str, Any]] = []
    while True:
        resume = resume_argument(cfg, phase)
        attempt = len(attempts) + 1
        log_path = run_dir / f"launch-{attempt}.log"
        log(f"training_run[{phase}]: launch attempt {attempt} (resume from {resume})")
        code, reported = launch_once(resume, log_path)
        try:
            status = read_status(run_dir) or reported
        except StatusFileError:
            status = reported
        attempts.append({"attempt": attempt, "resume": resume, "exit_code": code, "state": status.get("state"),
                         "step": status.get("step"), "reason": status.get("reason")})
        training = PhaseTraining(phase, run_dir, status, attempts, log_path)
        if code == 0 and status.get("state") == "completed":
            return training
        if code in (EXIT_HALTED, EXIT_INPUT):
            what = {EXIT_INPUT: "stopped on a config or input problem"}.get(code, str(status.get("state") or "refused"))
            reason = status.get("reason") if code == EXIT_HALTED and status.get("reason") else last_line(training.log_tail())
            raise PhaseTrainingFailed(f"training_run[{phase}] {what}: {reason} (log: {log_path})", training,
                                      relaunchable=False)
        if len(attempts) > tc.max_resume_attempts:
            raise PhaseTrainingFailed(
                f"training_run[{phase}] died {len(attempts)} times (limit training.max_resume_attempts="
                f"{tc.max_resume_attempts}); last exit code {code}", training, relaunchable=True)
        backoff = tc.resume_backoff_s * 2 ** (len(attempts) - 1)
        warn(f"training_run[{phase}]: trainer exited with {code} at step {status.get('step')}; "
             f"relaunching from the latest checkpoint in {backoff:.1f}s")
        sleep(backoff)
