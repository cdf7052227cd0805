"""`refinery train`: run (or resume) the curriculum trainer and print per-phase, per-bucket loss and
tokens served against tokens planned. Exit status: 0 completed, 2 an invalid curriculum or one that
differs from the phase manifests (nothing trained), 3 halted or refused (one line says why and what
to do; status.json says it too, unless another trainer holds the run directory), 1 failed. A launcher
relaunches only on 1 or a signal: a refusal or a halt would only happen again."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from refinery.config import RefineryConfig
    from training.metrics import MetricsSink

EXIT_HALTED = 3


def register(subparsers: argparse._SubParsersAction) -> None:
    from refinery.preflight import Needs

    p = subparsers.add_parser(
        "train", help="train the GPT through the curriculum's phases (resumable)",
        description="Train the GPT of training.model through the curriculum's phases, reading the phase manifests "
                    "and final shards the graph wrote under the data root, never replaying or "
                    "skipping a token. Checkpoints every training.checkpoint_interval steps and at each phase boundary, "
                    "resumes from the latest good one, halts with a reason when a bucket runs dry. Prints tokens "
                    "served against planned and the loss per phase and bucket. Exit 0 completed, 2 an invalid "
                    "config or curriculum (nothing trained), 3 halted or refused, 1 failed.",
        epilog="examples:\n  refinery train --config configs/demo.yaml\n"
               "  refinery train --config configs/demo.yaml --stop-after-phase main --json",
    )
    p.add_argument("--config", required=True, help="the run's YAML config (e.g. configs/demo.yaml)")
    p.add_argument("--resume", default="auto",
                   help="auto (latest good checkpoint of the run; default), never, or a checkpoint path to start from "
                        "(e.g. the previous phase's boundary checkpoint)")
    p.add_argument("--stop-after-phase", default=None, metavar="PHASE",
                   help="stop once this phase's boundary checkpoint is written (status completed, not finished)")
    p.add_argument("--run-dir", default=None, help="override data_root/training.run_dir")
    p.add_argument("--num-workers", type=int, default=None, help="loader worker processes per rank (default: config)")
    p.add_argument("--simulate-world-size", type=int, default=1, metavar="W",
                   help="run the data path of W ranks in this one process (exactly-once resume testing)")
    p.add_argument("--fresh", action="store_true",
                   help="archive the run directory (to <run_dir>.archived-<time>, with its copy on a remote data root) "
                        "and start the run over")
    p.add_argument("--json", action="store_true", help="print the final status as JSON")
    # With --run-dir elsewhere the data root is only read (a read-only mount of the shards).
    p.set_defaults(func=run_train, needs=lambda args: Needs(curriculum=True, writes=args.run_dir is None))


def summary_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per phase and bucket: tokens planned by the curriculum, tokens served, mean loss."""
    mixture = status.get("mixture") or {}
    rows = []
    for phase, buckets in (status.get("summary") or {}).items():
        for bucket, acc in sorted(buckets.items()):
            loss = acc["loss_sum"] / acc["targets"] if acc["targets"] else None
            planned = mixture.get(phase, {}).get(bucket, {}).get("planned")
            rows.append({"phase": phase, "bucket": bucket, "tokens": int(acc["tokens"]), "planned": planned, "loss": loss})
    return rows


def format_table(status: dict[str, Any]) -> str:
    rows = summary_rows(status)
    lines = [f"{'phase':<12} {'bucket':<10} {'tokens':>12} {'planned':>12} {'loss':>8}"]
    for r in rows:
        loss = f"{r['loss']:.4f}" if r["loss"] is not None else "-"
        planned = f"{r['planned']:,.0f}" if r["planned"] is not None else "-"
        lines.append(f"{r['phase']:<12} {r['bucket']:<10} {r['tokens']:>12,} {planned:>12} {loss:>8}")
    lines.append(f"state: {status['state']} at step {status.get('step')} of {status.get('total_steps')}"
                 f"{' (' + status['reason'] + ')' if status.get('reason') else ''}")
    return "\n".join(lines)


