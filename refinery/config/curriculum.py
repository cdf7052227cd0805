"""The curriculum's schema: ordered phases over a token budget, their mixtures, sequence lengths,
LR scales and RoPE scaling, and how often each bucket may be read."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from refinery.config.section import Section


class BucketPolicy(Section):
    """How often a bucket may be read. `max_epochs` is OLMo-core's max repetition ratio: inventory
    is the bucket's tokens times it. Default 1 (no repetition, the SPEC's default); small curated
    buckets usually allow more (math runs ~10 epochs in seed 000)."""

    max_epochs: float = Field(default=1.0, gt=0.0)


class RopeScalingConfig(Section):
    """YaRN for a phase longer than the model was trained at (training/rope.py: RopeScaling):
    positions up to factor x original_seq_len."""

    type: Literal["yarn"] = "yarn"
    factor: float = Field(ge=1.0)
    original_seq_len: int = Field(gt=0)
    beta_fast: float = Field(default=32.0, gt=0.0)
    beta_slow: float = Field(default=1.0, gt=0.0)


# More bands than this cut a bucket finer than a difficulty proxy resolves, and each band is one more
# block order per pass and one more histogram when phase_manifests computes the cutoffs.
MAX_ORDER_BANDS = 100


class OrderConfig(Section):
    """An order within each bucket of a phase (seed 000: easier documents first inside the main
    phase): the phase's entries cut into `bands` equal-count bands by `by` (`difficulty`, the
    per-document mean token loss under the pipeline's reference model), served band after band,
    shuffled within a band by the seed; `easy_first` serves the lowest difficulty first, `hard_first`
    the highest. Entries without a score form one more band, served last (docs/curriculum.md)."""

    by: Literal["difficulty"]
    direction: Literal["easy_first", "hard_first"] = "easy_first"
    bands: int = Field(default=10, ge=1, le=MAX_ORDER_BANDS)

    def describe(self) -> str:
        return f"{self.direction} by {self.by}, {self.bands} band{'s' if self.bands != 1 else ''}"


class PhaseConfig(Section):
    """One curriculum phase (seed 000). Give `share` of total_tokens or `tokens`, the same kind
    across the whole curriculum. `rope_scaling` (seed 000: YaRN at the step where seq_len changes):
    unset keeps the previous phase's RoPE, "none" plain RoPE, "auto" YaRN from the model's native
    length (the first phase's, or the original_seq_len already scaled from) to this seq_len, or an
    explicit {type: yarn, factor, original_seq_len}. `order` (default none: a uniform shuffle per
pass) serves each bucket's entries in difficulty bands (OrderConfig)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$")
    share: float | None = Field(default=None, gt=0.0, le=1.0)
    tokens: int | None = Field(default=None, gt=0)
    weights: dict[str, float]
    seq_len: int = Field(gt=0)
    lr_scale: float = Field(default=1.0, gt=0.0)
    # The best-scored documents holding this fraction of each bucket's tokens (of each language's,
    # per quality_cut), kept whole (docs/curriculum.md).
    quality_top_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    # How the quality cut ranks a bucket: within each language (each keeps its share of the
    # bucket; the entry table's language column), or the whole bucket as one.
    quality_cut: Literal["per_language", "global"] = "per_language"
    interpolation: float = Field(default=0.0, ge=0.0, lt=0.5)  # fraction of the schedule blended at its start
    rope_scaling: RopeScalingConfig | Literal["auto", "none"] | None = None
    order: OrderConfig | None = None


class CurriculumConfig(Section):
    """Ordered phases over a token budget (seed 000). `temperature` flattens (>1) or sharpens (<1)
    every phase's weights, p_i ∝ w_i^(1/T) (seed 001; 1.0 uses them as given). Exhaustion and
    budget mismatch are blocking validation errors unless allowed (seed 003's flags). Checked by
    `refinery.curriculum.validate`; see docs/curriculum.md."""

    total_tokens: int = Field(gt=0)
    temperature: float = Field(default=1.0, gt=0.0)
    allow_bucket_exhaustion: bool = False
    allow_budget_mismatch: bool = False
    buckets: dict[str, BucketPolicy] = Field(default_factory=dict)
    phases: list[PhaseConfig] = Field(min_length=1)
