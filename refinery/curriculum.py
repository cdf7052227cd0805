"""The curriculum as data: schedule maths, the validation contract, and each phase's inventory.

One place holds the schedule so the validator, the manifests and the trainer agree on every number
(seed 000): phase boundaries in tokens, the mixture at any point of the run (with linear blending
over a phase's first `interpolation` fraction of the schedule), the seq_len, and the LR multiplier.
Everything is a pure function of tokens consumed, so a resumed run reconstructs its place from one
integer.

Weights are given per phase as fractions that sum to 1 and are then flattened by the mixture
temperature, p_i ∝ w_i^(1/T) (seed 001, KempnerForge's `log w / T` softmax; a zero weight stays 0).

Inventory is what the final shuffled shards hold per bucket; a bucket may be read `max_epochs` times
(OLMo-core's max repetition ratio), so demand is checked against tokens x max_epochs. A phase with a
quality cutoff draws only from the top fraction of each bucket by `quality_score`; its demand is
also checked against that slice.
"""

from __future__ import annotations

import bisect
import io
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from refinery.config import ConfigError, CurriculumConfig, RefineryConfig

if TYPE_CHECKING:
    from refinery.manifest import PhaseManifest, ShardRef
    from refinery.storage import DataRoot

# Weights and shares are typed by people; a sum within this of 1 is 1.
SUM_TOLERANCE = 1e-6
FINAL_SHARDS_PREFIX = "shards/final"


class CurriculumError(ValueError):
    """A curriculum whose schedule cannot be computed. The message names the field and the fix."""


class CurriculumMismatch(ConfigError):
    """The config's curriculum is not the one the phase manifests were built from, or is invalid;
    training would follow a plan nobody wrote. The message lists every difference by field."""


# --------------------------------------------------------------------------------------------------
# Mixture maths
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------------------------------


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


def build_schedule(cfg: RefineryConfig) -> Schedule:
    """The schedule of `cfg.curriculum` over `cfg.buckets`. Raises CurriculumError when it cannot
    be computed at all (no curriculum, mixed duration kinds, negative or all-zero weights);
    `validate` reports every other problem without raising."""
    cur = cfg.curriculum
    if cur is None:
        raise CurriculumError("curriculum: no curriculum declared; add a `curriculum:` section (see configs/demo.yaml)")
    buckets = tuple(cfg.buckets)
    budgets = phase_budgets(cur)
    total = sum(budgets)
    phases, start = [], 0
    for i, (p, budget) in enumerate(zip(cur.phases, budgets)):
        raw = np.array([p.weights.get(b, 0.0) for b in buckets])
        try:
            weights = apply_temperature(raw, cur.temperature)
        except CurriculumError as err:
            raise CurriculumError(f"curriculum.phases[{i}].weights ({p.name}): {err}") from None
        phases.append(
            PhaseSpan(
                index=i,
                name=p.name,
                start=start,
                end=start + budget,
                seq_len=p.seq_len,
                lr_scale=p.lr_scale,
                weights=weights,
                blend_tokens=round(p.interpolation * total) if i > 0 else 0,
                quality_top_fraction=p.quality_top_fraction,
            )
        )
        start += budget
    return Schedule(buckets=buckets, phases=tuple(phases))


def schedule_from_manifests(manifests: list["PhaseManifest"], buckets: list[str] | None = None) -> Schedule:
    """The same schedule rebuilt from the phase manifests alone (what the trainer holds): their
    budgets, seq_lens, lr_scales, weights (already after temperature) and blend widths."""
    if not manifests:
        raise CurriculumError("no phase manifests; materialize phase_manifests first")
    ordered = sorted(manifests, key=lambda m: m.index)
    names = tuple(buckets) if buckets is not None else tuple(ordered[0].weights)
    total = sum(m.token_budget for m in ordered)
    phases, start = [], 0
    for i, m in enumerate(ordered):
        phases.append(
            PhaseSpan(
                index=i,
                name=m.phase,
                start=start,
                end=start + m.token_budget,
                seq_len=m.seq_len,
                lr_scale=m.lr_scale,
                weights=np.array([m.weights.get(b, 0.0) for b in names]),
                blend_tokens=round(m.interpolation * total) if i > 0 else 0,
                quality_top_fraction=None,
            )
        )
        start += m.token_budget
    return Schedule(buckets=names, phases=tuple(phases))


