"""Refusals are refusals: a trainer that will not start or continue exits 3 with one line naming the
cause and the fix, writes it to status.json, and is never relaunched for it; only crashes are."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import training.checkpoint as checkpoint_mod
from orchestration.cli import main
from refinery.config import load_config
from synthetic.curriculum import TINY_BUCKETS, TINY_PHASES, SyntheticBucket, tiny_run, write_synthetic_curriculum
from training.launcher import PhaseTrainingFailed, train_phase
from training.phase_runs import phase_run_dir
from training.status import read_status, write_status


def train(config: Path, *extra: str) -> int:
    return main(["train", "--config", str(config), "--num-workers", "0", *extra])


def refusal_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("refinery train: refused: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_changed_curriculum_is_refused_naming_the_phases_and_the_ways_out(tmp_path, capsys):
    config = tiny_run(tmp_path)
    assert train(config, "--stop-after-phase", "main") == 0
    # The same config, but the warmup and main phases' data rebuilt: their manifests changed.
    buckets = {**TINY_BUCKETS, "web": SyntheticBucket(docs=250, mean_len=60)}
    write_synthetic_curriculum(tmp_path / "root", buckets, TINY_PHASES, vocab=512, window=48, overlap=8)
    capsys.readouterr()
    assert train(config) == 3
    line = refusal_line(capsys.readouterr().err)
    assert "phases 'warmup', 'main'" in line and "set training.run_dir" in line and "--fresh" in line
    [status_path] = tmp_path.rglob("status.json")
    status = read_status(status_path.parent)
    assert status["state"] == "refused" and "phases 'warmup', 'main'" in status["reason"]
    # the second way out: archive the run and start over
    assert train(config, "--fresh") == 0
    out = capsys.readouterr().out
    assert "archived the previous run to" in out
    archived = [p for p in tmp_path.rglob("*.archived-*") if p.is_dir()]
    assert len(archived) == 1 and (archived[0] / "status.json").is_file()


def test_a_full_disk_during_a_checkpoint_is_reported_as_such(tmp_path, capsys, monkeypatch):
    config = tiny_run(tmp_path)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_mod.torch, "save", no_space)
    assert train(config) == 3
    line = refusal_line(capsys.readouterr().err)
    assert "No space left on device: checkpoint step-00000004.pt did not fit" in line
    assert "free space or point training.run_dir at a larger disk" in line


def test_only_damaged_checkpoints_refuse_instead_of_restarting_from_zero(tmp_path, capsys):
    config = tiny_run(tmp_path)
    assert train(config, "--stop-after-phase", "warmup") == 0
    checkpoints = sorted(tmp_path.rglob("step-*.pt"))
    assert checkpoints
    for path in checkpoints:
        path.write_bytes(path.read_bytes()[:-10])
    capsys.readouterr()
    assert train(config) == 3
    err = capsys.readouterr().err
    for path in checkpoints:
        assert f"skipping checkpoint {path}" in err, "each damaged checkpoint is named"
    assert "every checkpoint in" in refusal_line(err) and "refusing to restart from step 0" in err


def test_a_damaged_status_file_is_named(tmp_path, capsys):
    config = tiny_run(tmp_path)
    assert train(config, "--stop-after-phase", "warmup") == 0
    [status] = tmp_path.rglob("status.json")
    status.write_text('{"state": "comp')
    capsys.readouterr()
    assert train(config) == 3
    line = refusal_line(capsys.readouterr().err)
    assert f"{status} is damaged" in line and "move the file away" in line


def test_finished_is_true_when_the_last_phase_completes_by_name(tmp_path):
    config = tiny_run(tmp_path)
    assert train(config, "--stop-after-phase", "main") == 0
    [status_path] = tmp_path.rglob("status.json")
    assert json.loads(status_path.read_text())["finished"] is False
    assert train(config, "--stop-after-phase", "anneal") == 0
    assert json.loads(status_path.read_text())["finished"] is True


@pytest.mark.parametrize("code, state, said", [(3, "refused", "refused: the checkpoint does not fit"),
                                                (2, None, "stopped on a config or input problem: refinery train: bad field")])
def test_a_refusal_or_an_input_problem_is_launched_once(tmp_path, code, state, said):
    config = tiny_run(tmp_path, training={"max_resume_attempts": 3})
    cfg = load_config(config)
    launches = []

    def launch_once(resume: str, log_path: Path):
        launches.append(resume)
        log_path.write_text("refinery train: bad field\n")
        if state:
            write_status(phase_run_dir(cfg, "warmup"), state, "the checkpoint does not fit")
        return code, {}

    with pytest.raises(PhaseTrainingFailed) as failed:
        train_phase(cfg, "warmup", launch_once, lambda m: None, lambda m: None, sleep=lambda s: None)
    assert len(launches) == 1 and not failed.value.relaunchable
    assert f"training_run[warmup] {said}" in str(failed.value) and "launch-1.log" in str(failed.value)


def test_a_crash_is_relaunched(tmp_path):
    config = tiny_run(tmp_path, training={"max_resume_attempts": 2})
    launches = []

    def launch_once(resume: str, log_path: Path):
        launches.append(resume)
        return 1, {}

    with pytest.raises(PhaseTrainingFailed, match="died 3 times") as failed:
        train_phase(load_config(config), "warmup", launch_once, lambda m: None, lambda m: None, sleep=lambda s: None)
    assert len(launches) == 3 and failed.value.relaunchable


def test_a_damaged_manifest_is_named_and_stops_training_with_exit_2(tmp_path, capsys):
    config = tiny_run(tmp_path)
    manifest = tmp_path / "root/manifests/main.json"
    manifest.write_text(manifest.read_text()[:200])
    assert train(config) == 2
    err = capsys.readouterr().err
    assert f"{manifest}: not a readable phase manifest" in err and "materialize phase_manifests[main] again" in err
