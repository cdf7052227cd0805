"""The step plan of a curriculum run: the token schedule of refinery/curriculum/schedule.py (phase
boundaries, blended mixtures, the LR shape) laid onto optimizer steps.

`StepSchedule` is the trainer's one view of its phases, built from the phase manifests alone. The
sampler and `training.data` read a phase's seq_len here to cut rows; every other part of the trainer
asks for what it implies instead (`step_tokens`, `length_changes_at`, `rope_scalings`, `describe`),
so seq_len reaches the model through the six files docs/architecture.md lists
(tests/test_seq_len_path.py keeps it so).

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
from typing import Any, Sequence

import numpy as np

from refinery.config import RopeScalingConfig
from refinery.curriculum import PhaseManifest, Schedule, schedule_from_manifests
from training.rope import RopeScaling


def manifest_rope_spec(stored: str | dict[str, Any] | None) -> Any:
    """A manifest's `rope_scaling` as `phase_rope_scalings` takes it: YaRN fields become the config's
    section again (validated, with its defaults)."""
    return RopeScalingConfig.model_validate(stored) if isinstance(stored, dict) else stored


def phase_rope_scalings(seq_lens: Sequence[int], specs: Sequence[Any]) -> list[RopeScaling | None]:
    """The RoPE scaling of each phase. A spec is None (keep the previous phase's), "none", "auto"
    (YaRN from the native length, i.e. the original_seq_len already scaled from or else the
    previous phase's seq_len, to this phase's seq_len; plain RoPE when that is no longer), or an
    object with factor, original_seq_len, beta_fast, beta_slow."""
    out: list[RopeScaling | None] = []
    for i, (seq_len, spec) in enumerate(zip(seq_lens, specs, strict=True)):
        current = out[-1] if out else None
        if spec is None:
            out.append(current)
        elif spec == "none":
            out.append(None)
        elif spec == "auto":
            if i == 0:
                raise ValueError("curriculum.phases[0].rope_scaling auto: the first phase has no earlier length to "
                                 "scale from; give {type: yarn, factor, original_seq_len} or leave it unset")
            native = current.original_seq_len if current else seq_lens[i - 1]
            out.append(RopeScaling(seq_len / native, native) if seq_len > native else None)
        else:
            out.append(RopeScaling(spec.factor, spec.original_seq_len, spec.beta_fast, spec.beta_slow))
    return out


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

    def step_tokens(self, phase: int) -> int:
        """Tokens one step of phase `phase` trains: global_batch rows of its seq_len."""
        return self.global_batch * self.manifests[phase].seq_len

    def length_changes_at(self, step: int) -> bool:
        """Whether step `step` is the first at a seq_len other than the step before's (the length jump)."""
        return step > 0 and self.seq_len_at(step) != self.seq_len_at(step - 1)

    def rope_scalings(self) -> list[RopeScaling | None]:
        """Each phase's RoPE scaling: what its manifest pins, resolved against the manifests' seq_lens
        (what was validated is what is trained). Raises ValueError on "auto" in the first phase."""
        return phase_rope_scalings([m.seq_len for m in self.manifests],
                                   [manifest_rope_spec(m.rope_scaling) for m in self.manifests])

    def describe(self, phase: int) -> dict[str, Any]:
        """What a step's metrics record says about its phase."""
        m = self.manifests[phase]
        return {"phase": phase, "phase_name": m.phase, "seq_len": m.seq_len}

    def tokens_before(self, step: int) -> int:
        j = self.phase_at(step)
        return self.start_tokens[j] + (step - self.phase_starts[j]) * self.step_tokens(j)

    def read_point(self, step: int) -> int:
        """The token where step `step` reads its mixture and LR: the middle of the step, kept inside
        its phase's token span, so neither the first step (warmup from 0) nor the last (decay to 0)
        gets a zero LR and a step that straddles a boundary keeps its own phase's values."""
        mid = self.tokens_before(step) + self.step_tokens(self.phase_at(step)) // 2
        return min(mid, self.tokens.phases[self.phase_at(step)].end - 1)

    def phase_steps(self, phase: int) -> range:
        return range(self.phase_starts[phase], self.phase_starts[phase + 1])

    def phase_weights(self, phase: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The mixture of steps [lo, hi) of phase `phase` (counted from its first step; default all),
        (steps, buckets) aligned with `tokens.buckets`: `weights_at` of each step, computed at once
        (the same float operations)."""
        span, step_tokens = self.tokens.phases[phase], self.step_tokens(phase)
        hi = len(self.phase_steps(phase)) if hi is None else hi
        n = hi - lo
        point = np.minimum(self.start_tokens[phase] + np.arange(lo, hi, dtype=np.int64) * step_tokens
                           + step_tokens // 2, span.end - 1)
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
        warmup = warmup_steps * self.step_tokens(0)
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