def batch_tokens(cfg: RefineryConfig, seq_len: int) -> int:
    """Tokens one optimizer step consumes on one rank at `seq_len`."""
    return cfg.training.micro_batch_size * cfg.training.grad_accum_steps * seq_len


def warmup_tokens(cfg: RefineryConfig, schedule: Schedule) -> int:
    """training.warmup_steps in tokens, counted at the first phase's batch size."""
    return cfg.training.warmup_steps * batch_tokens(cfg, schedule.phases[0].seq_len)


# --------------------------------------------------------------------------------------------------
# Inventory: what the final shards hold
# --------------------------------------------------------------------------------------------------


def final_index_key(bucket: str) -> str:
    """shuffled_shards' listing of a bucket's final shards: each shard's prefix, tokens, entries and
    sha256 by suffix, in order, plus `entries_table` (key, sha256) of the per-entry table."""
    return f"{FINAL_SHARDS_PREFIX}/{bucket}/index.json"


@dataclass(frozen=True)
class BucketInventory:
    """A bucket's final shards in order, and per entry (in global entry order, shard 0 first) its
    tokens, doc_id and quality_score (NaN where the document has none)."""

    bucket: str
    shards: list["ShardRef"]
    entry_tokens: np.ndarray  # int64
    doc_ids: list[str]
    quality: np.ndarray  # float64

    @property
    def tokens(self) -> int:
        return int(self.entry_tokens.sum())

    @property
    def entries(self) -> int:
        return len(self.entry_tokens)


def has_final_shards(root: "DataRoot", buckets: list[str] | tuple[str, ...]) -> bool:
    return any(root.exists(final_index_key(b)) for b in buckets)


def read_bucket_inventory(root: "DataRoot", bucket: str) -> BucketInventory:
    """The bucket's final shards from shuffled_shards' index.json and per-entry table. A bucket
    without an index has an empty inventory (0 tokens), which validation reports if it is weighted."""
    from refinery.manifest import ShardRef

    key = final_index_key(bucket)
    if not root.exists(key):
        return BucketInventory(bucket, [], np.zeros(0, dtype=np.int64), [], np.zeros(0))
    index = root.read_json(key)
    try:
        refs = [ShardRef(prefix=s["prefix"], tokens=int(s["tokens"]), entries=int(s["entries"]), sha256=dict(s["sha256"])) for s in index["shards"]]
        table_key = index["entries_table"]["key"]
    except (KeyError, TypeError) as err:
        raise CurriculumError(f"{root.display(key)}: malformed shard index ({err}); re-materialize shuffled_shards[{bucket}]") from None
    table = root.read_parquet(table_key, columns=["tokens", "doc_id", "quality_score"])
    if table.height != sum(r.entries for r in refs) or int(table["tokens"].sum() or 0) != sum(r.tokens for r in refs):
        raise CurriculumError(
            f"{root.display(table_key)}: {table.height} entries / {table['tokens'].sum()} tokens, but {root.display(key)} "
            f"lists {sum(r.entries for r in refs)} / {sum(r.tokens for r in refs)}; re-materialize shuffled_shards[{bucket}]"
        )
    return BucketInventory(
        bucket=bucket,
        shards=refs,
        entry_tokens=table["tokens"].cast(int).to_numpy().astype(np.int64),
        doc_ids=table["doc_id"].to_list(),
        quality=table["quality_score"].cast(float).fill_null(float("nan")).to_numpy().astype(np.float64),
    )


def read_inventory(root: "DataRoot", buckets: list[str] | tuple[str, ...]) -> dict[str, BucketInventory]:
    from refinery.progress import track

    return {b: read_bucket_inventory(root, b) for b in track(buckets, desc="validate: read bucket inventory", unit="bucket")}


@dataclass(frozen=True)
class QualitySelection:
    """The entries of a bucket a phase keeps under its quality cutoff."""

    entry_ids: np.ndarray  # sorted int64 global entry ids
    cutoff: float  # the lowest kept document score
    documents: int
    tokens: int


