"""The statistics behind an ablation verdict: a paired test over seeds, a bootstrap over evaluation
documents, and the smallest difference a run could have detected.

Runs that share a seed share the model's initial weights and the data order's seed (training/
proxy_run.py), so the seed's own luck is common to both sides of a pair: the difference of a pair
cancels it, and the test is on the per-seed differences d_s = variant_s - baseline_s (a paired t
test, n - 1 degrees of freedom). The Welch test of the two sides as independent samples is kept
beside it (`welch`): on the same runs, the ratio of the two tests' smallest detectable differences
is what pairing buys.

The evaluation documents are a sample too: a variant can win on these pages and lose on others. The
interval resamples the documents (the same resample for every run of both sides, so the pairing
holds) and recomputes the mean paired difference, each run's bits per byte being its bits over its
bytes of the resampled documents; its 2.5% and 97.5% points are the interval.

The smallest detectable difference is the larger of the paired test's threshold (t at alpha with
n - 1 degrees of freedom, times the standard error of the mean difference: a difference of that size
is exactly significant) and half the bootstrap interval's width: a verdict needs both the seeds and
the documents to clear zero.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
RESAMPLES = 2000  # bootstrap resamples of the evaluation documents
BOOTSTRAP_SEED = 0  # the resamples are drawn with this seed: the same runs give the same interval
ONE_SEED = "n/a: one seed"
LN2 = math.log(2.0)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for aa in (m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom (any df > 0)."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_critical(alpha: float, df: float) -> float:
    """The t with P(|T| >= t) = alpha at `df` degrees of freedom (bisection on `t_two_sided_p`)."""
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > alpha:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > alpha else (lo, mid)
    return hi


@dataclass(frozen=True)
class TestResult:
    """A difference of means, its two-sided p (None with too few values) and the smallest
    difference that test would have called at alpha on these values' spread (None likewise)."""

    diff: float
    p: float | None
    detectable: float | None


def welch(a: list[float], b: list[float], alpha: float = ALPHA) -> TestResult:
    """mean(a) - mean(b) by the two-sided Welch test of two independent samples."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return TestResult(diff, None, None)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se2 = va + vb
    if se2 == 0.0:
        return TestResult(diff, 1.0 if diff == 0.0 else 0.0, 0.0)
    df = se2 * se2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    return TestResult(diff, t_two_sided_p(diff / math.sqrt(se2), df), t_critical(alpha, df) * math.sqrt(se2))


def paired_t(differences: list[float], alpha: float = ALPHA) -> TestResult:
    """The mean of per-seed differences by the two-sided paired t test (n - 1 degrees of freedom)."""
    diff = statistics.fmean(differences)
    n = len(differences)
    if n < 2:
        return TestResult(diff, None, None)
    se = statistics.stdev(differences) / math.sqrt(n)
    if se == 0.0:
        return TestResult(diff, 1.0 if diff == 0.0 else 0.0, 0.0)
    return TestResult(diff, t_two_sided_p(diff / se, n - 1), t_critical(alpha, n - 1) * se)


@dataclass(frozen=True)
class DocumentScores:
    """One run's scores of a group of evaluation documents, in one document order shared by every
    run compared with it: nats and UTF-8 bytes per document."""

    nats: np.ndarray
    bytes: np.ndarray

    @property
    def bpb(self) -> float:
        return float(self.nats.sum() / LN2 / self.bytes.sum())


def bootstrap_interval(variant: list[DocumentScores], baseline: list[DocumentScores], alpha: float = ALPHA,
                       resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """The (alpha/2, 1 - alpha/2) interval of the mean paired difference in bits per byte when the
    evaluation documents are resampled with replacement; variant[i] and baseline[i] are one seed's
    pair, every run over the same documents in the same order. Memory: resamples x documents counts."""
    n = len(variant[0].bytes)
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)
    diffs = np.zeros(resamples)
    for v, b in zip(variant, baseline):
        diffs += (counts @ v.nats) / LN2 / (counts @ v.bytes) - (counts @ b.nats) / LN2 / (counts @ b.bytes)
    diffs /= len(variant)
    lo, hi = np.quantile(diffs, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Comparison:
    """A variant against the baseline on one group of evaluation documents."""

    diff: float | None  # mean over the paired seeds of variant - baseline, bits per byte (< 0: better)
    p: float | None  # the paired t test's
    interval: tuple[float, float] | None  # the bootstrap over documents, of `diff`
    detectable: float | None  # the smallest |diff| the run could have called (module docstring)
    p_unpaired: float | None  # the Welch test's, on the same runs
    detectable_unpaired: float | None
    seeds: tuple[int, ...]  # the seeds paired
    verdict: str


def compare(variant: dict[int, float], baseline: dict[int, float],
            documents: tuple[dict[int, DocumentScores], dict[int, DocumentScores]] | None = None,
            alpha: float = ALPHA) -> Comparison:
    """A variant's per-seed bits per byte against the baseline's (seed -> figure), and where given
    each run's per-document scores (the same keys) for the interval. No verdict unless every seed
    is on both sides and at least two are: a seed missing on one side leaves its pair's luck
    unmatched, and one pair has no spread to test against."""
    unpaired = sorted(set(variant) ^ set(baseline))
    seeds = tuple(sorted(set(variant) & set(baseline)))
    welch_test = welch([variant[s] for s in sorted(variant)], [baseline[s] for s in sorted(baseline)], alpha)
    if unpaired or len(seeds) < 2:
        call = f"n/a: seeds {unpaired} missing on one side" if unpaired else ONE_SEED
        diff = statistics.fmean(variant[s] - baseline[s] for s in seeds) if seeds else None
        return Comparison(diff, None, None, None, welch_test.p, welch_test.detectable, seeds, call)
    paired = paired_t([variant[s] - baseline[s] for s in seeds], alpha)
    interval = None
    detectable = paired.detectable
    if documents is not None:
        interval = bootstrap_interval([documents[0][s] for s in seeds], [documents[1][s] for s in seeds], alpha)
        detectable = max(detectable or 0.0, (interval[1] - interval[0]) / 2.0)
    clear = interval is None or interval[0] > 0.0 or interval[1] < 0.0
    call = ("better" if paired.diff < 0 else "worse") if paired.p is not None and paired.p < alpha and clear \
        else "within noise"
    return Comparison(paired.diff, paired.p, interval, detectable, welch_test.p, welch_test.detectable, seeds, call)
