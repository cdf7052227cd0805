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

from refinery.config import CurriculumConfig, RefineryConfig

if TYPE_CHECKING:
    from refinery.manifest import ShardRef
    from refinery.storage import DataRoot

# Weights and shares are typed by people; a sum within this of 1 is 1.
SUM_TOLERANCE = 1e-6
FINAL_SHARDS_PREFIX = "shards/final"


class CurriculumError(ValueError):
    """A curriculum whose schedule cannot be computed. The message names the field and the fix."""


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


def batch_tokens(cfg: RefineryConfig, seq_len: int) -> int:
    """Tokens one optimizer step consumes on one rank at `seq_len`."""
    return cfg.training.micro_batch_size * cfg.training.grad_accum_steps * seq_len


def warmup_tokens(cfg: RefineryConfig, schedule: Schedule) -> int:
    """training.warmup_steps in tokens, counted at the first phase's batch size."""
    return cfg.training.warmup_steps * batch_tokens(cfg, schedule.phases[0].seq_len)


# --------------------------------------------------------------------------------------------------
# Inventory: what the final shards hold
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketInventory:
    """A bucket's final shards in order, with per-entry token counts (global entry ids index them)."""

    bucket: str
    shards: list["ShardRef"]
    entry_tokens: np.ndarray  # int64, one per entry, in global entry order

    @property
    def tokens(self) -> int:
        return int(self.entry_tokens.sum())

    @property
    def entries(self) -> int:
        return len(self.entry_tokens)


def final_shard_prefixes(root: "DataRoot", bucket: str) -> list[str]:
    """The bucket's final shard prefixes in shard order (names are zero-padded, so sorted = order)."""
    return [k[: -len(".idx")] for k in root.list(f"{FINAL_SHARDS_PREFIX}/{bucket}") if k.endswith(".idx")]


def read_inventory(root: "DataRoot", buckets: list[str] | tuple[str, ...]) -> dict[str, BucketInventory]:
    """Each bucket's final shards with token counts and content hashes. A bucket without final
    shards has an empty inventory (0 tokens), which validation reports for any bucket it weights."""
    from refinery.manifest import ShardRef
    from refinery.shard_format import SHARD_SUFFIXES, read_index

    out = {}
    for bucket in buckets:
        refs, lengths = [], []
        for prefix in final_shard_prefixes(root, bucket):
            index = read_index(root.local_path(prefix + ".idx"))
            lengths.append(np.diff(index.offsets))
            refs.append(
                ShardRef(
                    prefix=prefix,
                    tokens=index.num_tokens,
                    entries=index.num_entries,
                    sha256={s: root.sha256(prefix + s) for s in SHARD_SUFFIXES},
                )
            )
        tokens = np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, dtype=np.int64)
        out[bucket] = BucketInventory(bucket=bucket, shards=refs, entry_tokens=tokens)
    return out


def has_final_shards(root: "DataRoot", buckets: list[str] | tuple[str, ...]) -> bool:
    return any(final_shard_prefixes(root, b) for b in buckets)


def entry_doc_ids(root: "DataRoot", inventory: BucketInventory) -> list[str]:
    ids: list[str] = []
    for ref in inventory.shards:
        ids.extend(root.read_parquet(ref.prefix + ".entries.parquet", columns=["doc_id"])["doc_id"].to_list())
    if len(ids) != inventory.entries:
        raise CurriculumError(
            f"{FINAL_SHARDS_PREFIX}/{inventory.bucket}: the entry sidecars list {len(ids)} entries but the indexes "
            f"{inventory.entries}; re-materialize shuffled_shards[{inventory.bucket}]"
        )
    return ids


@dataclass(frozen=True)
class QualitySelection:
    """The entries of a bucket a phase keeps under its quality cutoff."""

    entry_ids: np.ndarray  # sorted int64 global entry ids
    cutoff: float  # the lowest kept document score
    tokens: int