def select_top_quality(inv: BucketInventory, top_fraction: float) -> QualitySelection:
    """Keep the documents whose quality_score is at or above the score of the document ranked
    ceil(top_fraction x documents), best first, with every window of a kept document. Ties at
    the cutoff are all kept; a document without a score (empty text) is never kept."""
    doc_score = dict(zip(inv.doc_ids, inv.quality.tolist()))
    scored = np.array([s for s in doc_score.values() if not math.isnan(s)], dtype=np.float64)
    if scored.size == 0:
        return QualitySelection(entry_ids=np.zeros(0, dtype=np.int64), cutoff=math.inf, documents=0, tokens=0)
    keep_docs = max(1, math.ceil(top_fraction * len(doc_score)))
    cutoff = float(np.sort(scored)[::-1][min(keep_docs, scored.size) - 1])
    kept = np.flatnonzero(inv.quality >= cutoff).astype(np.int64)
    return QualitySelection(
        entry_ids=kept,
        cutoff=cutoff,
        documents=sum(1 for s in doc_score.values() if s >= cutoff),
        tokens=int(inv.entry_tokens[kept].sum()),
    )


def phase_selections(cfg: RefineryConfig, inventory: dict[str, BucketInventory]) -> dict[str, dict[str, QualitySelection]]:
    """For each phase with a quality cutoff: each non-empty bucket's kept entries."""
    assert cfg.curriculum is not None
    return {
        p.name: {b: select_top_quality(inv, p.quality_top_fraction) for b, inv in inventory.items() if inv.entries}
        for p in cfg.curriculum.phases
        if p.quality_top_fraction is not None
    }


def selection_npy(entry_ids: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(entry_ids, dtype=np.int64))
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------
# Validation: the contract printed before any compute is spent
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass
class ValidationReport:
    ok: bool
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    contract: dict[str, Any] | None = None  # None when the schedule itself could not be computed

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "errors": [str(e) for e in self.errors],
            "warnings": [str(w) for w in self.warnings],
            "contract": self.contract,
        }


def _fmt(n: float) -> str:
    return f"{n:,.0f}" if abs(n) >= 100 else f"{n:,.2f}"


def _check_structure(cfg: RefineryConfig, errors: list[Finding]) -> None:
    cur = cfg.curriculum
    assert cur is not None
    known = set(cfg.buckets)
    names = [p.name for p in cur.phases]
    if len(set(names)) != len(names):
        errors.append(Finding("curriculum.phases[*].name", f"phase names repeat: {names}; give each phase its own name"))
    for i, p in enumerate(cur.phases):
        where = f"curriculum.phases[{i}]"
        if (p.share is None) == (p.tokens is None):
            what = "both `share` and `tokens`" if p.share is not None else "neither `share` nor `tokens`"
            errors.append(Finding(where, f"phase {p.name!r} gives {what}; give exactly one"))
        for b, w in p.weights.items():
            if b not in known:
                errors.append(
                    Finding(f"{where}.weights.{b}", f"unknown bucket {b!r}; declare it under `buckets:` or use one of {sorted(known)}")
                )
            if w < 0:
                errors.append(Finding(f"{where}.weights.{b}", f"weight {w} is negative; weights are fractions of the phase's tokens, set it to 0 or more"))
        total_w = math.fsum(p.weights.values())
        if abs(total_w - 1.0) > SUM_TOLERANCE:
            errors.append(
                Finding(
                    f"{where}.weights",
                    f"weights of phase {p.name!r} sum to {total_w:.6g}, not 1; scale them so they sum to 1 "
                    f"(curriculum.temperature reshapes them afterwards)",
                )
            )
        if p.seq_len > cfg.shards.max_seq_len:
            errors.append(
                Finding(
                    f"{where}.seq_len",
                    f"{p.seq_len} is longer than the packed window shards.max_seq_len = {cfg.shards.max_seq_len}; "
                    f"lower the phase's seq_len or raise shards.max_seq_len and re-run tokenized_shards",
                )
            )
        if i == 0 and p.interpolation > 0:
            errors.append(
                Finding(f"{where}.interpolation", "the first phase has no previous mixture to blend from; set it to 0")
            )
    kind = phase_kind(cur)
    if kind == "mixed" and not any((p.share is None) == (p.tokens is None) for p in cur.phases):
        errors.append(
            Finding("curriculum.phases", "some phases give `share` and others `tokens`; use one kind across the curriculum")
        )
    if kind == "share":
        total_s = math.fsum(p.share for p in cur.phases)  # type: ignore[misc]
        if abs(total_s - 1.0) > SUM_TOLERANCE:
            errors.append(
                Finding(
                    "curriculum.phases[*].share",
                    f"shares sum to {total_s:.6g}, not 1; scale them so they sum to 1 (or give `tokens` durations)",
                )
            )


