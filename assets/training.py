"""`training_run`, per curriculum phase: the curriculum trainer launched through Dagster Pipes.

Each launch runs `python -m assets.pipes_train` (that is, `refinery train`) in a subprocess with
`--stop-after-phase <phase>` in the phase's own run directory: on this machine
(`training.launch: local`, the default) or on a node of the Ray cluster at `execution.address`
(`training.launch: ray`, assets/ray_trainer.py). While it runs, the asset polls the Pipes session and
logs step metrics and status changes; each new checkpoint is recorded as an observation, so the UI
shows progress before the phase ends.

The relaunch loop is training/launcher.py: a launch that dies is relaunched from the latest
checkpoint, at most `training.max_resume_attempts` times, with exponential backoff. A `halted`
status is terminal: the asset fails with the halt reason and `allow_retries=False`, so neither the
loop nor Dagster's run retries resubmit the same exhaustion. All phases share the
`training_accelerator` pool, whose limit of 1 keeps two training runs off one accelerator.
"""

import os
import sys
from pathlib import Path
from typing import Any, Callable

import dagster as dg

from assets.factory import StepResult, global_step_asset
from assets.partitions import Partitions
from assets.pipes_messages import WholeLineMessages
from assets.provenance import Provenance, code_version, image_markdown
from assets.resource import RefineryResource
from refinery.config import RefineryConfig
from refinery.config.training import LAUNCH_FIELDS
from refinery.storage import DataRoot, sha256_file
from refinery.throughput import achieved_share, throughput_contract

POOL = "training_accelerator"
REPO = Path(__file__).resolve().parents[1]


class TrainingRunRefused(dg.Failure):
    """The launch would train on data that is not cleared for it (contamination gate)."""


def contamination_gate(cfg: RefineryConfig, root, phase: str) -> str:
    """Refuse to train a phase whose latest contamination scan is missing, stale or failing."""
    from refinery.contamination_tasks import scan_is_current

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


class PipesLaunch:
    """One launch of the trainer under a Pipes session, as a local subprocess (`run`) or on a Ray
    node (`run_on_ray`): its messages become log lines and, for each new checkpoint, an asset
    observation."""

    def __init__(self, context: dg.AssetExecutionContext):
        self.context = context
        self.status: dict[str, Any] = {}
        self.last_step: dict[str, Any] = {}
        self.checkpoints: list[str] = []
        self.node: str | None = None  # the Ray node it ran on
        self._seen = 0

    def run(self, command: list[str], log_path: Path) -> int:
        from training.launcher import run_logged

        with dg.open_pipes_session(
            context=self.context,
            context_injector=dg.PipesTempFileContextInjector(),
            message_reader=WholeLineMessages(),
        ) as session:
            env = {**os.environ, **session.get_bootstrap_env_vars(), "PYTHONUNBUFFERED": "1"}
            code = run_logged(command, REPO, env, log_path, lambda: self.drain(session))
        self.drain(session)
        return code

    def run_on_ray(self, cfg: RefineryConfig, args: list[str], log_path: Path) -> int:
        from assets.ray_trainer import run_on_ray

        code, self.node = run_on_ray(self.context, cfg, args, log_path, self.drain)
        return code

    def drain(self, session: dg.PipesSession) -> None:
        messages = session.get_custom_messages()
        for message in messages[self._seen:]:
            self._on_message(message)
        self._seen = len(messages)

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


def pipes_child_args(config_path: str, run_dir: Path, phase: str, resume: str) -> list[str]:
    """The interpreter's arguments that run the Pipes child for one launch of `phase`."""
    return ["-m", "assets.pipes_train", "--config", config_path, "--run-dir", str(run_dir),
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
        "data_wait_s": dg.MetadataValue.float(round(sum(r.get("time/data_wait_s", 0.0) for r in records), 3)),
        "step_s": dg.MetadataValue.float(round(sum(r.get("time/step_s", 0.0) for r in records), 3)),
        **({"data_wait_share": dg.MetadataValue.float(round(share, 6))} if share is not None else {}),
    }


def launches_metadata(training, checkpoints: list[str], nodes: list[str]) -> dict[str, Any]:
    """The launches so far, on success and on failure alike; `ray_nodes` ({node id: launches}) when
    they ran on Ray."""
    from refinery.ray_engine import node_summary

    status = training.status
    return {
        "phase": training.phase, "run_dir": str(training.run_dir), "launch_attempts": len(training.attempts),
        "attempts": dg.MetadataValue.json(training.attempts), "checkpoints": dg.MetadataValue.json(checkpoints),
        "state": str(status.get("state")), "reason": str(status.get("reason") or ""),
        **({"ray_nodes": dg.MetadataValue.json(node_summary(nodes))} if nodes else {}),
    }


