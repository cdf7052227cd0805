"""Step metrics: one JSON line per step in `<run_dir>/metrics.jsonl`, and the same dict handed to
every sink (a list of callables), so a caller outside training/ can forward them (e.g. over Dagster
Pipes) without this package knowing how.

Keys are stable: `step`, `phase`, `phase_name`, `tokens`, `lr`, `loss/total`, `loss/<bucket>`,
`tokens/<bucket>` (cumulative tokens served), `time/data_wait_s`, `time/step_s`, `grad_norm`,
`nonfinite`, `world_size`, and `event/bucket_dropped` when exhaustion drops a bucket; at an
evaluation (every `training.eval_every_tokens`), `val_loss/<bucket>` (held-out entries) and
`time/eval_s`.

With the optional `tensorboard` package installed, every numeric metric also goes to TensorBoard
event files in `<run_dir>/tensorboard` (tag = key, global step = `step`); without it nothing changes.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from refinery.storage import atomic_path

if TYPE_CHECKING:
    from training.run_store import RunMirror

MetricsSink = Callable[[dict[str, Any]], None]
TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_FLUSH_S = 10
DAMAGED_LINES_NAMED = 10  # line numbers one resume message lists, so it stays one readable line


def parse_record(line: str) -> dict[str, Any] | None:
    """The record of one log line, or None when the line is damaged: not JSON (bit rot, a block of
    NULs), or JSON that is not an object with an integer `step` (every record the trainer writes has one)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: brackets nested past the parser's depth
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return record if isinstance(step, int) and not isinstance(step, bool) else None


def parse_lines(text: str) -> tuple[list[dict[str, Any]], list[int], int]:
    """The records of a JSON-lines text, the 1-based numbers of its damaged complete lines, and 1
    when its last line is torn (else 0). A crash mid-append can only tear the last line, the one
    without a newline; a damaged line with a newline costs that line alone, so the valid lines
    after it are kept."""
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]  # text after the last newline was never finished
    records, damaged = [], []
    for number, line in enumerate(complete, 1):
        if not line:
            continue
        record = parse_record(line)
        if record is None:
            damaged.append(number)
        else:
            records.append(record)
    return records, damaged, int(bool(tail))


@dataclass(frozen=True)
class LogCut:
    """What cutting one log back removed besides the replayed steps."""

    torn: int  # 1 when its last line had no newline (a write interrupted by a crash), else 0
    damaged: list[int]  # 1-based numbers of the damaged lines dropped
    intact_lines: int  # leading lines of the file left byte for byte as they were (a mirror keeps those)