def _check_budget(cfg: RefineryConfig, schedule: Schedule, errors: list[Finding], warnings: list[Finding]) -> None:
    cur = cfg.curriculum
    assert cur is not None
    sink = warnings if cur.allow_budget_mismatch else errors
    fix = "" if cur.allow_budget_mismatch else " (or set curriculum.allow_budget_mismatch: true)"
    if phase_kind(cur) == "tokens" and schedule.total_tokens != cur.total_tokens:
        sink.append(
            Finding(
                "curriculum.phases[*].tokens",
                f"phase durations sum to {schedule.total_tokens:,}, not curriculum.total_tokens = {cur.total_tokens:,}; "
                f"make them add up{fix}",
            )
        )
    for p in schedule.phases:
        step = batch_tokens(cfg, p.seq_len)
        if p.tokens % step:
            sink.append(
                Finding(
                    f"curriculum.phases[{p.index}]",
                    f"phase {p.name!r} budget {p.tokens:,} tokens is not a whole number of optimizer steps of {step:,} "
                    f"tokens (training.micro_batch_size x grad_accum_steps x seq_len {p.seq_len}), so the trainer "
                    f"would consume {math.ceil(p.tokens / step) * step:,}; make the budget a multiple of {step:,}{fix}",
                )
            )
        if p.blend_tokens > p.tokens:
            errors.append(
                Finding(
                    f"curriculum.phases[{p.index}].interpolation",
                    f"the blend window ({p.blend_tokens:,} tokens) is longer than phase {p.name!r} ({p.tokens:,}); lower it",
                )
            )


def _check_inventory(
    cfg: RefineryConfig,
    schedule: Schedule,
    inventory: dict[str, int],
    selections: dict[str, dict[str, int]],
    errors: list[Finding],
    warnings: list[Finding],
) -> None:
    cur = cfg.curriculum
    assert cur is not None
    exhaust = warnings if cur.allow_bucket_exhaustion else errors
    fix = "" if cur.allow_bucket_exhaustion else ", or set curriculum.allow_bucket_exhaustion: true"
    per_phase = schedule.phase_bucket_tokens()
    demand = per_phase.sum(axis=0)
    for bi, bucket in enumerate(schedule.buckets):
        weighted = [p for p in schedule.phases if p.weights[bi] > 0]
        if not weighted:
            continue
        have = inventory.get(bucket, 0)
        if have == 0:
            errors.append(
                Finding(
                    f"curriculum.phases[{weighted[0].index}].weights.{bucket}",
                    f"bucket {bucket!r} has no tokens in its final shards but phase {weighted[0].name!r} gives it weight "
                    f"{weighted[0].weights[bi]:.3g}; feed the bucket data (check its sources and the funnel's rejects) "
                    f"or set its weight to 0",
                )
            )
            continue
        max_epochs = cur.buckets[bucket].max_epochs if bucket in cur.buckets else 1.0
        if demand[bi] > have * max_epochs:
            exhaust.append(
                Finding(
                    f"curriculum.buckets.{bucket}.max_epochs",
                    f"bucket {bucket!r} needs {_fmt(demand[bi])} tokens but holds {have:,} x max_epochs {max_epochs:g} = "
                    f"{_fmt(have * max_epochs)}; raise max_epochs to at least {demand[bi] / have:.2f}, lower its weights{fix}",
                )
            )
        for p in schedule.phases:
            sel = selections.get(p.name, {}).get(bucket)
            if sel is None or per_phase[p.index, bi] <= 0:
                continue
            if per_phase[p.index, bi] > sel * max_epochs:
                exhaust.append(
                    Finding(
                        f"curriculum.phases[{p.index}].quality_top_fraction",
                        f"phase {p.name!r} needs {_fmt(per_phase[p.index, bi])} tokens of {bucket!r} but its quality "
                        f"cutoff keeps {sel:,} x max_epochs {max_epochs:g}; raise quality_top_fraction or "
                        f"curriculum.buckets.{bucket}.max_epochs, lower the weight{fix}",
                    )
                )


