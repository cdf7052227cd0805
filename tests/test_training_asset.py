"""`training_run` through Dagster on a synthetic curriculum: the Pipes launch per phase, auto-resume
after SIGKILL with every entry consumed exactly once, a halt that stops the asset with no further
launch, and the anneal re-scan schedule and sensor."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from orchestration.definitions import build_definitions
from assets.resource import RefineryResource
from refinery.config import load_config
from refinery.storage import LocalDataRoot
from training.metrics import JsonLines, data_wait_share
from training.phase_runs import phase_run_dir, phase_start_step
from training.status import write_status
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, tiny_run
from training.trainer import RunOptions, Trainer

from helpers.kill_hook import kill_at_step_env
from helpers.materialize import materialize_in_workspace

TRAINING = {"record_consumption": True, "resume_backoff_s": 0.01}
PHASES = ["warmup", "main", "anneal"]


def consumed(run_dirs: list[Path]) -> list[tuple]:
    """Every entry piece each step read, in step order, across the given run directories."""
    records = [r for d in run_dirs for r in JsonLines(d / "consumption-rank0.jsonl").read()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1)), "each step recorded once"
    return [(r["step"], *piece) for r in records
            for piece in zip(r["row"], r["bucket"], r["epoch"], r["entry"], r["a"], r["b"])]


def launch_messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if "launch attempt" in (e.user_message or "")]


def materialization(result: dg.ExecuteInProcessResult) -> dict:
    [event] = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.mark.slow
def test_killed_trainer_is_relaunched_and_every_entry_is_consumed_once(tmp_path, monkeypatch):
    reference_config = tiny_run(tmp_path / "reference", training=TRAINING)
    reference = Trainer(load_config(reference_config), RunOptions(run_dir=str(tmp_path / "reference_run")))
    assert reference.train()["state"] == "completed"
    expected = consumed([tmp_path / "reference_run"])
    expected_loss = JsonLines(tmp_path / "reference_run/metrics.jsonl").read()[-1]["loss/total"]

    config = tiny_run(tmp_path / "asset", training=TRAINING)
    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    interval = cfg.training.checkpoint_interval
    main_start = phase_start_step(cfg, root, "main")
    kill_at = (main_start // interval + 2) * interval  # a checkpoint step inside main: the relaunch resumes past it
    assert main_start < kill_at < phase_start_step(cfg, root, "anneal")
    for name, value in kill_at_step_env(kill_at).items():
        monkeypatch.setenv(name, value)

    with dg.instance_for_test() as instance:
        results = {phase: materialize_in_workspace(config, instance, "training_run", phase) for phase in PHASES}
        assert all(r.success for r in results.values())
        main = materialization(results["main"])
        assert main["launch_attempts"] == 2
        first, second = main["attempts"]
        assert first["exit_code"] == -9 and first["step"] == kill_at
        assert first["resume"].endswith(f"step-{main_start:08d}.pt"), "main starts from warmup's boundary checkpoint"
        assert second["resume"] == "auto" and second["state"] == "completed"
        assert len(launch_messages(instance, results["main"].run_id)) == 2
        assert [materialization(results[p])["launch_attempts"] for p in ("warmup", "anneal")] == [1, 1]
        observed = [e for e in instance.all_logs(results["main"].run_id) if e.dagster_event and
                    e.dagster_event.event_type == dg.DagsterEventType.ASSET_OBSERVATION]
        assert observed, "checkpoints are reported while the trainer runs"
        main_records = [r for r in JsonLines(phase_run_dir(cfg, "main") / "metrics.jsonl").read()
                        if r["phase_name"] == "main"]
        assert main["loss_plot"].startswith(f"![training loss per bucket, phase main (steps {main_start + 1}-")
        assert main["data_wait_share"] == pytest.approx(data_wait_share(main_records), abs=1e-6)

    got = consumed([phase_run_dir(cfg, p) for p in PHASES])
    assert got == expected, "0 replayed, 0 skipped, same order"
    final_loss = JsonLines(phase_run_dir(cfg, "anneal") / "metrics.jsonl").read()[-1]["loss/total"]
    assert final_loss == pytest.approx(expected_loss, rel=1e-5)


# math holds ~6 x 30 tokens and may be read once, but half of main's 3072 tokens are asked of it
OVER_DEMAND = dict(
    buckets={"web": SyntheticBucket(200, 60), "math": SyntheticBucket(6, 30, max_epochs=1)},
    phases=[SyntheticPhase("warmup", 1024, {"web": 0.9, "math": 0.1}, seq_len=32),
            SyntheticPhase("main", 3072, {"web": 0.5, "math": 0.5}, seq_len=32)],
)


@pytest.mark.slow
def test_halted_trainer_fails_the_asset_with_its_reason_and_is_not_relaunched(tmp_path):
    config = tiny_run(tmp_path, training={**TRAINING, "max_resume_attempts": 3}, **OVER_DEMAND)
    cfg = load_config(config)
    with dg.instance_for_test() as instance:
        assert materialize_in_workspace(config, instance, "training_run", "warmup").success
        result = materialize_in_workspace(config, instance, "training_run", "main")
        assert not result.success
        [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
        message = failure.step_failure_data.error.message
        assert "training_run[main] halted: bucket_exhausted" in message and "bucket 'math' ran dry" in message
        user = failure.step_failure_data.user_failure_data
        assert user.metadata["launch_attempts"].value == 1 and user.metadata["state"].value == "halted"
        assert len(launch_messages(instance, result.run_id)) == 1, "a halt is never relaunched"
        # A second materialization, by hand or by a retry, is refused by the trainer without training.
        again = materialize_in_workspace(config, instance, "training_run", "main")
        assert not again.success and len(launch_messages(instance, again.run_id)) == 1
    run_dir = phase_run_dir(cfg, "main")
    assert sorted(p.name for p in run_dir.glob("launch-*.log")) == ["launch-1.log"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "halted" and status["halt_kind"] == "bucket_exhausted"


@pytest.mark.slow
def test_a_finished_main_branches_into_anneal_variants_without_touching_it(tmp_path):
    """Seed 000's anneal mixture search: a second config that names its last phase differently
    trains from the same main boundary checkpoint into a run directory of its own."""
    import hashlib

    from synthetic.curriculum import TINY_BUCKETS, TINY_PHASES, TINY_TRAINING, synthetic_config, write_synthetic_curriculum

    config = tiny_run(tmp_path, training=TRAINING)
    variant_phases = [*TINY_PHASES[:2], SyntheticPhase("anneal_math", 2048, {"web": 0.2, "math": 0.8}, seq_len=64,
                                                       lr_scale=0.5, interpolation=0.05)]
    write_synthetic_curriculum(tmp_path / "root", TINY_BUCKETS, variant_phases, vocab=512, window=48, overlap=8)
    variant = synthetic_config(tmp_path / "variant.yaml", tmp_path / "root", TINY_BUCKETS, variant_phases,
                               {**TINY_TRAINING, **TRAINING})
    cfg, variant_cfg = load_config(config), load_config(variant)

    def main_dir_digest() -> dict[str, str]:
        main = phase_run_dir(cfg, "main") / "checkpoints"
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(main.iterdir())}

    with dg.instance_for_test() as instance:
        for phase in PHASES:
            assert materialize_in_workspace(config, instance, "training_run", phase).success, phase
        before = main_dir_digest()
        result = materialize_in_workspace(variant, instance, "training_run", "anneal_math")
        assert result.success
    [attempt] = materialization(result)["attempts"]
    boundary = phase_start_step(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), "anneal")
    assert attempt["resume"] == str(phase_run_dir(cfg, "main") / "checkpoints" / f"step-{boundary:08d}.pt")
    assert main_dir_digest() == before, "the main phase's checkpoints are shared, never written by a variant"
    summaries = {p: json.loads((phase_run_dir(c, p) / "status.json").read_text())["summary"][p]
                 for c, p in ((cfg, "anneal"), (variant_cfg, "anneal_math"))}
    assert summaries["anneal_math"]["math"]["tokens"] > summaries["anneal"]["math"]["tokens"], "its own mixture"


def test_anneal_before_main_is_refused_with_the_phase_to_train_first(tmp_path):
    config = tiny_run(tmp_path, training=TRAINING)
    with dg.instance_for_test() as instance:
        result = materialize_in_workspace(config, instance, "training_run", "anneal")
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert "materialize training_run[main] first" in failure.step_failure_data.error.message
    assert not list(phase_run_dir(load_config(config), "anneal").glob("launch-*.log")), "nothing was launched"


def test_training_runs_share_one_accelerator_pool(tmp_path):
    defs = build_definitions(str(tiny_run(tmp_path)))
    node = defs.resolve_asset_graph().get(dg.AssetKey("training_run"))
    assert node.pools == {"training_accelerator"}


def sensor_result(config: Path, step: int):
    cfg = load_config(config)
    write_status(phase_run_dir(cfg, "main"), "running", step=step, total_steps=99)
    defs = build_definitions(str(config))
    sensor = defs.resolve_sensor_def("anneal_rescan_sensor")
    resources = {"refinery": RefineryResource(config_path=str(config))}
    with dg.instance_for_test() as instance, dg.build_sensor_context(instance=instance, resources=resources) as context:
        return sensor(context)


def test_sensor_requests_the_anneal_rescan_at_the_configured_distance_and_not_before(tmp_path):
    config = tiny_run(tmp_path)
    window = 5
    config.write_text(config.read_text() + f"contamination:\n  sensor_steps_before_anneal: {window}\n")
    cfg = load_config(config)
    anneal = phase_start_step(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), "anneal")

    early = sensor_result(config, anneal - window - 1)
    assert isinstance(early, dg.SkipReason) and f"more than {window} steps away" in early.skip_message
    due = sensor_result(config, anneal - window)
    assert isinstance(due, dg.RunRequest) and due.partition_key == "anneal" and due.tags["refinery/trigger"] == "sensor"
    assert isinstance(sensor_result(config, anneal - 1), dg.RunRequest)
    late = sensor_result(config, anneal)
    assert isinstance(late, dg.SkipReason) and "too late" in late.skip_message


def test_schedule_rescans_the_anneal_phase_on_the_configured_cron(tmp_path):
    config = tiny_run(tmp_path)
    config.write_text(config.read_text() + "contamination:\n  rescan_cron: '15 3 * * *'\n")
    defs = build_definitions(str(config))
    schedule = defs.resolve_schedule_def("anneal_rescan_schedule")
    assert schedule.cron_schedule == "15 3 * * *" and schedule.job_name == "contamination_rescan"
    request = schedule(dg.build_schedule_context())
    assert request.partition_key == "anneal"
    job = defs.resolve_job_def("contamination_rescan")
    assert [k.to_user_string() for k in job.asset_layer.executable_asset_keys] == ["contamination_scan"]
