"""What the trainer's step metrics become for a person: training_run's loss-per-bucket plot and
data-wait share, and TensorBoard event files when the optional package is installed."""

import json
import sys

import pytest

from assets.training import training_curves
from training.metrics import TENSORBOARD_DIR, JsonLines, data_wait_share, loss_by_bucket_png, tensorboard_sink
from synthetic.curriculum import tiny_run
from refinery.config import load_config
from training.trainer import RunOptions, Trainer

RECORDS = [
    {"step": 1, "phase_name": "warmup", "loss/total": 6.0, "loss/web": 6.1, "time/data_wait_s": 0.5, "time/step_s": 1.0},
    {"step": 2, "phase_name": "main", "loss/total": 5.0, "loss/web": 5.2, "loss/math": 4.8,
     "time/data_wait_s": 0.1, "time/step_s": 1.0},
    {"step": 3, "phase_name": "main", "loss/total": 4.0, "loss/math": 3.9, "time/data_wait_s": 0.3, "time/step_s": 3.0},
]


def test_data_wait_share_is_wait_time_over_step_time():
    assert data_wait_share(RECORDS[1:]) == pytest.approx(0.4 / 4.0)
    assert data_wait_share([]) is None
    assert data_wait_share([{"step": 1, "time/step_s": 0.0, "time/data_wait_s": 0.0}]) is None


def test_loss_plot_is_a_png_that_changes_with_the_losses():
    png = loss_by_bucket_png(RECORDS, "t")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert loss_by_bucket_png(RECORDS, "t") == png, "same records, same bytes"
    changed = [dict(r, **{"loss/math": 1.0}) if "loss/math" in r else r for r in RECORDS]
    assert loss_by_bucket_png(changed, "t") != png


def test_training_run_metadata_covers_only_its_phase(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    md = training_curves(tmp_path, "main")
    assert md["data_wait_share"].value == pytest.approx(0.1)
    assert (md["data_wait_s"].value, md["step_s"].value) == (pytest.approx(0.4), pytest.approx(4.0))
    assert md["loss_plot"].value.startswith("![training loss per bucket, phase main (steps 2-3)](data:image/png;base64,iVBOR")
    assert training_curves(tmp_path, "anneal") == {}, "no steps of that phase yet: no plot"
    assert training_curves(tmp_path / "missing", "main") == {}


def train_tiny(tmp_path):
    trainer = Trainer(load_config(tiny_run(tmp_path)), RunOptions(run_dir=str(tmp_path / "run")))
    try:
        assert trainer.train()["state"] == "completed"
    finally:
        trainer.close()
    return tmp_path / "run"


def test_trainer_writes_tensorboard_events_with_the_metric_tags(tmp_path):
    pytest.importorskip("tensorboard", reason="install the test extra (tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = train_tiny(tmp_path)
    records = JsonLines(run / "metrics.jsonl").read()
    events = EventAccumulator(str(run / TENSORBOARD_DIR))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss/total", "loss/web", "loss/math", "lr", "time/data_wait_s", "time/step_s", "tokens/web"} <= tags
    assert "phase_name" not in tags and "step" not in tags, "only numeric metrics, keyed by step"
    total = events.Scalars("loss/total")
    assert [e.step for e in total] == [r["step"] for r in records]
    assert [e.value for e in total] == pytest.approx([r["loss/total"] for r in records], rel=1e-6)


def test_trainer_runs_unchanged_without_tensorboard(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `import` now raises ImportError
    assert tensorboard_sink(tmp_path) is None
    run = train_tiny(tmp_path)
    assert JsonLines(run / "metrics.jsonl").read(), "metrics.jsonl is still written"
    assert not (run / TENSORBOARD_DIR).exists()