def contract(cfg: RefineryConfig, schedule: Schedule, inventory: dict[str, int] | None) -> dict[str, Any]:
    """The numbers `refinery validate` prints and every manifest carries."""
    cur = cfg.curriculum
    assert cur is not None
    per_phase = schedule.phase_bucket_tokens()
    demand = per_phase.sum(axis=0)
    buckets = {}
    for bi, b in enumerate(schedule.buckets):
        have = None if inventory is None else inventory.get(b, 0)
        max_epochs = cur.buckets[b].max_epochs if b in cur.buckets else 1.0
        buckets[b] = {
            "tokens": float(demand[bi]),
            "inventory_tokens": have,
            "max_epochs": max_epochs,
            "effective_epochs": None if not have else float(demand[bi] / have),
            "shortfall": None if have is None else float(max(0.0, demand[bi] - have * max_epochs)),
        }
    return {
        "total_tokens": cur.total_tokens,
        "schedule_tokens": schedule.total_tokens,
        "temperature": cur.temperature,
        "inventory_known": inventory is not None,
        "phases": [
            {
                "name": p.name,
                "start": p.start,
                "end": p.end,
                "tokens": p.tokens,
                "share": p.tokens / schedule.total_tokens,
                "seq_len": p.seq_len,
                "lr_scale": p.lr_scale,
                "blend_tokens": p.blend_tokens,
                "quality_top_fraction": p.quality_top_fraction,
                "weights": {b: float(w) for b, w in zip(schedule.buckets, p.weights)},
                "bucket_tokens": {b: float(t) for b, t in zip(schedule.buckets, per_phase[p.index])},
            }
            for p in schedule.phases
        ],
        "buckets": buckets,
        "mean_seq_len": schedule.mean_seq_len(),
        "attention": schedule.attention_saving(),
    }


def validate(
    cfg: RefineryConfig,
    inventory: dict[str, int] | None = None,
    selections: dict[str, dict[str, int]] | None = None,
) -> ValidationReport:
    """Every blocking error and warning of the curriculum, and its contract.

    `inventory` is tokens per bucket in the final shards (None: unknown, only the schedule is
    checked); `selections` is, for each phase with a quality cutoff, the tokens each bucket keeps."""
    if cfg.curriculum is None:
        raise CurriculumError("curriculum: no curriculum declared; add a `curriculum:` section (see configs/demo.yaml)")
    errors: list[Finding] = []
    warnings: list[Finding] = []
    _check_structure(cfg, errors)
    try:
        schedule = build_schedule(cfg)
    except CurriculumError:
        return ValidationReport(ok=False, errors=errors, warnings=warnings)
    _check_budget(cfg, schedule, errors, warnings)
    if inventory is None:
        warnings.append(
            Finding("inventory", "unknown (no final shards yet); only the schedule was checked, materialize shuffled_shards")
        )
    else:
        _check_inventory(cfg, schedule, inventory, selections or {}, errors, warnings)
    return ValidationReport(ok=not errors, errors=errors, warnings=warnings, contract=contract(cfg, schedule, inventory))


def validate_data_root(cfg: RefineryConfig, root: "DataRoot") -> tuple[ValidationReport, dict[str, BucketInventory] | None, dict[str, dict[str, QualitySelection]]]:
    """Validate against what the data root holds: inventory from the final shards when there
    are any, and the quality cutoffs' selections from the clean tables."""
    if not has_final_shards(root, cfg.buckets):
        return validate(cfg), None, {}
    inventory = read_inventory(root, cfg.buckets)
    selections = phase_selections(cfg, inventory)
    report = validate(
        cfg,
        {b: inv.tokens for b, inv in inventory.items()},
        {ph: {b: s.tokens for b, s in sel.items()} for ph, sel in selections.items()},
    )
    return report, inventory, selections


# --------------------------------------------------------------------------------------------------
# Per-phase manifests
# --------------------------------------------------------------------------------------------------


def selection_key(phase: str, bucket: str) -> str:
    """Where a phase's kept entry ids of a bucket live (the contamination drop policy rewrites it)."""
    return f"manifests/{phase}/{bucket}-selection.npy"


def drawn_buckets(schedule: Schedule, span: PhaseSpan) -> list[str]:
    """Buckets the phase may draw from: its own positive weights, and during its blend window the
    previous phase's."""
    drawn = span.weights > 0
    if span.index > 0 and span.blend_tokens:
        drawn |= schedule.phases[span.index - 1].weights > 0
    return [b for b, d in zip(schedule.buckets, drawn) if d]


