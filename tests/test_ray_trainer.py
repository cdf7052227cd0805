"""`training_run` with `training.launch: ray`: the trainer runs on a node of the session's three-node
Ray cluster (`ray_cluster`) under Dagster Pipes, is relaunched from its checkpoint after a SIGKILL
with every step trained once, and a halt fails the asset with its reason and no relaunch. Below the
asset: a launch whose actor dies ends as a SIGKILL (relaunched), a launch the asset abandons stops
its trainer, and the actor hands over whole message lines."""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from pathlib import Path

import dagster as dg
import pytest

from assets.ray_trainer import run_on_ray
from assets.trainer_actor import NODE_LOST_EXIT
from refinery.config import load_config
from refinery.storage import LocalDataRoot
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, tiny_run
from training.metrics import JsonLines
from training.phase_runs import phase_run_dir, phase_start_step

from helpers import processes
from helpers.kill_hook import kill_at_step_env
from helpers.materialize import materialize_in_workspace

TRAINING = {"record_consumption": True, "resume_backoff_s": 0.01, "launch": "ray"}


def on_cluster(config: Path, address: str) -> Path:
    """The config with `execution.address` set (the engine of the data steps stays local: only the
    trainer goes to the cluster)."""
    config.write_text(config.read_text() + f"execution:\n  address: '{address}'\n")
    return config


def materialization(result: dg.ExecuteInProcessResult) -> dict:
    [event] = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


def step_failure(result: dg.ExecuteInProcessResult):
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    return failure.step_failure_data


@pytest.mark.slow
def test_trainer_on_a_ray_node_is_relaunched_after_sigkill_and_trains_every_step_once(tmp_path, monkeypatch,
                                                                                      ray_cluster):
    config = on_cluster(tiny_run(tmp_path, training=TRAINING), ray_cluster.address)
    cfg = load_config(config)
    end = phase_start_step(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), "main")  # warmup's last step
    kill_at = 2 * cfg.training.checkpoint_interval  # a checkpoint step: the relaunch resumes past it
    assert kill_at < end
    for name, value in kill_at_step_env(kill_at).items():  # REFINERY_* settings travel with the launch
        monkeypatch.setenv(name, value)

    with dg.instance_for_test() as instance:
        result = materialize_in_workspace(config, instance, "training_run", "warmup")
        assert result.success
        observed = [e for e in instance.all_logs(result.run_id) if e.dagster_event and
                    e.dagster_event.event_type == dg.DagsterEventType.ASSET_OBSERVATION]
    meta = materialization(result)
    assert meta["launch_attempts"] == 2
    first, second = meta["attempts"]
    assert first["exit_code"] == -9 and first["step"] == kill_at
    assert second["resume"] == "auto" and second["state"] == "completed"
    assert meta["step"] == end and meta["state"] == "completed"
    assert meta["boundary_checkpoint"].endswith(f"step-{end:08d}.pt") and Path(meta["boundary_checkpoint"]).is_file()
    assert meta["boundary_checkpoint"] in meta["checkpoints"] and len(observed) == len(meta["checkpoints"])
    nodes = meta["ray_nodes"]
    assert sum(nodes.values()) == 2 and set(nodes) <= set(ray_cluster.node_ids()), "both launches ran on cluster nodes"
    run_dir = phase_run_dir(cfg, "warmup")
    steps = [r["step"] for r in JsonLines(run_dir / "consumption-rank0.jsonl").read()]
    assert steps == list(range(1, end + 1)), "0 replayed, 0 skipped"


# math holds ~6 x 30 tokens and may be read once, but half of the phase's 3072 tokens are asked of it
OVER_DEMAND = dict(
    buckets={"web": SyntheticBucket(200, 60), "math": SyntheticBucket(6, 30, max_epochs=1)},
    phases=[SyntheticPhase("main", 3072, {"web": 0.5, "math": 0.5}, seq_len=32)],
)


@pytest.mark.slow
def test_halted_trainer_on_a_ray_node_fails_the_asset_with_its_reason_and_is_not_relaunched(tmp_path, ray_cluster):
    config = on_cluster(tiny_run(tmp_path, training={**TRAINING, "max_resume_attempts": 3}, **OVER_DEMAND),
                        ray_cluster.address)
    with dg.instance_for_test() as instance:
        result = materialize_in_workspace(config, instance, "training_run", "main")
    assert not result.success
    failure = step_failure(result)
    assert "training_run[main] halted: bucket_exhausted" in failure.error.message
    assert "bucket 'math' ran dry" in failure.error.message
    meta = failure.user_failure_data.metadata
    assert meta["launch_attempts"].value == 1 and meta["state"].value == "halted"
    assert set(meta["ray_nodes"].value) <= set(ray_cluster.node_ids())
    run_dir = phase_run_dir(load_config(config), "main")
    assert sorted(p.name for p in run_dir.glob("launch-*.log")) == ["launch-1.log"]
    assert json.loads((run_dir / "status.json").read_text())["halt_kind"] == "bucket_exhausted"


