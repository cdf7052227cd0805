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