def build_phase_manifest(
    cfg: RefineryConfig,
    root: "DataRoot",
    phase: str,
    report: ValidationReport,
    inventory: dict[str, BucketInventory],
    selections: dict[str, dict[str, QualitySelection]],
) -> "PhaseManifest":
    """The manifest of `phase`: per drawn bucket its final shards (pinned by sha256) and, under a
    quality cutoff, the kept entries written as a sorted int64 .npy; plus the phase's budget,
    weights after temperature, seq_len, lr_scale, blend width and the validation result. Documents
    the contamination drop policy excluded from this phase stay excluded."""
    from refinery.contamination import apply_exclusions, exclusions_key
    from refinery.manifest import BucketSlice, PhaseManifest

    assert cfg.curriculum is not None
    schedule = build_schedule(cfg)
    names = [p.name for p in schedule.phases]
    if phase not in names:
        raise CurriculumError(f"unknown phase {phase!r}; the curriculum has {names}")
    span = schedule.phases[names.index(phase)]
    policy = cfg.curriculum.buckets
    buckets = {}
    for b in drawn_buckets(schedule, span):
        inv = inventory[b]
        max_epochs = policy[b].max_epochs if b in policy else 1.0
        sel = selections.get(phase, {}).get(b)
        if sel is None:
            buckets[b] = BucketSlice(bucket=b, shards=inv.shards, tokens=inv.tokens, entries=inv.entries, max_epochs=max_epochs)
            continue
        key = selection_key(phase, b)
        digest = root.write_bytes(key, selection_npy(sel.entry_ids))
        buckets[b] = BucketSlice(
            bucket=b,
            shards=inv.shards,
            tokens=sel.tokens,
            entries=len(sel.entry_ids),
            max_epochs=max_epochs,
            selection=key,
            selection_sha256=digest,
            quality_cutoff=sel.cutoff,
        )
    manifest = PhaseManifest(
        phase=phase,
        index=span.index,
        token_budget=span.tokens,
        seq_len=span.seq_len,
        lr_scale=span.lr_scale,
        weights={b: float(w) for b, w in zip(schedule.buckets, span.weights)},
        interpolation=cfg.curriculum.phases[span.index].interpolation,
        buckets=buckets,
        validation=report.to_json(),
        config_fingerprint=cfg.fingerprint(),
    )
    excluded_key = exclusions_key(phase)
    if root.exists(excluded_key):
        manifest = apply_exclusions(root, manifest, set(root.read_json(excluded_key)))
    return manifest


# --------------------------------------------------------------------------------------------------
# The config against the manifests a run would train on
# --------------------------------------------------------------------------------------------------

# Weights in a manifest went through JSON and the temperature; a difference below this is rounding.
WEIGHT_TOLERANCE = 1e-9


def structure_findings(cfg: RefineryConfig) -> list[Finding]:
    """The curriculum's blocking errors that need no inventory (see `refuse_invalid`)."""
    errors: list[Finding] = []
    _check_structure(cfg, errors)
    if not errors:
        try:
            build_schedule(cfg)
        except CurriculumError as err:
            errors.append(Finding("curriculum", str(err)))
    return errors


def refuse_invalid(cfg: RefineryConfig) -> None:
    """Raise CurriculumMismatch naming each field when the curriculum's structure is invalid
    (weights or shares not summing to 1, repeated phase names, unknown buckets, ...): the checks of
    `validate` that need no inventory and that no manifest can make right."""
    if cfg.curriculum is None:
        raise CurriculumMismatch("curriculum: no curriculum declared; add a `curriculum:` section (see configs/demo.yaml)")
    errors = structure_findings(cfg)
    if errors:
        lines = "\n".join(f"  {e}" for e in errors)
        raise CurriculumMismatch(f"invalid curriculum; nothing was trained:\n{lines}")