class AssetStopped(Exception):
    """What a step's interruption raises inside the launch, here raised by the test's drain."""


def launch_in_an_asset(cfg, args: list[str], log_path: Path, drain) -> dict:
    """`run_on_ray` inside a materialized asset (it needs a real asset context): {"result": what it
    returned} or {"raised": the AssetStopped that left it}."""
    outcome: dict = {}

    @dg.asset
    def launch(context):  # unannotated: this module's annotations are strings, which Dagster refuses
        try:
            outcome["result"] = run_on_ray(context, cfg, args, log_path, drain)
        except AssetStopped as stopped:
            outcome["raised"] = stopped
        return dg.MaterializeResult()  # a step that opened a Pipes session must report a result

    assert dg.materialize([launch]).success
    return outcome


@pytest.mark.slow
def test_a_lost_actor_ends_the_launch_as_a_sigkill_and_an_abandoned_launch_stops_its_trainer(tmp_path, ray_cluster):
    """`run_on_ray` with a child that only sleeps: the actor's process SIGKILLed under it ends the
    launch with NODE_LOST_EXIT (the loop relaunches that) and the child with it, and a launch the
    asset gives up on (an exception in its poll loop) SIGTERMs the child before the exception leaves."""
    cfg = load_config(on_cluster(tiny_run(tmp_path, training=TRAINING), ray_cluster.address))

    def sleeper(name: str) -> tuple[list[str], str]:
        argument = f"refinery-test-{name}-{uuid.uuid4().hex}"
        return ["-c", "import time; time.sleep(300)", argument], argument

    args, argument = sleeper("lost")
    children: list[int] = []
    folders: list[Path] = []

    def kill_the_actor(session) -> None:
        if not children:
            child, actor_process = processes.wait_for_argument(argument)
            children.append(child)
            folders.append(Path(os.readlink(f"/proc/{child}/fd/1")).parent)  # the actor's folder: its output
            os.kill(actor_process, signal.SIGKILL)

    outcome = launch_in_an_asset(cfg, args, tmp_path / "lost.log", kill_the_actor)
    code, node = outcome["result"]
    assert code == NODE_LOST_EXIT and node in ray_cluster.node_ids()
    # Ray ends the children of a dead worker (with SIGTERM, on which a trainer checkpoints); the
    # actor's folder stays behind.
    assert processes.ended_within(children[0], 30), "no trainer outlives its actor"
    shutil.rmtree(folders[0])

    args, argument = sleeper("stopped")

    def interrupt(session) -> None:
        children.append(processes.wait_for_argument(argument)[0])
        raise AssetStopped

    assert "raised" in launch_in_an_asset(cfg, args, tmp_path / "stopped.log", interrupt)
    assert not processes.alive(children[1]), "the trainer was stopped with its launch"


def test_the_trainer_actor_hands_over_whole_message_lines_and_stops_its_trainer_with_sigterm(tmp_path):
    """`TrainerProcess` as a plain object (no cluster): a message line still being written waits for
    the next poll, the log comes over in increments, and `stop` ends the trainer with SIGTERM."""
    from assets.trainer_actor import TrainerProcess

    go = tmp_path / "go"
    # The child stands in for the trainer, which installs its own SIGTERM handler and unblocks the
    # signal (training/lifeline.py SigtermFlag): a pytest worker may hand SIGTERM down ignored or
    # blocked (CI once saw stop() end in SIGKILL, -9, after the grace period).
    child = ("import pathlib, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_DFL); signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})\n"
             "out = open(sys.argv[1], 'a')\n"
             "out.write('{\"a\": 1}\\n{\"b\": '); out.flush(); print('started', flush=True)\n"
             "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.02)\n"
             "out.write('2}\\n'); out.flush(); print('second', flush=True)\n"
             "time.sleep(60)\n")
    actor = TrainerProcess()
    actor.start(["-c", child, str(actor.messages), str(go)], {})

    def poll_until(text: bytes) -> tuple[list[str], bytes]:
        """Poll until `text` is in the log, then once more: the child wrote its messages before it.
        `text` is a whole line: under PYTHONUNBUFFERED (as in CI) print writes a line and its newline
        in two calls, and a poll may land between them."""
        lines, log, seen = [], b"", False
        while not seen:
            seen = text in log
            code, new_lines, new_log = actor.poll()
            assert code is None
            lines, log = lines + new_lines, log + new_log
        return lines, log

    assert poll_until(b"started\n") == (['{"a": 1}'], b"started\n")
    go.touch()
    assert poll_until(b"second\n") == (['{"b": 2}'], b"second\n")
    assert actor.stop(grace_s=10) == -15
    assert not actor.workdir.exists()
