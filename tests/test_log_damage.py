"""Issue 26, item 3: one damaged line in a JSON-lines log costs that line alone. Resume keeps every
valid line before and after it, names it (file and line number) in one message, and still cuts a
torn tail (a last line without a newline, left by a crash mid-append) as before; a mirrored log on
the data root ends up holding what the local one holds."""

from __future__ import annotations

import json

import pytest

from refinery.config import load_config
from refinery.storage import LocalDataRoot
from synthetic.curriculum import tiny_run
from training.metrics import ConsumptionLog, JsonLines, LogCut, MetricsLogger, cut_back_logs
from training.run_store import RunMirror
from training.trainer import RunOptions, Trainer

DAMAGED = '{"step": 3, "bucket": ["w\x00\x00\x00\x00ep": 9}'  # bit rot / a block of NULs, newline intact


def lines(*steps: int) -> str:
    return "".join(json.dumps({"step": s}) + "\n" for s in steps)


def test_a_damaged_line_in_the_middle_costs_that_line_alone(tmp_path):
    log = JsonLines(tmp_path / "m.jsonl")
    log.path.write_text(lines(1, 2) + DAMAGED + "\n" + lines(4, 5))
    assert [r["step"] for r in log.read()] == [1, 2, 4, 5]
    assert log.truncate_after(4) == LogCut(torn=0, damaged=[3], intact_lines=2)
    assert log.path.read_text() == lines(1, 2, 4), "valid lines after the damaged one kept, step 5 replayed"


@pytest.mark.parametrize("damaged", ["[1, 2]", '{"step": "3"}', '{"step": true}', '{"no_step": 3}', "[" * 100_000])
def test_json_that_is_not_a_record_with_a_step_is_a_damaged_line(tmp_path, damaged):
    log = JsonLines(tmp_path / "m.jsonl")
    log.path.write_text(lines(1) + damaged + "\n" + lines(2))
    assert log.truncate_after(10) == LogCut(torn=0, damaged=[2], intact_lines=1)
    assert log.path.read_text() == lines(1, 2)


def test_a_torn_tail_is_still_cut_and_is_not_a_damaged_line(tmp_path):
    log = JsonLines(tmp_path / "m.jsonl")
    log.path.write_text(lines(1, 2) + '{"step": 3, "lo')
    assert [r["step"] for r in log.read()] == [1, 2]
    assert log.truncate_after(10) == LogCut(torn=1, damaged=[], intact_lines=2)
    assert log.path.read_text() == lines(1, 2)

    log.path.write_text(lines(1) + DAMAGED + "\n" + lines(3) + '{"step": 4')
    assert log.truncate_after(10) == LogCut(torn=1, damaged=[2], intact_lines=1)
    assert log.path.read_text() == lines(1, 3)


def test_resume_names_each_damaged_line_once_and_mirrors_the_repaired_log(tmp_path, capsys):
    """The damage came back from the data root (restored on a fresh machine): after the cut back,
    the root's segments hold the repaired log, so the next machine restores the same lines."""
    root, first = LocalDataRoot(tmp_path / "root"), tmp_path / "machine-1"
    first.mkdir()
    log = first / "consumption-rank0.jsonl"
    mirror = RunMirror(root, "runs/r", first)
    log.write_text(lines(1, 2))
    mirror.push_log(log)
    log.write_text(lines(1, 2) + DAMAGED + "\n" + lines(4, 5, 6))
    mirror.push_log(log)

    second = tmp_path / "machine-2"
    resumed = RunMirror(root, "runs/r", second)
    assert resumed.restore() == 1
    metrics, consumption = MetricsLogger(second / "metrics.jsonl"), ConsumptionLog(second / "consumption-rank0.jsonl")
    capsys.readouterr()
    cut_back_logs(5, 0, 1, metrics, consumption, resumed)
    err = capsys.readouterr().err
    assert err.count("damaged line") == 1, err
    assert (f"refinery train: {consumption.path}: dropped 1 damaged line(s) (line 3): not a JSON record with a "
            "step; the valid lines before and after kept") in err
    assert "unreadable line(s) at its end" not in err, "a damaged line followed by valid lines is not a torn tail"
    assert consumption.path.read_text() == lines(1, 2, 4, 5)

    third = tmp_path / "machine-3"
    RunMirror(root, "runs/r", third).restore()
    assert (third / "consumption-rank0.jsonl").read_text() == lines(1, 2, 4, 5)


def test_many_damaged_lines_are_named_in_one_bounded_message(tmp_path, capsys):
    metrics = MetricsLogger(tmp_path / "metrics.jsonl")
    consumption = ConsumptionLog(tmp_path / "consumption-rank0.jsonl")
    consumption.path.write_text(lines(1) + "garbage\n" * 12 + lines(2))
    cut_back_logs(2, 0, 1, metrics, consumption, None)
    err = capsys.readouterr().err
    assert "dropped 12 damaged line(s) (line 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 2 more)" in err
    assert consumption.path.read_text() == lines(1, 2)


def test_a_consumption_log_damaged_mid_run_resumes_with_every_valid_line_and_exactly_once(tmp_path, capsys):
    reference = Trainer(load_config(tiny_run(tmp_path / "whole", training={"record_consumption": True})))
    assert reference.train()["state"] == "completed"
    uninterrupted = JsonLines(reference.run_dir / "consumption-rank0.jsonl").read()

    config = tiny_run(tmp_path, training={"record_consumption": True})
    first = Trainer(load_config(config), RunOptions(stop_after_phase="warmup"))
    boundary = first.train()["step"]
    assert boundary >= 3
    path = first.run_dir / "consumption-rank0.jsonl"
    written = path.read_text().split("\n")
    written[1] = written[1][:20] + "\x00" * 8 + written[1][28:]  # step 2's line damaged in place
    path.write_text("\n".join(written))
    capsys.readouterr()

    resumed = Trainer(load_config(config))
    assert resumed.train()["state"] == "completed"
    err = capsys.readouterr().err
    assert f"{path}: dropped 1 damaged line(s) (line 2)" in err and "unreadable line(s)" not in err
    kept = JsonLines(path).read()
    assert kept == [r for r in uninterrupted if r["step"] != 2], \
        "every valid line kept, each step once, nothing replayed or skipped but the damaged line"