def phase_label(names: list[str], phase: int, stop_after: str | None) -> str:
    """`phase 2/4 main`: the phase among those this invocation runs up to (all, or through --stop-after-phase)."""
    last = names.index(stop_after) + 1 if stop_after in names else len(names)
    return f"phase {phase + 1}/{last} {names[phase]}"


def run_train(args: argparse.Namespace, sinks: list[MetricsSink] | None = None, cfg: RefineryConfig | None = None) -> int:
    """`sinks` receive every step's metrics (assets/pipes_train.py forwards them over Dagster Pipes);
    `cfg`, when given, is trained instead of the file `args.config` names (an ablation's proxy run
    trains a config derived from the file's, training/proxy_run.py)."""
    from refinery.config import load_config
    from refinery.curriculum import ManifestError
    from refinery.progress import Progress
    from refinery.shard_format import ShardFormatError
    from training.checkpoint import DiskFull, ResumeRefused
    from training.run_lock import RunLocked
    from training.run_store import archive_run
    from training.status import StatusFileError, record_refusal
    from training.trainer import RunOptions, Trainer, run_dir_of

    # What a relaunch would meet again: a checkpoint or manifests that do not fit, the run directory
    # held by another trainer, a full disk, a shard changed since validation, a damaged status file.
    REFUSALS = (ResumeRefused, RunLocked, DiskFull, ShardFormatError, StatusFileError)

    cfg = cfg if cfg is not None else load_config(args.config)
    options = RunOptions(resume=args.resume, stop_after_phase=args.stop_after_phase, run_dir=args.run_dir,
                         simulate_world_size=args.simulate_world_size, num_workers=args.num_workers,
                         sinks=list(sinks or []))
    if args.fresh:
        archived = archive_run(cfg, run_dir_of(cfg, options))
        if archived:
            print(f"refinery train: archived the previous run to {archived}")
    try:
        trainer = Trainer(cfg, options)
    except ManifestError as err:
        print(f"refinery train: {err}", file=sys.stderr)
        return 2
    except REFUSALS as err:  # found as the data opens: an ordered phase's band file changed since validation
        reason = " ".join(str(err).split())
        run_dir = run_dir_of(cfg, options)
        if not isinstance(err, RunLocked) and run_dir.is_dir():
            record_refusal(run_dir, reason)
        print(f"refinery train: refused: {reason}", file=sys.stderr)
        return EXIT_HALTED
    schedule = trainer.schedule
    names = schedule.phase_names
    if args.stop_after_phase is not None and args.stop_after_phase not in names:
        trainer.close()
        print(f"refinery train: --stop-after-phase {args.stop_after_phase!r}: no such phase; one of {names}", file=sys.stderr)
        return 2
    # The bar ends where this invocation stops: the end of --stop-after-phase, or of the curriculum.
    last = names.index(args.stop_after_phase) + 1 if args.stop_after_phase else len(names)
    bar = Progress(schedule.phase_starts[last], desc="refinery train", unit="step")

    def progress(record: dict[str, Any]) -> None:
        bar.describe(f"refinery train {phase_label(names, record['phase'], args.stop_after_phase)}")
        bar.update(record["step"] - bar.done)

    if trainer.dist.rank == 0:
        trainer.metrics.sinks.append(progress)
    try:
        status = trainer.train()
    except REFUSALS as err:
        reason = " ".join(str(err).split())  # one line
        if not isinstance(err, RunLocked):  # another trainer's status is not ours to write
            trainer.refuse(reason)
        print(f"refinery train: refused: {reason}", file=sys.stderr)
        return EXIT_HALTED
    finally:
        bar.close()
        trainer.close()
    if trainer.dist.rank == 0:
        if args.json:
            print(json.dumps({**status, "phases": summary_rows(status)}, sort_keys=True))
        else:
            print(format_table(status))
    return {"completed": 0, "halted": EXIT_HALTED}.get(status["state"], 1)
