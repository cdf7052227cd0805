"""Step metrics: one JSON line per step in `<run_dir>/metrics.jsonl`, and the same dict handed to
every sink (a list of callables), so a caller outside training/ can forward them (e.g. over Dagster
Pipes) without this package knowing how.

Keys are stable: `step`, `phase`, `phase_name`, `tokens`, `lr`, `loss/total`, `loss/<bucket>`,
`tokens/<bucket>` (cumulative tokens served), `time/data_wait_s`, `time/step_s`, `grad_norm`,
`nonfinite`, `world_size`, and `event/bucket_dropped` when exhaustion drops a bucket; at an
evaluation (every `training.eval_every_tokens`), `val_loss/<bucket>` (held-out entries) and
`time/eval_s`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from refinery.storage import atomic_path

MetricsSink = Callable[[dict[str, Any]], None]


def parse_lines(text: str) -> tuple[list[dict[str, Any]], int]:
    """The records of a JSON-lines text up to its first unreadable line, and how many lines were
    unreadable from there on. A crash mid-append leaves a torn last line (no newline, cut JSON);
    what follows a bad line cannot be trusted to be in order, so it is dropped too."""
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]  # text after the last newline was never finished
    records = []
    for i, line in enumerate(complete):
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            return records, sum(1 for x in complete[i:] if x) + bool(tail)
    return records, int(bool(tail))


class JsonLines:
    """An append-only JSON-lines log keyed by `step`, cut back on resume to the checkpoint's step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> int:
        """Drop records of steps after `step` (they are replayed from the checkpoint) and a torn
        tail; returns how many unreadable lines were cut."""
        if not self.path.is_file():
            return 0
        records, torn = parse_lines(self.path.read_text(errors="replace"))
        kept = [r for r in records if r["step"] <= step]
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        return torn

    def append(self, record: dict[str, Any]) -> None:
        # One write of one whole line: a crash can tear only the last line, which resume cuts back.
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return parse_lines(self.path.read_text(errors="replace"))[0]


class MetricsLogger(JsonLines):
    def __init__(self, path: str | Path, sinks: list[MetricsSink] | None = None):
        super().__init__(path)
        self.sinks = list(sinks or [])

    def log(self, record: dict[str, Any]) -> None:
        self.append(record)
        for sink in self.sinks:
            sink(record)


class ConsumptionLog(JsonLines):
    """Which entry pieces each step consumed (row, bucket, epoch, entry, token range): an audit of
    exactly-once delivery, written only when `training.record_consumption` is on."""

    def log(self, step: int, bucket_names: list[str], pieces: dict[str, np.ndarray]) -> None:
        record = {k: v.tolist() for k, v in pieces.items()}
        record["bucket"] = [bucket_names[i] for i in record["bucket"]]
        self.append({"step": step, **record})
