"""The trainer on a Ray cluster node (`training.launch: ray`), under the same Dagster Pipes session
as a local launch.

One launch is one Ray actor, `TrainerProcess` (assets/trainer_actor.py), placed by Ray on a node
with `training.ray_cpus` CPUs and `training.ray_gpus` GPUs free. The actor starts
`python -m assets.pipes_train ...` as a subprocess on its node; the Pipes context travels in the
environment (`PipesEnvContextInjector`), and the trainer writes its Pipes messages to a file on its
own node, which the actor hands over, with the new output of the trainer's log, each time the asset
polls it (`RelayedMessages`). So nothing is asked of shared storage beyond what the trainer itself
reads and writes (the data root and, on a local data root, the run directory), and no Ray dashboard
or Job Submission API is needed: dagster-ray's `PipesRayJobClient` needs both (docs/scale-out.md
says why we chose this).

The relaunch loop stays training/launcher.py's: a launch ends with the trainer's exit status, and
a launch whose actor or node died ends with `NODE_LOST_EXIT`, which the loop relaunches from the
latest checkpoint (on whichever node Ray picks then). A launch the asset abandons (the run was
terminated, or the step failed) sends the trainer SIGTERM (it finishes its step, checkpoints and
exits) and then kills the actor. Should the actor's process die instead (its node, or the Dagster
process that owns it), Ray sends the trainer SIGTERM, and the trainer's parent watch would too
(training/lifeline.py).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import dagster as dg
from dagster_pipes import PipesDefaultMessageWriter

from assets.trainer_actor import NODE_LOST_EXIT, TrainerProcess
from refinery.config import RefineryConfig

POLL_S = 0.5
# How long a launch waits for a node with the resources it asks for (an autoscaler may be adding
# one) before it fails the step with what it asked for.
PLACEMENT_TIMEOUT_S = 600.0
# The run's own settings (cache folder, S3 endpoint, test switches) go with the launch: the trainer
# on the node must find the run directory where the asset looks for it.
FORWARDED_ENV_PREFIX = "REFINERY_"


class RelayedMessages(dg.PipesMessageReader):
    """The Pipes message reader of a Ray launch: the trainer writes to `path` on its node (the
    default Pipes writer's file mode), and `relay` hands each line the actor brought back to the
    session's handler."""

    def __init__(self, path: str):
        self.path = path
        self.handler = None

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        self.handler = handler
        yield {PipesDefaultMessageWriter.FILE_PATH_KEY: self.path}

    def relay(self, lines: list[str]) -> None:
        for line in lines:
            self.handler.handle_message(json.loads(line))

    def no_messages_debug_text(self) -> str:
        return f"Messages are read from {self.path} on the trainer's Ray node and relayed by its actor."


def forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIX)}


def run_on_ray(context: dg.AssetExecutionContext, cfg: RefineryConfig, args: list[str], log_path: Path,
               drain: Callable[[dg.PipesSession], None]) -> tuple[int, str | None]:
    """Run `python <args>` (the Pipes child) on a node of the cluster at `execution.address` under a
    Pipes session, appending its output to `log_path` here and calling `drain(session)` at every
    poll; returns (its exit status, or `NODE_LOST_EXIT`; the id of the node it ran on)."""
    import ray

    from refinery.ray_engine import connect

    connect(cfg.execution.address)
    tc = cfg.training
    # max_restarts 0: a lost launch is relaunched by the loop from the latest checkpoint, never
    # restarted by Ray from the beginning.
    actor = ray.remote(TrainerProcess).options(num_cpus=tc.ray_cpus, num_gpus=tc.ray_gpus, max_restarts=0).remote()
    node = None
    try:
        try:
            where = ray.get(actor.where.remote(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"no node of the Ray cluster at {cfg.execution.address} had {tc.ray_cpus} CPU(s) and "
                               f"{tc.ray_gpus} GPU(s) free within {PLACEMENT_TIMEOUT_S:g}s (training.ray_cpus, "
                               f"training.ray_gpus)") from None
        node = where["node_id"]
        reader = RelayedMessages(where["messages"])
        with dg.open_pipes_session(context=context, context_injector=dg.PipesEnvContextInjector(),
                                   message_reader=reader) as session:
            env = {**forwarded_env(), **session.get_bootstrap_env_vars(), "PYTHONUNBUFFERED": "1"}
            ray.get(actor.start.remote(args, env))
            return watch(actor, reader, lambda: drain(session), log_path), node
    except ray.exceptions.RayActorError as err:
        context.log.warning(f"the trainer's Ray actor (node {node}) died: {err}")
        return NODE_LOST_EXIT, node
    finally:
        stop(actor, tc.orphan_grace_s if node is not None else None)


def watch(actor, reader: RelayedMessages, drain: Callable[[], None], log_path: Path) -> int:
    """Poll the actor until its trainer exits, relaying messages to `reader` and output to
    `log_path` and calling `drain()` after each poll; returns the exit status."""
    import ray

    with open(log_path, "ab") as log:
        while True:
            code, lines, output = ray.get(actor.poll.remote())
            log.write(output)
            log.flush()
            reader.relay(lines)
            drain()
            if code is not None:
                return code
            time.sleep(POLL_S)


def stop(actor, grace_s: float | None) -> None:
    """Stop the trainer if it still runs (the asset gave up on it), then the actor; `grace_s` None:
    the actor never got a node, so there is no trainer to stop."""
    import ray

    if grace_s is not None:
        try:
            ray.get(actor.stop.remote(grace_s), timeout=grace_s + 30)
        except ray.exceptions.RayError:
            pass  # the actor or its node is gone, and the trainer with it
    ray.kill(actor)