class JsonLines:
    """An append-only JSON-lines log keyed by `step`, cut back on resume to the checkpoint's step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> LogCut:
        """Drop records of steps after `step` (they are replayed from the checkpoint), damaged
        lines and a torn tail, keeping every valid line up to `step`."""
        if not self.path.is_file():
            return LogCut(torn=0, damaged=[], intact_lines=0)
        text = self.path.read_text(errors="replace")
        records, damaged, torn = parse_lines(text)
        kept = [json.dumps(r, sort_keys=True) for r in records if r["step"] <= step]
        before = text.split("\n")[:-1]
        intact = next((i for i, (old, new) in enumerate(zip(before, kept)) if old != new), min(len(before), len(kept)))
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))
        return LogCut(torn=torn, damaged=damaged, intact_lines=intact)

    def append(self, record: dict[str, Any]) -> None:
        # One write of one whole line: a crash can tear only the last line, which resume cuts back.
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return parse_lines(self.path.read_text(errors="replace"))[0]  # valid lines only


class TensorBoardSink:
    """Numeric metrics as TensorBoard scalars, written by torch's SummaryWriter (created at the first
    record, so a resumed run purges the events it replays)."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.writer = None

    def __call__(self, record: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        step = record["step"]
        if self.writer is None:
            # steps from purge_step on, logged before a crash and replayed from the checkpoint, are hidden
            self.writer = SummaryWriter(str(self.log_dir), purge_step=step, flush_secs=TENSORBOARD_FLUSH_S)
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def tensorboard_sink(log_dir: Path) -> TensorBoardSink | None:
    """A TensorBoard sink, or None when the optional `tensorboard` package is not importable."""
    try:
        import torch.utils.tensorboard  # noqa: F401  (raises ImportError without the tensorboard package)
    except ImportError:
        return None
    return TensorBoardSink(log_dir)


class MetricsLogger(JsonLines):
    """metrics.jsonl plus the sinks; `tensorboard=True` adds TensorBoard event files beside it when
    the package is installed."""

    def __init__(self, path: str | Path, sinks: list[MetricsSink] | None = None, tensorboard: bool = False):
        super().__init__(path)
        self.sinks = list(sinks or [])
        board = tensorboard_sink(self.path.parent / TENSORBOARD_DIR) if tensorboard else None
        if board is not None:
            self.sinks.append(board)

    def log(self, record: dict[str, Any]) -> None:
        self.append(record)
        for sink in self.sinks:
            sink(record)

    def close(self) -> None:
        """Flush the sinks that buffer (TensorBoard's writer)."""
        for sink in self.sinks:
            if isinstance(sink, TensorBoardSink):
                sink.close()


def data_wait_share(records: list[dict[str, Any]]) -> float | None:
    """The share of step time spent waiting for the next batch (None before any step): near 0 when
    the loader keeps up, near 1 when the accelerator starves."""
    step_s = sum(r.get("time/step_s", 0.0) for r in records)
    return sum(r.get("time/data_wait_s", 0.0) for r in records) / step_s if step_s > 0 else None


def loss_by_bucket_png(records: list[dict[str, Any]], title: str) -> bytes:
    """Training loss of every bucket (`loss/<bucket>`, one point per step that drew from it) and the
    total over steps, as PNG bytes."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = sorted({k.split("/", 1)[1] for r in records for k in r if k.startswith("loss/") and k != "loss/total"})
    fig, ax = plt.subplots(figsize=(8, 4))
    for bucket in buckets:
        points = [(r["step"], r[f"loss/{bucket}"]) for r in records if f"loss/{bucket}" in r]
        ax.plot(*zip(*points), linewidth=1, label=bucket)
    total = [(r["step"], r["loss/total"]) for r in records if "loss/total" in r]
    if total:
        ax.plot(*zip(*total), color="black", linewidth=1.5, linestyle="--", label="total")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=10)
    if total or buckets:
        ax.legend(fontsize=8, ncol=min(len(buckets) + 1, 6))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})  # same records, same bytes
    plt.close(fig)
    return buf.getvalue()


class ConsumptionLog(JsonLines):
    """Which entry pieces each step consumed (row, bucket, epoch, entry, token range): an audit of
    exactly-once delivery, written only when `training.record_consumption` is on."""

    def log(self, step: int, bucket_names: list[str], pieces: dict[str, np.ndarray]) -> None:
        record = {k: v.tolist() for k, v in pieces.items()}
        record["bucket"] = [bucket_names[i] for i in record["bucket"]]
        self.append({"step": step, **record})


def cut_back_logs(step: int, rank: int, world: int, metrics: MetricsLogger, consumption: ConsumptionLog,
                  mirror: "RunMirror | None") -> None:
    """Cut the JSON-lines logs back to the resumed `step`: later records are replayed, a torn last
    line and damaged lines are dropped (each named in one message per log, the valid lines around
    them kept), and consumption logs of ranks beyond a shrunk world size are cut back too (by rank
    0), so the logs on disk name exactly what the checkpoint consumed."""
    logs: list[JsonLines] = [consumption]
    if rank == 0:
        logs.append(metrics)
        for path in sorted(metrics.path.parent.glob("consumption-rank*.jsonl")):
            other = path.stem.removeprefix("consumption-rank")
            if other.isdigit() and int(other) >= world:
                logs.append(ConsumptionLog(path))
    for log in logs:
        cut = log.truncate_after(step)
        if cut.damaged:
            named = ", ".join(map(str, cut.damaged[:DAMAGED_LINES_NAMED]))
            unnamed = len(cut.damaged) - DAMAGED_LINES_NAMED
            more = f" and {unnamed} more" if unnamed > 0 else ""
            print(f"refinery train: {log.path}: dropped {len(cut.damaged)} damaged line(s) (line {named}{more}): not a "
                  "JSON record with a step; the valid lines before and after kept", file=sys.stderr)
        if cut.torn:
            print(f"refinery train: {log.path}: cut {cut.torn} unreadable line(s) at its end (a write interrupted "
                  "by a crash)", file=sys.stderr)
        if mirror is not None:
            mirror.sync_log(log.path, intact_lines=cut.intact_lines)
