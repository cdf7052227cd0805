"""The child side of `ablation_runs`: one proxy run (training/proxy_run.py) under Dagster Pipes.

`python -m assets.pipes_ablation --config C --variant V --seed S --resume R` runs what
`python -m training.proxy_run` runs, and sends each step's metrics and every change of the run's
status file to the orchestrator, as `assets/pipes_train.py` does for `training_run`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dagster_pipes import open_dagster_pipes

from assets.pipes_train import PipesForwarder


def main(argv: list[str] | None = None) -> int:
    """`schedule` as the first argument runs one phase of a schedule run (training/schedule_run.py,
    the `ablation_schedule_runs` and `ablation_anneal_runs` assets) instead of a proxy run."""
    from training.proxy_run import main as proxy_run
    from training.schedule_run import main as schedule_run

    args = sys.argv[1:] if argv is None else argv
    entry, args = (schedule_run, args[1:]) if args[:1] == ["schedule"] else (proxy_run, args)
    with open_dagster_pipes() as pipes:
        forwarders: list[PipesForwarder] = []

        def sinks_for(run_dir: Path) -> list[PipesForwarder]:
            forwarders.append(PipesForwarder(pipes, str(run_dir)))
            return forwarders

        code = entry(args, sinks_for)
        for forwarder in forwarders:
            forwarder.send_status()
        pipes.log.info(f"proxy run exited with status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
