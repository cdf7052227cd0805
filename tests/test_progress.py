"""Progress: bars only on a terminal, log lines at every N percent."""

import io

import pytest

from refinery.progress import Progress, bars_enabled, track


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_when_piped_and_drawn_on_a_terminal(monkeypatch):
    monkeypatch.delenv("REFINERY_PROGRESS", raising=False)
    piped = io.StringIO()
    with Progress(10, desc="funnel", stream=piped) as p:
        p.update(10)
    assert piped.getvalue() == ""
    tty = FakeTty()
    with Progress(10, desc="funnel", unit="doc", stream=tty) as p:
        p.update(10)
    assert "funnel" in tty.getvalue() and "10/10" in tty.getvalue()


def test_environment_overrides_the_terminal_check(monkeypatch):
    monkeypatch.setenv("REFINERY_PROGRESS", "0")
    assert not bars_enabled(FakeTty())
    monkeypatch.setenv("REFINERY_PROGRESS", "1")
    assert bars_enabled(io.StringIO())


def test_log_lines_every_n_percent(monkeypatch):
    monkeypatch.delenv("REFINERY_PROGRESS", raising=False)
    lines = []
    with Progress(200, desc="tokenize", unit="doc", log=lines.append, every_pct=25, stream=io.StringIO()) as p:
        for _ in range(200):
            p.update(1)
    assert [line.split(":")[1].split("%")[0].strip() for line in lines] == ["25", "50", "75", "100"]
    assert lines[-1].startswith("tokenize: 100% (200/200 doc,")


def test_a_big_step_logs_once_and_resumes_on_the_grid():
    lines = []
    p = Progress(100, desc="x", log=lines.append, every_pct=20, stream=io.StringIO())
    p.update(57)
    p.update(2)
    p.update(1)
    p.update(40)
    assert [line.split("%")[0] for line in lines] == ["x: 57", "x: 60", "x: 100"]


def test_track_counts_every_item_and_rejects_a_bad_interval():
    lines = []
    assert list(track(range(4), desc="t", log=lines.append, every_pct=50)) == [0, 1, 2, 3]
    assert len(lines) == 2
    with pytest.raises(ValueError, match="every_pct"):
        Progress(1, every_pct=0)


def test_long_commands_stay_quiet_when_piped_and_draw_a_bar_when_forced(tmp_path):
    """`refinery train` through a pipe prints its table and nothing else; with REFINERY_PROGRESS=1
    (what a terminal gets) the same command draws a bar over its steps on stderr."""
    import os
    import subprocess
    import sys

    from synthetic.curriculum import tiny_run

    config = tiny_run(tmp_path)
    base = [sys.executable, "-m", "orchestration.cli", "train", "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if k != "REFINERY_PROGRESS"}
    piped = subprocess.run(base + ["--run-dir", str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert "refinery train:" not in piped.stderr and "step/s" not in piped.stderr
    forced = subprocess.run(base + ["--run-dir", str(tmp_path / "b")], capture_output=True, text=True,
                            env={**env, "REFINERY_PROGRESS": "1"}, timeout=300)
    assert forced.returncode == 0, forced.stderr
    assert "refinery train" in forced.stderr and "step" in forced.stderr
    for label in ("phase 1/3 warmup", "phase 2/3 main", "phase 3/3 anneal"):  # the bar names the phase it is in
        assert f"refinery train {label}" in forced.stderr, label
    assert forced.stdout.splitlines()[-1] == piped.stdout.splitlines()[-1], "the same run, the same summary"


def test_a_phase_label_counts_the_phases_this_invocation_runs():
    from training.cli import phase_label

    names = ["warmup", "main", "reasoning", "anneal"]
    assert phase_label(names, 1, None) == "phase 2/4 main"
    assert phase_label(names, 1, "main") == "phase 2/2 main"  # --stop-after-phase main runs two phases
    assert phase_label(names, 3, "anneal") == "phase 4/4 anneal"


def test_describe_renames_the_bar_and_the_log_lines():
    lines: list[str] = []
    tty = FakeTty()
    with Progress(10, desc="train phase 1/2 a", stream=tty, log=lines.append, every_pct=50) as p:
        p.update(5)
        p.describe("train phase 2/2 b")
        p.update(5)
    assert "train phase 2/2 b" in tty.getvalue()
    assert lines[0].startswith("train phase 1/2 a: 50%") and lines[1].startswith("train phase 2/2 b: 100%")
