"""A bucket that runs dry: halt with a checkpoint and a reason; auto-resume refuses; with
allow_bucket_exhaustion the run continues with the bucket dropped and the weights renormalized."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestration.cli import main
from training.metrics import JsonLines
from training.status import read_status
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, tiny_run

# math holds ~6 x 30 tokens and may be read once, but half of 4096 tokens are asked of it
OVER_DEMAND = dict(
    buckets={"web": SyntheticBucket(200, 60), "math": SyntheticBucket(6, 30, max_epochs=1)},
    phases=[SyntheticPhase("warmup", 1024, {"web": 0.9, "math": 0.1}, seq_len=32),
            SyntheticPhase("main", 3072, {"web": 0.5, "math": 0.5}, seq_len=32)],
)


def set_allow(config: Path, allow: bool) -> None:
    data = yaml.safe_load(config.read_text())
    data["curriculum"]["allow_bucket_exhaustion"] = allow
    config.write_text(yaml.safe_dump(data, sort_keys=False))


def test_exhaustion_halts_refuses_auto_resume_then_continues_with_the_flag(tmp_path, capsys):
    config = tiny_run(tmp_path, **OVER_DEMAND)
    run_dir = tmp_path / "root/runs/demo"
    assert main(["train", "--config", str(config)]) == 3
    status = read_status(run_dir)
    assert status["state"] == "halted" and status["halt_kind"] == "bucket_exhausted"
    assert "bucket 'math' ran dry at step" in status["reason"] and "allow_bucket_exhaustion" in status["reason"]
    halted_at = status["step"]
    assert 0 < halted_at < status["total_steps"]
    assert Path(status["checkpoint"]).name == f"step-{halted_at:08d}.pt" and Path(status["checkpoint"]).is_file()
    capsys.readouterr()

    assert main(["train", "--config", str(config), "--resume", "auto"]) == 3
    assert "the run halted" in capsys.readouterr().err
    assert read_status(run_dir)["step"] == halted_at, "a refused resume must not train"

    set_allow(config, True)
    assert main(["train", "--config", str(config), "--resume", "auto"]) == 0
    status = read_status(run_dir)
    assert status["state"] == "completed" and status["finished"]
    metrics = JsonLines(run_dir / "metrics.jsonl").read()
    assert [m["step"] for m in metrics] == list(range(1, status["total_steps"] + 1))
    dropped = [m for m in metrics if "event/bucket_dropped" in m]
    assert [(m["step"], m["event/bucket_dropped"]) for m in dropped] == [(halted_at + 1, ["math"])]
    after = metrics[halted_at:]
    assert all("loss/math" not in m for m in after), "a dropped bucket serves nothing"
    assert after[-1]["tokens/math"] == metrics[halted_at - 1]["tokens/math"]
    web_step = after[-1]["tokens/web"] - after[-2]["tokens/web"]
    assert web_step == after[-1]["tokens"] - after[-2]["tokens"], "the renormalized mixture is all web"


def test_a_validation_failure_in_the_manifest_stops_before_training(tmp_path, capsys):
    config = tiny_run(tmp_path)
    manifest = tmp_path / "root/manifests/main.json"
    manifest.write_text(manifest.read_text().replace('"ok": true', '"ok": false'))
    try:
        main(["train", "--config", str(config)])
    except ValueError as err:
        assert "manifest of phase 'main' failed validation" in str(err)
    else:
        raise AssertionError("training must not start on a manifest that failed validation")
