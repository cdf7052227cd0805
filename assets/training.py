"""`training_run`, per curriculum phase: the curriculum trainer launched through Dagster Pipes.

Each launch runs `python -m orchestration.pipes_train` (that is, `refinery train`) in a subprocess
with `--stop-after-phase <phase>` in the phase's own run directory. While it runs, the asset polls
the Pipes session and logs step metrics and status changes; each new checkpoint is recorded as an
observation, so the UI shows progress before the phase ends.

Auto-resume: a launch that dies (crash, SIGKILL, OOM, preemption) is relaunched from the latest
checkpoint, at most `training.max_resume_attempts` times, with exponential backoff. A `halted`
status is terminal: the asset fails with the halt reason and `allow_retries=False`, so neither this
loop nor Dagster's run retries resubmit the same exhaustion. All phases share the
`training_accelerator` pool, whose limit of 1 keeps two training runs off one accelerator.
"""

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg

from assets.factory import code_version, image_markdown
from orchestration.resources import RefineryResource
from refinery.config import RefineryConfig

POOL = "training_accelerator"
POLL_S = 0.5
EXIT_HALTED = 3  # training/cli.py: halted, or resume refused
LOG_TAIL_CHARS = 2000
REPO = Path(__file__).resolve().parents[1]


class TrainingRunRefused(dg.Failure):
    """The launch would train on data that is not cleared for it (contamination gate)."""


def contamination_gate(cfg: RefineryConfig, root, phase: str) -> str:
    """Refuse to train a phase whose latest contamination scan is missing, stale or failing."""
    from refinery.contamination import scan_is_current

    if not cfg.contamination.eval_sets:
        return "no eval sets configured; contamination gate not applied"
    current, why = scan_is_current(cfg, root, phase)
    if not current:
        raise TrainingRunRefused(
            description=f"training_run[{phase}] refused: {why}",
            metadata={"phase": phase, "reason": why},
            allow_retries=False,
        )
    return f"latest contamination scan of {phase!r} is current and passing"


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if path.is_file() else ""


