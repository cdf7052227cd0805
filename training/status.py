"""The run status file, `<run_dir>/status.json`: what an orchestrator reads to decide whether to
resume. `halted` is terminal for auto-resume (gpt-simple's rule): a bucket ran dry, the loss went
non-finite, or a validation loss rose during anneal, and resubmitting the same run would only do it
again. Besides state and reason, `RunStatus` records where the run stands (step, tokens, phase, the
latest checkpoint), `summary` and `mixture` (tokens planned and served per phase and bucket, from
training/accounting.py) and `validation` (the latest per-bucket validation loss).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from refinery.storage import atomic_path, dumps_json

if TYPE_CHECKING:
    from training.accounting import RunAccounting
    from training.checkpoint import Checkpointer
    from training.run_store import RunMirror
    from training.schedule import StepSchedule
    from training.validation import Evaluator

# refused: the trainer would not start or continue (a checkpoint or manifests that do not fit, a
# full disk, a changed shard); nothing is retried until someone acts on the reason.
STATES = ("running", "completed", "halted", "failed", "refused")
STATUS_FILE = "status.json"


def write_status(run_dir: str | Path, state: str, reason: str = "", **fields: Any) -> dict[str, Any]:
    """Replace the status atomically. `fields`: step, phase, checkpoint, tokens, finished, ..."""
    if state not in STATES:
        raise ValueError(f"unknown run state {state!r}; one of {STATES}")
    status = {"state": state, "reason": reason, "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}
    with atomic_path(Path(run_dir) / STATUS_FILE) as tmp:
        tmp.write_bytes(dumps_json(status))
    return status


def record_refusal(run_dir: str | Path, reason: str,
                   write: Callable[[str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Record a refusal (`write(reason)`, by default a bare `refused` status), unless the run's status
    is a halt: that stays on record, and its reason is the refusal's. A damaged status file is left
    as it is for whoever looks into it, and a full disk leaves the old status: the refusal's exit
    code and message stand either way."""
    try:
        previous = read_status(run_dir) or {}
    except StatusFileError:
        return {"state": "refused", "reason": reason}
    if previous.get("state") == "halted":
        return previous
    try:
        return write(reason) if write is not None else write_status(run_dir, "refused", reason)
    except OSError:
        return {"state": "refused", "reason": reason}


class StatusFileError(ValueError):
    """status.json exists but cannot be read; the message names it and says what to do."""


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / STATUS_FILE
    if not path.is_file():
        return None
    try:
        status = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise StatusFileError(
            f"{path} is damaged ({err}); the run's state is in its checkpoints: move the file away and train again "
            "to resume from the latest good checkpoint"
        ) from None
    if not isinstance(status, dict):
        raise StatusFileError(f"{path} holds {type(status).__name__}, not a status object; move it away and train again")
    return status


class RunStatus:
    """status.json of one run, written by rank 0 (other ranks write nothing) from the components that
    own each field, then copied to the data root when that is remote, with the metrics log."""

    def __init__(self, run_dir: Path, rank: int, schedule: "StepSchedule", allow_bucket_exhaustion: bool,
                 accounting: "RunAccounting", evaluator: "Evaluator", checkpointer: "Checkpointer",
                 mirror: "RunMirror | None", metrics_path: Path):
        self.run_dir, self.rank, self.schedule, self.allow = run_dir, rank, schedule, allow_bucket_exhaustion
        self.accounting, self.evaluator, self.checkpointer = accounting, evaluator, checkpointer
        self.mirror, self.metrics_path = mirror, metrics_path

    def write(self, state: str, reason: str, step: int, tokens: int, **extra: Any) -> dict[str, Any]:
        if self.rank != 0:
            return {"state": state, "reason": reason}
        phase = self.schedule.phase_at(min(step, self.schedule.total_steps - 1))
        status = write_status(
            self.run_dir, state, reason, step=step, tokens=tokens, phase=self.schedule.phase_names[phase],
            checkpoint=self.checkpointer.path, total_steps=self.schedule.total_steps,
            allow_bucket_exhaustion=self.allow, summary=self.accounting.summary,
            mixture=self.accounting.mixture_report(), validation=self.evaluator.val_last, **extra,
        )
        if self.mirror is not None:
            self.mirror.push_run_files()
            self.mirror.push_log(self.metrics_path)
        return status
