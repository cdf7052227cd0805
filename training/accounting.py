"""Run accounting: what each step served and what it cost, per phase and bucket.

`RunAccounting` counts tokens served per bucket (the `tokens/<bucket>` metrics), each phase's loss
sums and tokens per bucket (status.json's `summary`), and the run of consecutive non-finite steps;
its state travels in the checkpoint's train state. `mixture_report` is the one report of tokens
planned against tokens served, per phase and bucket: status.json's `mixture` (planned: the
curriculum's contract, which the manifests hold) and the sampler's own (planned: its allocation).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from training.schedule import StepSchedule


def mixture_report(planned: dict[str, dict[str, float]], served: dict[str, dict[str, int]]) -> dict[str, dict[str, dict[str, float]]]:
    """phase -> bucket -> {"planned": tokens planned for the whole phase, "served": tokens served so
    far}, for every bucket a phase plans or has served."""
    report: dict[str, dict[str, dict[str, float]]] = {}
    for phase in {**planned, **served}:
        plan, done = planned.get(phase, {}), served.get(phase, {})
        for bucket in {**plan, **done}:
            report.setdefault(phase, {})[bucket] = {"planned": float(plan.get(bucket, 0.0)), "served": int(done.get(bucket, 0))}
    return report


class RunAccounting:
    """Tokens and loss per phase and bucket, and the non-finite streak, over the steps trained."""

    def __init__(self, schedule: StepSchedule, bucket_names: list[str]):
        self.schedule, self.bucket_names = schedule, bucket_names
        self.nonfinite_streak = 0
        self.bucket_tokens: dict[str, int] = defaultdict(int)
        self.summary: dict[str, dict[str, dict[str, float]]] = {}  # phase -> bucket -> loss_sum, targets, tokens

    def count(self, phase_index: int, losses: list[float], targets: list[float], rows: list[int],
              finite: bool) -> dict[str, Any]:
        """Add one step of phase `phase_index`: per bucket (in `bucket_names` order) its summed loss,
        counted targets and rows of the global batch served; a non-finite step's loss is left out.
        Returns the step's `loss/<bucket>` and `tokens/<bucket>` metrics."""
        self.nonfinite_streak = 0 if finite else self.nonfinite_streak + 1
        phase, step_tokens = self.schedule.phase_names[phase_index], self.schedule.step_tokens(phase_index)
        record: dict[str, Any] = {}
        for b, name in enumerate(self.bucket_names):
            served = rows[b] * step_tokens // self.schedule.global_batch  # a step's rows are equally long
            if served == 0:
                continue
            self.bucket_tokens[name] += served
            if targets[b] > 0:
                record[f"loss/{name}"] = losses[b] / targets[b]
            acc = self.summary.setdefault(phase, {}).setdefault(name, {"loss_sum": 0.0, "targets": 0.0, "tokens": 0})
            if finite:
                acc["loss_sum"] += losses[b]
                acc["targets"] += targets[b]
            acc["tokens"] += served
        record.update({f"tokens/{name}": n for name, n in self.bucket_tokens.items()})
        return record

    def mixture_report(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per phase and bucket: tokens the curriculum plans for the whole phase and tokens served so far."""
        tokens = self.schedule.tokens
        per_phase = tokens.phase_bucket_tokens()
        planned = {phase: {b: float(per_phase[p, i]) for i, b in enumerate(tokens.buckets) if per_phase[p, i] > 0}
                   for p, phase in enumerate(self.schedule.phase_names)}
        served = {phase: {b: acc["tokens"] for b, acc in by_bucket.items()} for phase, by_bucket in self.summary.items()}
        return mixture_report(planned, served)

    def state_dict(self) -> dict[str, Any]:
        return {"nonfinite_streak": self.nonfinite_streak, "bucket_tokens": dict(self.bucket_tokens), "summary": self.summary}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.nonfinite_streak = state["nonfinite_streak"]
        self.bucket_tokens = defaultdict(int, state["bucket_tokens"])
        self.summary = state["summary"]