def throughput_metadata(cfg: RefineryConfig, root: DataRoot, status: dict[str, Any]) -> dict[str, Any]:
    """What the launch achieved per GPU, against the throughput contract when `training.cluster` states one."""
    achieved = status.get("tokens_per_s_per_gpu")
    out: dict[str, Any] = {"tokens_per_s_per_gpu": dg.MetadataValue.float(round(achieved, 1))} if achieved else {}
    cluster = cfg.training.cluster
    if cluster is not None and cfg.curriculum is not None:
        contract = throughput_contract(cfg.curriculum.total_tokens, cluster.gpus, cluster.days, root, list(cfg.buckets))
        out["contract_tokens_per_s_per_gpu"] = dg.MetadataValue.float(round(contract.tokens_per_s_per_gpu, 1))
        if achieved:
            out["share_of_contract"] = dg.MetadataValue.float(round(achieved_share(contract, achieved), 4))
    return out


def boundary_checkpoint_hashes(status: dict[str, Any]) -> dict[str, str]:
    checkpoint = status.get("checkpoint")
    return {str(checkpoint): sha256_file(checkpoint)} if checkpoint and Path(checkpoint).is_file() else {}


def train_through_pipes(context: dg.AssetExecutionContext, cfg: RefineryConfig, run_cfg: RefineryConfig, phase: str,
                        child_args: Callable[[str, Path], list[str]]) -> tuple[Any, list[str], list[str]]:
    """Launch `python <child_args(resume, run_dir)>` (a Pipes child) until `phase` of `run_cfg`
    completes, through training/launcher.py's relaunch loop, on this machine or on a Ray node as
    `cfg.training.launch` says; returns the phase's `PhaseTraining`, the checkpoints the launches
    reported and the Ray nodes they ran on. A phase that cannot complete fails the step with the
    launches' metadata (no retry for a halt or a phase trained out of order)."""
    from training.launcher import PhaseTrainingFailed, train_phase
    from training.phase_runs import PhaseOrderError

    on_ray = cfg.training.launch == "ray"  # the preflight refused it without an address or `ray`
    checkpoints: list[str] = []
    nodes: list[str] = []

    def launch_once(resume: str, log_path: Path) -> tuple[int, dict[str, Any]]:
        launch = PipesLaunch(context)
        args = child_args(resume, log_path.parent)
        code = launch.run_on_ray(cfg, args, log_path) if on_ray else launch.run([sys.executable, *args], log_path)
        checkpoints.extend(c for c in launch.checkpoints if c not in checkpoints)
        nodes.extend([launch.node] if launch.node else [])
        return code, launch.status

    try:
        training = train_phase(run_cfg, phase, launch_once, context.log.info, context.log.warning)
    except PhaseOrderError as e:
        raise dg.Failure(description=str(e), metadata={"phase": phase}, allow_retries=False) from e
    except PhaseTrainingFailed as e:
        raise dg.Failure(
            description=str(e),
            metadata={**launches_metadata(e.training, checkpoints, nodes), "log_file": str(e.training.log_path),
                      "log_tail": dg.MetadataValue.text(e.training.log_tail())},
            allow_retries=e.relaunchable,
        ) from e
    return training, checkpoints, nodes


def train(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, phase = refinery.config, context.partition_key
        context.log.info(f"training_run[{phase}]: {contamination_gate(cfg, refinery.root, phase)}")
        config_path = os.path.abspath(refinery.config_path)
        training, checkpoints, nodes = train_through_pipes(
            context, cfg, cfg, phase, lambda resume, run_dir: pipes_child_args(config_path, run_dir, phase, resume))
        status = training.status
        return StepResult(
            Provenance(version, cfg.training.model_dump(mode="json", exclude=set(LAUNCH_FIELDS)),
                       boundary_checkpoint_hashes(status)),
            {
                **launches_metadata(training, checkpoints, nodes),
                "step": int(status["step"]), "total_steps": int(status["total_steps"]), "tokens": int(status["tokens"]),
                "boundary_checkpoint": str(status.get("checkpoint")),
                **throughput_metadata(cfg, refinery.root, status),
                "per_bucket": dg.MetadataValue.md(phase_summary(status, phase)),
                "summary": dg.MetadataValue.json(status.get("summary") or {}),
                **training_curves(training.run_dir, phase),
            },
        )
    return step


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    if parts.phases is None:
        return dg.Definitions()
    version = code_version(sys.modules[__name__])
    return dg.Definitions(assets=[global_step_asset(
        "training_run", train(version), version=version, group="training", kinds={"pytorch"},
        automation_condition=None, partitions_def=parts.phases, pool=POOL,
        deps=[dg.AssetDep("phase_manifests"), dg.AssetDep("contamination_scan")],
        description="Train the curriculum GPT through this phase, from the previous phase's boundary checkpoint "
                    "(Pipes subprocess, auto-resume, stops on halted).",
    )])
