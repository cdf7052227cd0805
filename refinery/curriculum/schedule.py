"""The schedule maths: phases placed on the token axis, the mixture at any point of the run, the
seq_len, and the LR shape.

One place holds the schedule so the validator, the manifests and the trainer agree on every number
(seed 000): phase boundaries in tokens, the mixture at any point of the run (with linear blending
over a phase's first `interpolation` fraction of the schedule), the seq_len, and the LR multiplier.
Everything is a pure function of tokens consumed, so a resumed run reconstructs its place from one
integer. `place_phases` is the one builder of phase spans: `build_schedule` (from the config) and
`schedule_from_manifests` (manifests.py, from the phase manifests) both go through it; the per-phase
fields a plan and a span carry are those refinery/curriculum/phase_fields.py declares for them.

Weights are given per phase as fractions that sum to 1 and are then flattened by the mixture
temperature, p_i ∝ w_i^(1/T) (seed 001, KempnerForge's `log w / T` softmax; a zero weight stays 0).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from refinery.config import CurriculumConfig, RefineryConfig
from refinery.curriculum.phase_fields import PLAN, SPAN, schedule_fields

# Weights and shares are typed by people; a sum within this of 1 is 1.
SUM_TOLERANCE = 1e-6


class CurriculumError(ValueError):
    """A curriculum whose schedule cannot be computed. The message names the field and the fix."""


def apply_temperature(weights: np.ndarray, temperature: float) -> np.ndarray:
    """p_i ∝ w_i^(1/T), normalised (seed 001). T > 1 flattens the mixture, T < 1 sharpens it.

    Equal to KempnerForge's softmax of log(w_i)/T for positive weights; a zero weight stays zero
    instead of becoming exp(log(1e-12)/T), so a bucket switched off stays off at any temperature."""
    w = np.asarray(weights, dtype=np.float64)
    if (w < 0).any():
        raise CurriculumError(f"weights must be non-negative, got {w.tolist()}")
    if not w.any():
        raise CurriculumError("at least one weight must be positive")
    if temperature <= 0:
        raise CurriculumError(f"temperature must be positive, got {temperature}")
    if temperature == 1.0:
        return w / w.sum()
    positive = w > 0
    scaled = np.zeros_like(w)
    log_w = np.log(w[positive]) / temperature
    scaled[positive] = np.exp(log_w - log_w.max())
    return scaled / scaled.sum()


@dataclass(frozen=True)
class PhaseSpan:
    """One phase placed on the token axis: it runs over tokens [start, end)."""

    index: int
    name: str
    start: int
    end: int
    seq_len: int
    lr_scale: float
    weights: np.ndarray  # after temperature, aligned with Schedule.buckets, sums to 1
    blend_tokens: int  # the first blend_tokens of the phase ramp linearly from the previous mixture
    quality_top_fraction: float | None

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Schedule:
    """Phase boundaries, mixtures, seq_len and LR as functions of tokens consumed."""

    buckets: tuple[str, ...]
    phases: tuple[PhaseSpan, ...]

    @property
    def total_tokens(self) -> int:
        return self.phases[-1].end

    @property
    def max_seq_len(self) -> int:
        return max(p.seq_len for p in self.phases)

    @property
    def boundaries(self) -> list[int]:
        """Each phase's end in tokens (the right edges of seed 000's PHASE_BOUNDARIES)."""
        return [p.end for p in self.phases]

    def phase_index_at(self, tokens_consumed: int) -> int:
        """The phase that serves the token after `tokens_consumed`; past the end, the last phase."""
        if tokens_consumed < 0:
            raise ValueError(f"tokens_consumed must be >= 0, got {tokens_consumed}")
        return min(bisect.bisect_right(self.boundaries, tokens_consumed), len(self.phases) - 1)

    def phase_at(self, tokens_consumed: int) -> PhaseSpan:
        return self.phases[self.phase_index_at(tokens_consumed)]

    def weights_at(self, tokens_consumed: int) -> np.ndarray:
        """The mixture (aligned with `buckets`) at this point: the phase's, or inside its blend
        window (1 - λ) p_prev + λ p_phase with λ ramping linearly from 0 to 1 (seed 000)."""
        phase = self.phase_at(tokens_consumed)
        offset = tokens_consumed - phase.start
        if phase.index == 0 or offset >= phase.blend_tokens:
            return phase.weights
        lam = offset / phase.blend_tokens
        return (1.0 - lam) * self.phases[phase.index - 1].weights + lam * phase.weights

    def seq_len_at(self, tokens_consumed: int) -> int:
        return self.phase_at(tokens_consumed).seq_len

    def lr_multiplier(
        self,
        tokens_consumed: int,
        warmup_tokens: int,
        stable_schedule: str = "constant",
        min_lr_ratio: float = 0.0,
    ) -> float:
        """The factor on the base LR after `tokens_consumed` tokens.

        Linear warmup from 0 over `warmup_tokens`; then until the last phase starts either constant
        1 or a cosine from 1 down to `min_lr_ratio`; then a linear decay to 0 through the last
        phase (seed 000: linear, not cosine, through anneal); all times the phase's lr_scale."""
        phase = self.phase_at(tokens_consumed)
        decay_start = self.phases[-1].start if len(self.phases) > 1 else 0
        if stable_schedule == "constant":
            stable_end = 1.0
        elif stable_schedule == "cosine":
            span = max(decay_start - warmup_tokens, 1)
            progress = min(max(tokens_consumed - warmup_tokens, 0), span) / span
            stable_end = min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            raise ValueError(f"stable_schedule must be 'constant' or 'cosine', got {stable_schedule!r}")
        base = stable_end
        if tokens_consumed >= decay_start:
            at_decay_start = min_lr_ratio if stable_schedule == "cosine" else 1.0
            span = max(self.total_tokens - decay_start, 1)
            base = at_decay_start * max(0.0, 1.0 - (tokens_consumed - decay_start) / span)
        if warmup_tokens > 0 and tokens_consumed < warmup_tokens:
            base *= tokens_consumed / warmup_tokens
        return base * phase.lr_scale

    def phase_bucket_tokens(self) -> np.ndarray:
        """Expected tokens per (phase, bucket): budget x weights, with each blend window counted
        at the mean of the two mixtures it ramps between. Rows sum to the phase budgets."""
        out = np.zeros((len(self.phases), len(self.buckets)))
        for p in self.phases:
            out[p.index] = p.tokens * p.weights
            if p.index > 0 and p.blend_tokens:
                out[p.index] += p.blend_tokens * (self.phases[p.index - 1].weights - p.weights) / 2.0
        return out

    def bucket_tokens(self) -> dict[str, float]:
        """T_i = T * sum_j s_j p_i^(j) (seed 000), blend windows included."""
        totals = self.phase_bucket_tokens().sum(axis=0)
        return {b: float(t) for b, t in zip(self.buckets, totals)}

    def mean_seq_len(self) -> float:
        """The share-weighted mean seq_len, sum_j s_j L_j."""
        return sum(p.tokens * p.seq_len for p in self.phases) / self.total_tokens

    def attention_saving(self) -> dict[str, float]:
        """Attention compute saved by length warmup against running everything at Lmax.

        `saved_fraction` is seed 000's formula, sum_j s_j (Lmax^2 - L_j^2) / Lmax^2, and
        `ratio` = Lmax^2 / sum_j s_j L_j^2 (how many times less). Attention FLOPs per *token* grow
        with L, not L^2, so `per_token_ratio` = Lmax / mean seq_len is reported too: for seed 000's
        4K/4K/8K/32K it is 4.2x, the "roughly 4x" the seed quotes, while its L^2 formula gives 8.1x."""
        lmax = self.max_seq_len
        shares = [p.tokens / self.total_tokens for p in self.phases]
        mean_sq = sum(s * p.seq_len**2 for s, p in zip(shares, self.phases))
        return {
            "saved_fraction": sum(s * (lmax**2 - p.seq_len**2) for s, p in zip(shares, self.phases)) / lmax**2,
            "ratio": lmax**2 / mean_sq,
            "per_token_ratio": lmax / self.mean_seq_len(),
        }