class Launch:
    """One subprocess of the trainer under a Pipes session, polled until it exits."""

    def __init__(self, context: dg.AssetExecutionContext, command: list[str], log_path: Path):
        self.context, self.command, self.log_path = context, command, log_path
        self.status: dict[str, Any] = {}
        self.last_step: dict[str, Any] = {}
        self.checkpoints: list[str] = []

    def run(self) -> int:
        context = self.context
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesTempFileContextInjector(),
            message_reader=dg.PipesTempFileMessageReader(),
        ) as session:
            env = {**os.environ, **session.get_bootstrap_env_vars(), "PYTHONUNBUFFERED": "1"}
            with open(self.log_path, "ab") as log:
                proc = subprocess.Popen(self.command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
                seen = 0
                while True:
                    code = proc.poll()
                    messages = session.get_custom_messages()
                    for message in messages[seen:]:
                        self._on_message(message)
                    seen = len(messages)
                    if code is not None:
                        break
                    time.sleep(POLL_S)
        for message in session.get_custom_messages()[seen:]:
            self._on_message(message)
        return code

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "step":
            self.last_step = message
        elif kind == "status":
            self.status = message
            checkpoint = message.get("checkpoint")
            if checkpoint and checkpoint not in self.checkpoints:
                self.checkpoints.append(checkpoint)
                self.context.log_event(dg.AssetObservation(
                    asset_key=self.context.asset_key, partition=self.context.partition_key,
                    metadata={"step": message.get("step"), "checkpoint": checkpoint,
                              "loss": self.last_step.get("loss/total"), "tokens": message.get("tokens")},
                ))
            self.context.log.info(
                f"training {message.get('state')} at step {message.get('step')}/{message.get('total_steps')} "
                f"(phase {message.get('phase')}, loss {self.last_step.get('loss/total')}, checkpoint {checkpoint})"
            )


def launch_command(config_path: str, run_dir: Path, phase: str, resume: str) -> list[str]:
    return [sys.executable, "-m", "orchestration.pipes_train", "--config", config_path, "--run-dir", str(run_dir),
            "--stop-after-phase", phase, "--resume", resume]


def phase_summary(status: dict[str, Any], phase: str) -> str:
    rows = ["| bucket | tokens | loss |", "| --- | ---: | ---: |"]
    for bucket, acc in sorted(((status.get("summary") or {}).get(phase) or {}).items()):
        loss = f"{acc['loss_sum'] / acc['targets']:.4f}" if acc["targets"] else "-"
        rows.append(f"| {bucket} | {int(acc['tokens']):,} | {loss} |")
    return "\n".join(rows)


def training_curves(run_dir: Path, phase: str) -> dict[str, Any]:
    """The phase's loss per bucket over steps (a plot) and its data-wait share, from metrics.jsonl."""
    from training.metrics import JsonLines, data_wait_share, loss_by_bucket_png

    records = [r for r in JsonLines(run_dir / "metrics.jsonl").read() if r.get("phase_name") == phase]
    if not records:
        return {}
    share = data_wait_share(records)
    title = f"training loss per bucket, phase {phase} (steps {records[0]['step']}-{records[-1]['step']})"
    return {
        "loss_plot": image_markdown(loss_by_bucket_png(records, title), title,
                                    f"`loss/<bucket>` from `{run_dir / 'metrics.jsonl'}`; dashed: the total"),
        "data_wait_share": dg.MetadataValue.float(round(share, 6)) if share is not None else dg.MetadataValue.text("n/a"),
        "data_wait_s": dg.MetadataValue.float(round(sum(r.get("time/data_wait_s", 0.0) for r in records), 3)),
        "step_s": dg.MetadataValue.float(round(sum(r.get("time/step_s", 0.0) for r in records), 3)),
    }


def train_phase(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
    from training.phase_runs import PhaseOrderError, phase_run_dir, resume_argument
    from training.status import read_status

    cfg, phase = refinery.config, context.partition_key
    gate = contamination_gate(cfg, refinery.root, phase)
    context.log.info(f"training_run[{phase}]: {gate}")
    run_dir = phase_run_dir(cfg, phase)
    run_dir.mkdir(parents=True, exist_ok=True)
    tc = cfg.training
    attempts: list[dict[str, Any]] = []
    checkpoints: list[str] = []
    while True:
        try:
            resume = resume_argument(cfg, phase)
        except PhaseOrderError as e:
            raise dg.Failure(description=str(e), metadata={"phase": phase}, allow_retries=False) from e
        attempt = len(attempts) + 1
        log_path = run_dir / f"launch-{attempt}.log"
        context.log.info(f"training_run[{phase}]: launch attempt {attempt} (resume from {resume})")
        launch = Launch(context, launch_command(os.path.abspath(refinery.config_path), run_dir, phase, resume), log_path)
        code = launch.run()
        checkpoints += [c for c in launch.checkpoints if c not in checkpoints]
        status = read_status(run_dir) or launch.status
        attempts.append({"attempt": attempt, "resume": resume, "exit_code": code, "state": status.get("state"),
                         "step": status.get("step"), "reason": status.get("reason")})
        metadata = {
            "phase": phase, "run_dir": str(run_dir), "launch_attempts": len(attempts),
            "attempts": dg.MetadataValue.json(attempts), "checkpoints": dg.MetadataValue.json(checkpoints),
            "state": str(status.get("state")), "reason": str(status.get("reason") or ""),
        }
        if code == 0 and status.get("state") == "completed":
            break
        if code == EXIT_HALTED:
            raise dg.Failure(
                description=f"training_run[{phase}] halted: {status.get('reason') or _tail(log_path)}",
                metadata={**metadata, "log_tail": dg.MetadataValue.text(_tail(log_path))},
                allow_retries=False,
            )
        if len(attempts) > tc.max_resume_attempts:
            raise dg.Failure(
                description=f"training_run[{phase}] died {len(attempts)} times (limit training.max_resume_attempts="
                            f"{tc.max_resume_attempts}); last exit code {code}",
                metadata={**metadata, "log_tail": dg.MetadataValue.text(_tail(log_path))},
            )
        backoff = tc.resume_backoff_s * 2 ** (len(attempts) - 1)
        context.log.warning(f"training_run[{phase}]: trainer exited with {code} at step {status.get('step')}; "
                            f"relaunching from the latest checkpoint in {backoff:.1f}s")
        time.sleep(backoff)
    return dg.MaterializeResult(metadata={
        **metadata,
        "step": int(status["step"]), "total_steps": int(status["total_steps"]), "tokens": int(status["tokens"]),
        "boundary_checkpoint": str(status.get("checkpoint")),
        "per_bucket": dg.MetadataValue.md(phase_summary(status, phase)),
        "summary": dg.MetadataValue.json(status.get("summary") or {}),
        **training_curves(run_dir, phase),
    })


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    if parts.phases is None:
        return dg.Definitions()

    @dg.asset(
        name="training_run",
        partitions_def=parts.phases,
        deps=[dg.AssetDep("phase_manifests"), dg.AssetDep("contamination_scan")],
        group_name="training",
        pool=POOL,
        kinds={"pytorch"},
        code_version=code_version(sys.modules[__name__]),
        description="Train the curriculum GPT through this phase, from the previous phase's boundary checkpoint "
                    "(Pipes subprocess, auto-resume, stops on halted).",
    )
    def training_run(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        return train_phase(context, refinery)

    return dg.Definitions(assets=[training_run])