def manifest_differences(cfg: RefineryConfig, manifests: dict[str, "PhaseManifest"]) -> list[str]:
    """What differs between the config's curriculum and `manifests` (the data root's phase manifests
    by phase name), one sentence per field; empty when the config is what they were built from.

    A config phase without a manifest was added (or renamed: a manifest of another name sits at its
    position); a manifest at another position means phases before it were added or removed. Extra
    manifests of phases the config does not name (another anneal variant's) are not differences."""
    assert cfg.curriculum is not None
    cur, schedule = cfg.curriculum, build_schedule(cfg)
    by_index = {m.index: name for name, m in manifests.items()}
    diffs: list[str] = []
    for i, (p, span) in enumerate(zip(cur.phases, schedule.phases)):
        where = f"curriculum.phases[{i}] ({p.name})"
        m = manifests.get(p.name)
        if m is None:
            other = by_index.get(i)
            renamed = f" or renamed from {other!r}, whose manifest sits at this position" if other else ""
            diffs.append(f"{where}: no manifest manifests/{p.name}.json: the phase was added{renamed}")
            continue
        if m.index != i:
            before = [by_index[j] for j in sorted(by_index) if j < m.index]
            diffs.append(f"{where}: its manifest was built for position {m.index} (after {before}): phases before it "
                         "were added, removed or reordered")
        if m.token_budget != span.tokens:
            field = "tokens" if p.tokens is not None else "share"
            diffs.append(f"{where}.{field}: the config gives {span.tokens:,} tokens, the manifest {m.token_budget:,}")
        for name in ("seq_len", "lr_scale", "interpolation"):
            if getattr(p, name) != getattr(m, name):
                diffs.append(f"{where}.{name}: the config says {getattr(p, name)}, the manifest {getattr(m, name)}")
        for b, w in zip(schedule.buckets, span.weights):
            built = m.weights.get(b, 0.0)
            if abs(float(w) - built) > WEIGHT_TOLERANCE:
                diffs.append(f"{where}.weights.{b}: the config gives {float(w):.6g} (after temperature), the manifest "
                             f"{built:.6g}")
        for b, bs in sorted(m.buckets.items()):
            max_epochs = cur.buckets[b].max_epochs if b in cur.buckets else 1.0
            if bs.max_epochs != max_epochs:
                diffs.append(f"curriculum.buckets.{b}.max_epochs: the config says {max_epochs:g}, manifest {p.name} "
                             f"{bs.max_epochs:g}")
        cut = any(bs.quality_cutoff is not None for bs in m.buckets.values())
        if (p.quality_top_fraction is not None) != cut:
            diffs.append(f"{where}.quality_top_fraction: the config says {p.quality_top_fraction}, the manifest "
                         f"{'has' if cut else 'has no'} quality cutoff")
    built = [manifests[p.name] for p in cur.phases if p.name in manifests]
    built_total = sum(m.token_budget for m in built)
    if len(built) == len(cur.phases) and built_total != schedule.total_tokens:
        diffs.append(f"curriculum.total_tokens: the config schedules {schedule.total_tokens:,} tokens, its phases' "
                     f"manifests {built_total:,}")
    return diffs


def stored_manifests(root: "DataRoot", needed: set[str]) -> dict[str, "PhaseManifest"]:
    """The phase manifests on the data root (manifests/<phase>.json) by phase name. Those of phases
    in `needed` must read; another one that does not (an old variant's) is left out."""
    from refinery.manifest import ManifestError, read_manifest

    names = [k[len("manifests/"):-len(".json")] for k in root.list("manifests")
             if k.endswith(".json") and "/" not in k[len("manifests/"):]]
    out = {}
    for name in sorted(names):
        try:
            out[name] = read_manifest(root, name)
        except ManifestError:
            if name in needed:
                raise
    return out


def refuse_mismatch(cfg: RefineryConfig, root: "DataRoot") -> None:
    """Before training: raise CurriculumMismatch when the curriculum is invalid or is not the one the
    data root's manifests were built from, naming every difference."""
    refuse_invalid(cfg)
    assert cfg.curriculum is not None
    manifests = stored_manifests(root, {p.name for p in cfg.curriculum.phases})
    if not manifests:
        raise CurriculumMismatch(f"{root.display('manifests')}: no phase manifests; materialize phase_manifests first")
    diffs = manifest_differences(cfg, manifests)
    if diffs:
        lines = "\n".join(f"  {d}" for d in diffs)
        raise CurriculumMismatch(
            f"the config's curriculum differs from the phase manifests on {root.display('manifests')}; nothing was "
            f"trained:\n{lines}\nrematerialize phase_manifests from this config, or train with the config they were "
            "built from"
        )