def phase_kind(cur: CurriculumConfig) -> str:
    """'share' or 'tokens': how every phase gives its duration; 'mixed' when they do not agree."""
    if all(p.share is not None and p.tokens is None for p in cur.phases):
        return "share"
    if all(p.tokens is not None and p.share is None for p in cur.phases):
        return "tokens"
    return "mixed"


def phase_budgets(cur: CurriculumConfig) -> list[int]:
    """Token duration of each phase. Shares become cumulative boundaries rounded once, so the
    budgets are integers that add up exactly to total_tokens when the shares sum to 1."""
    kind = phase_kind(cur)
    if kind == "tokens":
        return [int(p.tokens) for p in cur.phases]  # type: ignore[arg-type]
    if kind != "share":
        raise CurriculumError(
            "curriculum.phases: give every phase a `share` of total_tokens, or every phase a `tokens` duration, "
            "not a mix and not both"
        )
    ends, acc = [], 0.0
    for p in cur.phases:
        acc += p.share  # type: ignore[operator]
        ends.append(round(cur.total_tokens * acc))
    if abs(acc - 1.0) <= SUM_TOLERANCE:
        ends[-1] = cur.total_tokens
    return [e - s for s, e in zip([0, *ends[:-1]], ends)]


@dataclass(frozen=True)
class PhasePlan:
    """One phase before it is placed on the token axis: its duration and what it trains with."""

    name: str
    tokens: int
    seq_len: int
    lr_scale: float
    weights: np.ndarray  # after temperature, aligned with the schedule's buckets
    interpolation: float  # fraction of the whole schedule blended at the phase's start
    quality_top_fraction: float | None = None


