"""A schedule variant's or an anneal branch's proxy run (refinery/ablations/schedules.py): each
phase `refinery train` on the config `run_config` derives, stopping at the phase's boundary, then,
after the last phase, the model's bits per byte on the evaluation set (training/proxy_run.py's
`train_and_evaluate`).

Each phase trains in a run directory of its own and starts from the previous phase's boundary
checkpoint, as `training_run` chains phases (training/phase_runs.py `resume_argument`): so an
anneal branch, whose phases before the last are its seed's curriculum run's, starts from that run's
pre-anneal boundary checkpoint, read and never written, and a killed phase resumes from its own
latest checkpoint. An anneal branch's results name the sha256 of the checkpoint it started from.

`python -m training.schedule_run --config C --kind schedule|anneal --name N --seed S --phase P` trains
from P (`first_unfinished`) through the last phase
(the Dagster asset launches it through Pipes, assets/pipes_ablation.py). Exit status as
`refinery train`: 0 done, 2 a config or input problem, 3 halted or refused, 1 failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from refinery.config import RefineryConfig


def pre_anneal_checkpoint(vcfg: RefineryConfig) -> Path | None:
    """The boundary checkpoint an anneal branch of `vcfg` starts from: its curriculum run's, of the
    phase before the last."""
    from training.phase_runs import boundary_checkpoint, phase_run_dir

    assert vcfg.curriculum is not None
    before = vcfg.curriculum.phases[-2].name
    return boundary_checkpoint(phase_run_dir(vcfg, before), before)


def first_unfinished(vcfg: RefineryConfig, kind: str) -> str:
    """The phase a launch starts from: the first whose run directory holds no boundary checkpoint
    of it (an anneal branch trains only its last), or the last one when every phase has finished."""
    from refinery.ablations.schedules import ANNEAL
    from training.phase_runs import boundary_checkpoint, phase_run_dir

    assert vcfg.curriculum is not None
    names = [p.name for p in vcfg.curriculum.phases]
    if kind == ANNEAL:
        return names[-1]
    return next((n for n in names if boundary_checkpoint(phase_run_dir(vcfg, n), n) is None), names[-1])


def run_from(cfg: RefineryConfig, kind: str, name: str, seed: int, phase: str, resume: str = "auto",
             sinks_for: Callable[[Path], list] | None = None) -> int:
    """Train run `kind`/`name` with `seed` under the main config `cfg` from `phase` (started from
    `resume`) through its last phase, each later phase from where `training_run` would start it,
    then score the model; returns the exit status of the first launch that did not finish (or 0).
    One process for every phase: a launch costs more than a short phase trains."""
    from refinery.ablations.eval_set import EVAL_DOCUMENTS_KEY, eval_documents
    from refinery.ablations.report import results_key
    from refinery.ablations.schedule_runs import run_config
    from refinery.ablations.schedules import ANNEAL, run_name
    from refinery.storage import open_data_root, sha256_file
    from training.cli import run_train
    from training.phase_runs import phase_run_dir, resume_argument
    from training.proxy_run import RESULTS_FORMAT, train_and_evaluate, train_args

    root = open_data_root(cfg.resolve(cfg.data_root))
    vcfg = run_config(root, cfg, kind, name, seed)
    names = [p.name for p in vcfg.curriculum.phases]
    for current in names[names.index(phase):]:
        start = resume if current == phase else resume_argument(vcfg, current)
        sinks = sinks_for(phase_run_dir(vcfg, current)) if sinks_for else None
        if current != names[-1]:
            code = run_train(train_args(vcfg, start, current), sinks=sinks, cfg=vcfg)
            if code:
                return code
            continue
        identity = {"variant": run_name(kind, name), "seed": seed, "eval_set_sha256": root.sha256(EVAL_DOCUMENTS_KEY),
                    "results_format": RESULTS_FORMAT}
        if kind == ANNEAL:
            before = pre_anneal_checkpoint(vcfg)
            if before is None:
                raise FileNotFoundError(f"anneal branch {name!r}, seed {seed}: the curriculum run has no pre-anneal "
                                        f"boundary checkpoint; train the curriculum schedule first")
            identity["start_checkpoint_sha256"] = sha256_file(before)
        return train_and_evaluate(vcfg, root, results_key(run_name(kind, name), seed), identity,
                                  lambda: eval_documents(root), start, sinks)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.schedule_run",
                                description="Train one phase of a schedule variant or an anneal branch with one seed; "
                                            "after its last phase, score it in bits per byte.")
    p.add_argument("--config", required=True, help="the run's YAML config, with an `ablations` section")
    p.add_argument("--kind", required=True, choices=["schedule", "anneal"])
    p.add_argument("--name", required=True, help="a name under ablations.schedules or ablations.anneal_search.mixtures")
    p.add_argument("--seed", type=int, required=True, help="the run's seed (0 .. ablations.seeds - 1)")
    p.add_argument("--phase", required=True, help="the derived curriculum's phase to start from (through the last)")
    p.add_argument("--resume", default="auto", help="as `refinery train --resume` (default auto)")
    return p


def main(argv: list[str] | None = None, sinks_for: Callable[[Path], list] | None = None) -> int:
    """The command line; `sinks_for(run_dir)` gives the metrics sinks (the Pipes child's forwarder)."""
    from refinery.config import ConfigError, load_config
    from training.launcher import EXIT_INPUT

    args = parser().parse_args(argv)
    try:
        cfg = load_config(args.config)
        return run_from(cfg, args.kind, args.name, args.seed, args.phase, args.resume, sinks_for)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"schedule run: {err}", file=sys.stderr)
        return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
