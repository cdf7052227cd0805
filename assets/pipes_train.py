"""The child side of `training_run`: `refinery train` under Dagster Pipes.

`python -m assets.pipes_train [refinery train options]` runs exactly what `refinery train`
runs, and sends each step's metrics and every change of the run's status file (state, step,
checkpoint path) to the orchestrator as Pipes custom messages, so the asset shows progress while
the trainer runs. It imports `dagster_pipes` (the small protocol package), never `dagster`, and
`training/` knows nothing of either.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dagster_pipes import PipesContext, open_dagster_pipes

STEP_KEYS = ("step", "phase_name", "tokens", "lr", "loss/total", "time/data_wait_s", "time/step_s")
STEP_PREFIXES = ("loss/", "tokens/", "event/")


class PipesForwarder:
    """A metrics sink: each step's headline metrics, plus the status file whenever it changed."""

    def __init__(self, pipes: PipesContext, run_dir: str):
        self.pipes, self.run_dir = pipes, run_dir
        self._last_status: dict[str, Any] | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        step = {k: v for k, v in record.items() if k in STEP_KEYS or k.startswith(STEP_PREFIXES)}
        self.pipes.report_custom_message({"kind": "step", **step})
        self.send_status()

    def send_status(self) -> None:
        from training.status import read_status

        status = read_status(self.run_dir)
        if status is None:
            return
        comparable = {k: v for k, v in status.items() if k != "updated"}
        if comparable != self._last_status:
            self._last_status = comparable
            self.pipes.report_custom_message({"kind": "status", **status})


def train_parser() -> argparse.ArgumentParser:
    from training.cli import register

    parser = argparse.ArgumentParser(prog="python -m assets.pipes_train")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    from refinery.config import load_config
    from training.cli import run_train
    from training.trainer import RunOptions, run_dir_of

    args = train_parser().parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    run_dir = str(run_dir_of(load_config(args.config), RunOptions(run_dir=args.run_dir)))
    with open_dagster_pipes() as pipes:
        forwarder = PipesForwarder(pipes, run_dir)
        code = run_train(args, sinks=[forwarder])
        forwarder.send_status()
        pipes.log.info(f"refinery train exited with status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