def place_phases(buckets: tuple[str, ...], plans: list[PhasePlan]) -> Schedule:
    """The schedule of `plans` run one after the other: the one builder of phase spans. A phase's
    blend window is its `interpolation` of the whole schedule's tokens (none for the first)."""
    total = sum(p.tokens for p in plans)
    carried = [f.name for f in schedule_fields(SPAN)]
    phases, start = [], 0
    for i, p in enumerate(plans):
        phases.append(
            PhaseSpan(
                index=i,
                start=start,
                end=start + p.tokens,
                blend_tokens=round(p.interpolation * total) if i > 0 else 0,
                **{name: getattr(p, name) for name in carried},
            )
        )
        start += p.tokens
    return Schedule(buckets=buckets, phases=tuple(phases))


def build_schedule(cfg: RefineryConfig) -> Schedule:
    """The schedule of `cfg.curriculum` over `cfg.buckets`. Raises CurriculumError when it cannot
    be computed at all (no curriculum, mixed duration kinds, negative or all-zero weights);
    `validate` reports every other problem without raising."""
    cur = cfg.curriculum
    if cur is None:
        raise CurriculumError("curriculum: no curriculum declared; add a `curriculum:` section (see configs/demo.yaml)")
    buckets = tuple(cfg.buckets)
    as_given = [f.name for f in schedule_fields(PLAN) if not f.derived]  # the budget and the weights: below
    plans = []
    for i, (p, budget) in enumerate(zip(cur.phases, phase_budgets(cur))):
        raw = np.array([p.weights.get(b, 0.0) for b in buckets])
        try:
            weights = apply_temperature(raw, cur.temperature)
        except CurriculumError as err:
            raise CurriculumError(f"curriculum.phases[{i}].weights ({p.name}): {err}") from None
        plans.append(PhasePlan(tokens=budget, weights=weights, **{name: getattr(p, name) for name in as_given}))
    return place_phases(buckets, plans)


def batch_tokens(cfg: RefineryConfig, seq_len: int) -> int:
    """Tokens one optimizer step consumes on one rank at `seq_len`."""
    return cfg.training.micro_batch_size * cfg.training.grad_accum_steps * seq_len


def warmup_tokens(cfg: RefineryConfig, schedule: Schedule) -> int:
    """training.warmup_steps in tokens, counted at the first phase's batch size."""
    return cfg.training.warmup_steps * batch_tokens(cfg, schedule.phases[0].seq_len)
