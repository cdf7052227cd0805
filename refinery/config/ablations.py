"""Proxy-model ablations (docs/ablations.md): variants of the corpus as selections over the stored
verdicts, each trained by the project's own trainer on a small fixed model for the same tokens, and
evaluated in bits per byte on one held-out set.

The checks here need the config alone (names, fractions, the funnel's stage and rule names);
whether a variant can fill the token budget needs the data and is refused when the variants are
built (refinery/ablations/build.py), naming `ablations.tokens` and the variant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from refinery.config.ablation_schedules import AnnealSearchConfig, ScheduleVariantConfig
from refinery.config.section import SAFE_PATH_PART, Section
from refinery.config.training import ModelConfig

# The variant every other one is compared with (the report's verdicts are against it).
FUNNEL_VARIANT = "funnel"

class VariantConfig(Section):
    """One variant: a selection over the funnel's stored verdicts (refinery/ablations/selection.py).
    `base` is where it starts: `funnel`, the documents the graph keeps, or `raw`, every document of
    extracted_text with every later verdict ignored. `without` (on the funnel only) lets back in what
    the named stages or rule families removed; `quality_top` then keeps the best-scored documents
    holding that fraction of each bucket's and language's tokens, as a phase's quality cut does."""

    base: Literal["raw", "funnel"] = Field(default="funnel", description="`funnel` (the documents the graph "
                                           "keeps) or `raw` (extracted_text's documents and text, no later verdict).")
    without: list[str] | None = Field(default=None, description="Stages (`heuristic_filtered`, `deduped`), "
                                      "verdicts by name or `skip:` name (`heuristic`, `near_dedup`) or rule families "
                                      "(`gopher_rep`, `c4`, a custom filter's name; refinery/stages/registry.py) "
                                      "whose rejections are ignored: the funnel plus the documents they removed. "
                                      "Not with `base: raw`; an empty list is refused (leave it out for the funnel).")
    quality_top: float | None = Field(default=None, gt=0.0, le=1.0, description="Keep the best-scored documents "
                                      "(by quality_score) holding this fraction (0, 1] of the variant's tokens of "
                                      "each bucket and language, kept whole, as a phase's quality_top_fraction; a "
                                      "document without a score is not kept.")

    @field_validator("without")
    @classmethod
    def _named(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("an empty list ignores nothing, so the variant is the funnel; name stages or rule "
                             "families, or leave `without` out")
        if len(set(v)) != len(v):
            raise ValueError(f"names repeat: {v}")
        return v

    @model_validator(mode="after")
    def _raw_ignores_everything(self) -> "VariantConfig":
        if self.base == "raw" and self.without is not None:
            raise ValueError("`without` needs `base: funnel`: `raw` ignores every verdict already")
        return self

    def is_funnel(self) -> bool:
        return self.base == "funnel" and self.without is None and self.quality_top is None


class AblationsConfig(Section):
    """Variants of the corpus trained on a small model for the same tokens and several seeds, and
    compared in bits per byte per evaluation domain and language (docs/ablations.md).

    A variant is *empty* when it selects what another variant selects (same base, the same verdicts
    and rule families left out however they are named, same `quality_top`): comparing the two
    measures only the seeds. `funnel` must be declared,
    as the plain funnel (`funnel: {}`): every verdict is against it. A variant that selects no
    document is refused when the variants are built."""

    variants: dict[str, VariantConfig] = Field(min_length=1, description="Name -> variant. Names become folder "
                                               "names and partition keys: letters, digits, `_`, `-`, `.`.")
    seeds: int = Field(default=3, ge=1, le=100, description="Proxy runs per variant, each with its own seed; "
                       "verdicts come from their spread (two at least for a verdict).")
    tokens: int | None = Field(default=None, gt=0, description="Tokens every variant trains on; none: the "
                               "smallest variant's, rounded down to whole optimizer steps. A variant that cannot "
                               "fill it is refused when the variants are built.")
    mixture: Literal["funnel", "proportional"] = Field(default="funnel", description="The bucket weights every "
                                                       "proxy run trains on: `funnel`, each bucket's share of the "
                                                       "`funnel` variant's tokens, the same for every variant (a "
                                                       "variant differs only in which documents of each bucket it "
                                                       "holds); `proportional`, each variant's own shares (its "
                                                       "mixture moves with its filters).")
    seq_len: int = Field(default=128, ge=8, description="Sequence length of the proxy runs (also the variants' "
                         "packing window).")
    model: ModelConfig = Field(default=ModelConfig(n_layer=2, n_head=4, n_embd=128),
                               description="The proxy model (training/model.py); vocab_size none takes the tokenizer's.")
    micro_batch_size: int = Field(default=8, ge=1, description="Rows per optimizer step of a proxy run.")
    lr: float = Field(default=3e-3, gt=0.0, description="Peak learning rate of a proxy run.")
    warmup_steps: int = Field(default=10, ge=0, description="Linear LR warmup steps of a proxy run.")
    eval_fraction: float = Field(default=0.05, gt=0.0, lt=1.0, description="Share of each evaluation bucket's "
                                 "documents held out of every variant for evaluation, chosen by a hash of the "
                                 "doc id and the seed before any variant is drawn.")
    eval_buckets: list[str] | None = Field(default=None, description="The buckets the held-out documents come "
                                           "from, each an evaluation domain of its name; none: every bucket a "
                                           "source feeds.")
    eval_sets: list[str] = Field(default_factory=list, description="More evaluation text: JSONL files of "
                                 "{\"id\", \"text\"} lines, relative to the config file; each file is a domain "
                                 "named after its file name.")
    schedules: dict[str, ScheduleVariantConfig] = Field(default_factory=dict, description="Schedule variants "
                                                        "(refinery/config/ablation_schedules.py): name -> a built-in "
                                                        "phase table (`curriculum`, `iid`, `no_anneal`, "
                                                        "`no_length_warmup`, `uniform_order`) with optional phase "
                                                        "patches, trained on the funnel variant's data.")
    anneal_search: AnnealSearchConfig | None = Field(default=None, description="Anneal mixtures branched from "
                                                     "each seed's `curriculum` schedule run before its last phase.")

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: dict[str, VariantConfig]) -> dict[str, VariantConfig]:
        problems = [f"{name!r} is not safe as a folder name and partition key; use letters, digits, '_', '-' and "
                    f"'.', starting with a letter or digit" for name in v if not SAFE_PATH_PART.match(name)]
        if FUNNEL_VARIANT not in v:
            problems.append(f"no variant named {FUNNEL_VARIANT!r}: every verdict is against the plain funnel; add "
                            f"`{FUNNEL_VARIANT}: {{}}`")
        elif not v[FUNNEL_VARIANT].is_funnel():
            problems.append(f"{FUNNEL_VARIANT!r} must be the plain funnel (`{FUNNEL_VARIANT}: {{}}`), every verdict is "
                            f"against it; give the other selection another name")
        if problems:
            raise ValueError("; ".join(problems))
        return v