def select_top_quality(
    doc_ids: list[str], entry_tokens: np.ndarray, scores: dict[str, float | None], top_fraction: float
) -> QualitySelection:
    """Keep the documents whose quality_score is at or above the score of the document ranked at
    ceil(top_fraction x documents), best first; every window of a kept document is kept. Ties at
    the cutoff are all kept. A document without a score (empty text) is never kept."""
    unique = sorted(set(doc_ids))
    missing = [d for d in unique if d not in scores]
    if missing:
        raise CurriculumError(
            f"quality cutoff: {len(missing)} documents in the final shards have no quality_score row "
            f"(first: {missing[0]}); re-materialize quality_scored and pii_redacted for their shards"
        )
    scored = np.array([s for d in unique if (s := scores[d]) is not None], dtype=np.float64)
    if scored.size == 0:
        return QualitySelection(entry_ids=np.zeros(0, dtype=np.int64), cutoff=math.inf, tokens=0)
    keep_docs = max(1, math.ceil(top_fraction * len(unique)))
    ranked = np.sort(scored)[::-1]
    cutoff = float(ranked[min(keep_docs, ranked.size) - 1])
    doc_scores = np.array([np.nan if scores[d] is None else scores[d] for d in doc_ids], dtype=np.float64)
    kept = np.flatnonzero(doc_scores >= cutoff).astype(np.int64)
    return QualitySelection(entry_ids=kept, cutoff=cutoff, tokens=int(entry_tokens[kept].sum()))


def quality_scores(cfg: RefineryConfig, root: "DataRoot", bucket: str) -> dict[str, float | None]:
    """doc_id -> quality_score of the bucket's clean documents (documents/pii_redacted)."""
    from refinery.documents import CLEAN_STAGE, documents_key, input_shards

    scores: dict[str, float | None] = {}
    for shard in input_shards(cfg):
        if shard.bucket != bucket:
            continue
        key = documents_key(CLEAN_STAGE, shard.key)
        if not root.exists(key):
            raise CurriculumError(
                f"{root.display(key)}: missing; a phase's quality cutoff needs every clean table, "
                f"materialize {CLEAN_STAGE}[{shard.key}] first"
            )
        df = root.read_parquet(key)
        if "quality_score" not in df.columns:
            raise CurriculumError(
                f"{root.display(key)}: no quality_score column; the quality cutoff needs quality_scored upstream"
            )
        scores.update(zip(df["doc_id"].to_list(), df["quality_score"].to_list()))
    return scores


def phase_selections(
    cfg: RefineryConfig, root: "DataRoot", inventory: dict[str, BucketInventory]
) -> dict[str, dict[str, QualitySelection]]:
    """For each phase with a quality cutoff: each bucket's kept entries."""
    out: dict[str, dict[str, QualitySelection]] = {}
    cut_phases = [p for p in cfg.curriculum.phases if p.quality_top_fraction is not None]  # type: ignore[union-attr]
    if not cut_phases:
        return out
    per_bucket = {}
    for bucket, inv in inventory.items():
        if inv.entries:
            per_bucket[bucket] = (entry_doc_ids(root, inv), quality_scores(cfg, root, bucket))
    for p in cut_phases:
        out[p.name] = {
            b: select_top_quality(ids, inventory[b].entry_tokens, scores, p.quality_top_fraction)  # type: ignore[arg-type]
            for b, (ids, scores) in per_bucket.items()
        }
    return out


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
            errors.append(Finding(where, f"phase {p.name!r} gives {'both' if p.share else 'neither'} `share` and `tokens`; give exactly one"))
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
    selections = phase_selections(cfg, root, inventory)
    report = validate(
        cfg,
        {b: inv.tokens for b, inv in inventory.items()},
        {ph: {b: s.tokens for b, s in sel.items()} for ph, sel in selections.items()},
    )
    return report, inventory, selections
