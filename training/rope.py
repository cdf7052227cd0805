"""Rotary position embeddings (RoFormer) and YaRN (Peng et al. 2023), which extends a model trained
at one length to a longer one.

Positions stay continuous across packed documents (seed 003: RoPE is not reset at boundaries).
`GPT.set_rope_scaling` switches the model to a `RopeScaling` when a phase extends the context
(training/length_jump.py decides which phase gets which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeScaling:
    """YaRN: positions up to `factor * original_seq_len` on a model trained at `original_seq_len`.
    beta_fast/beta_slow bound the ramp in rotations over the original length (the paper's 32 and 1)."""

    factor: float
    original_seq_len: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self):
        if self.factor < 1.0:
            raise ValueError(f"rope scaling factor {self.factor} must be >= 1 (YaRN extends, never shrinks, the context)")
        if self.original_seq_len < 1 or self.beta_fast <= self.beta_slow:
            raise ValueError(f"rope scaling needs original_seq_len >= 1 and beta_fast > beta_slow, got {self}")


def rope_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def yarn_frequencies(head_dim: int, base: float, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """YaRN's NTK-by-parts inverse frequencies and its attention temperature, as float64.

    A pair whose wavelength fits more than beta_fast times into the original length keeps its
    frequency (extrapolates), one that fits fewer than beta_slow times is divided by `factor`
    (interpolates), and pairs in between blend linearly in the pair index. The returned mscale
    multiplies cos and sin, so q.k logits grow by mscale^2 = 1/t with sqrt(1/t) = 0.1 ln(factor) + 1."""
    inv_freq = rope_inv_freq(head_dim, base)

    def pair_index_at(rotations: float) -> float:  # the pair that turns `rotations` times over the original length
        return head_dim * math.log(scaling.original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index_at(scaling.beta_fast)), 0)
    high = min(math.ceil(pair_index_at(scaling.beta_slow)), head_dim // 2 - 1)
    span = max(high - low, 1e-3)  # equal bounds: a step, not a division by zero
    interpolated = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / span).clamp(0.0, 1.0)
    blended = inv_freq * (1.0 - interpolated) + inv_freq / scaling.factor * interpolated
    mscale = 0.1 * math.log(scaling.factor) + 1.0 if scaling.factor > 1.0 else 1.0
    return blended, mscale


def rope_tables(seq_len: int, head_dim: int, base: float, device: torch.device,
                scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq, mscale = yarn_frequencies(head_dim, base, scaling) if scaling else (rope_inv_freq(head_dim, base), 1.0)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return (angles.cos() * mscale).float().to(device), (angles.sin() * mscale).float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)
