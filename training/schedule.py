"""The step plan of a curriculum run: the token schedule of refinery/curriculum/schedule.py (phase
boundaries, blended mixtures, the LR shape) laid onto optimizer steps.

A step trains on `global_batch` rows of the current phase's seq_len. Step s belongs to the phase that
holds the token after `tokens_before(s)`, so a phase ends at the first step that reaches its token
boundary (the last step of a phase may overshoot it by less than one batch, and the next phase starts
that much later). Everything is a pure function of the manifests, the global batch and the step, so
a resumed run re-derives its phase from the step alone (seed 000: "statelessness matters").
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from refinery.curriculum import Schedule, schedule_from_manifests
from refinery.curriculum import PhaseManifest


@dataclass(frozen=True)
class StepSchedule:
    manifests: tuple[PhaseManifest, ...]
    tokens: Schedule
    global_batch: int
    phase_starts: tuple[int, ...]  # first step of each phase; a final sentinel = total steps
    start_tokens: tuple[int, ...]  # tokens trained before each phase's first step, and in all
    _fingerprints: dict[int, str] = field(default_factory=dict, compare=False, repr=False)
    _phase_fingerprints: dict[int, dict[str, str]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, manifests: list[PhaseManifest], global_batch: int) -> "StepSchedule":
        ordered = sorted(manifests, key=lambda m: m.index)
        buckets = sorted({b for m in ordered for b in m.weights})
        tokens = schedule_from_manifests(ordered, buckets)
        starts, start_tokens, step, done = [], [], 0, 0
        for span in tokens.phases:
            starts.append(step)
            start_tokens.append(done)
            while done < span.end:
                step += 1
                done += global_batch * span.seq_len
        return cls(tuple(ordered), tokens, global_batch, (*starts, step), (*start_tokens, done))

    @property
    def total_steps(self) -> int:
        return self.phase_starts[-1]

    @property
    def phase_names(self) -> list[str]:
        return [m.phase for m in self.manifests]

    def phase_at(self, step: int) -> int:
        """Index of the phase step `step` (0-based) trains in; a phase with no steps is skipped."""
        if step < 0:
            raise ValueError(f"step {step} is negative")
        return min(bisect.bisect_right(self.phase_starts, step) - 1, len(self.manifests) - 1)

    def is_last_step_of_phase(self, step: int) -> bool:
        return step + 1 in self.phase_starts[1:]

    def seq_len_at(self, step: int) -> int:
        return self.manifests[self.phase_at(step)].seq_len

    def tokens_before(self, step: int) -> int:
        j = self.phase_at(step)
        return self.start_tokens[j] + (step - self.phase_starts[j]) * self.global_batch * self.manifests[j].seq_len

    def read_point(self, step: int) -> int:
        """The token where step `step` reads its mixture and LR: the middle of the step, kept inside
        its phase's token span, so neither the first step (warmup from 0) nor the last (decay to 0)
        gets a zero LR and a step that straddles a boundary keeps its own phase's values."""
        mid = self.tokens_before(step) + self.global_batch * self.seq_len_at(step) // 2
        return min(mid, self.tokens.phases[self.phase_at(step)].end - 1)

    def phase_steps(self, phase: int) -> range:
        return range(self.phase_starts[phase], self.phase_starts[phase + 1])

    def phase_weights(self, phase: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The mixture of steps [lo, hi) of phase `phase` (counted from its first step; default all),
        (steps, buckets) aligned with `tokens.buckets`: `weights_at` of each step, computed at once
        (the same float operations)."""
        span, L = self.tokens.phases[phase], self.manifests[phase].seq_len
        hi = len(self.phase_steps(phase)) if hi is None else hi
        n = hi - lo
        point = np.minimum(self.start_tokens[phase] + np.arange(lo, hi, dtype=np.int64) * (self.global_batch * L)
                           + self.global_batch * L // 2, span.end - 1)
        if phase == 0 or span.blend_tokens == 0:
            return np.broadcast_to(span.weights, (n, len(span.weights))).astype(np.float64)
        lam = (point - span.start) / span.blend_tokens
        blended = (1.0 - lam)[:, None] * self.tokens.phases[phase - 1].weights + lam[:, None] * span.weights
        return np.where((lam >= 1.0)[:, None], span.weights, blended)

    def weights_at(self, step: int) -> dict[str, float]:
        """The mixture of step `step`, blended at a phase's start as the curriculum says."""
        w = self.tokens.weights_at(self.read_point(step))
        return {b: float(x) for b, x in zip(self.tokens.buckets, w)}

    def lr_at(self, step: int, peak: float, warmup_steps: int, stable: str, min_lr_ratio: float) -> float:
        """peak x the curriculum's LR multiplier (warmup, stable or cosine, linear decay to zero through
        the last phase, times lr_scale), with warmup_steps counted at the first phase's batch."""
        warmup = warmup_steps * self.global_batch * self.manifests[0].seq_len
        return peak * self.tokens.lr_multiplier(self.read_point(step), warmup, stable, min_lr_ratio)

    def phase_fingerprints_before(self, step: int) -> dict[str, str]:
        """Per phase the steps before `step` read: what identifies its manifest (to say which changed)."""
        started = self.phase_at(step - 1) + 1 if step > 0 else 0
        if started not in self._phase_fingerprints:  # one serialisation per phase prefix, as below
            self._phase_fingerprints[started] = {
                m.phase: hashlib.sha256(json.dumps(m.identity(), sort_keys=True).encode()).hexdigest()[:16]
                for m in self.manifests[:started]}
        return dict(self._phase_fingerprints[started])

    def fingerprint_before(self, step: int) -> str:
        """Identifies the global sample order of steps before `step`: the global batch and the
        manifests of the phases those steps read. Later phases may change (an anneal variant
        branching off a finished main phase) without changing what was already consumed."""
        started = self.phase_at(step - 1) + 1 if step > 0 else 0
        # One serialisation per phase prefix, not per step: the manifests are immutable here.
        if started not in self._fingerprints:
            payload = {"global_batch": self.global_batch, "manifests": [m.identity() for m in self.manifests[:started]]}
            self._fingerprints[started] = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
        return self._fingerprints[started]
