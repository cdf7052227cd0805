"""The child side of `ablation_runs`: one proxy run (training/proxy_run.py) under Dagster Pipes.

`python -m assets.pipes_ablation --config C --variant V --seed S --resume R` runs what
`python -m training.proxy_run` runs, and sends each step's metrics and every change of the run's
status file to the orchestrator, as `assets/pipes_train.py` does for `training_run`.
"""

from __future__ import annotations

import sys

from dagster_pipes import open_dagster_pipes

from assets.pipes_train import PipesForwarder


def main(argv: list[str] | None = None) -> int:
    from refinery.ablations.build import variant_config
    from refinery.config import load_config
    from training.proxy_run import parser, proxy_run_dir, run_proxy

    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    cfg = load_config(args.config)
    run_dir = str(proxy_run_dir(variant_config(cfg, args.variant, args.seed)))
    with open_dagster_pipes() as pipes:
        forwarder = PipesForwarder(pipes, run_dir)
        code = run_proxy(cfg, args.variant, args.seed, args.resume, sinks=[forwarder])
        forwarder.send_status()
        pipes.log.info(f"proxy run {args.variant} seed {args.seed} exited with status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
