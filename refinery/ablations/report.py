"""The ablation report: every variant's bits per byte on the evaluation set, per domain and per
language, with the spread over seeds and a verdict against `funnel` computed from the seeds.

Inputs are the stored results of the proxy runs (one JSON file per variant and seed,
`results_key`, written by training/proxy_run.py) and each variant's counts (documents, tokens,
share of the raw text's bytes kept). Nothing here trains or imports Dagster: `refinery ablations`
and the `ablation_report` asset both print `format_report(build_report(...))`.

Per variant and domain (and per language, and "all" for the whole evaluation set), each seed gives
one bits-per-byte figure (its bits summed over the documents / their bytes summed). The table shows
their mean and their spread: the sample standard deviation over seeds (ddof 1). The difference to
`funnel` is mean(variant) - mean(funnel): negative is better (fewer bits per byte).

The verdict is a two-sided Welch t-test of the variant's seeds against funnel's at ALPHA = 0.05:
`better` or `worse` when p < ALPHA (by the sign of the difference), else `within noise`. It needs at
least two seeds on both sides; with fewer the verdict is "n/a: one seed", never a call from one run.
When neither side varies over its seeds (zero spread on both) the difference is decisive if it is
not zero. Seeds of one variant share the data and differ in model init and data order, so the
test asks whether the data's effect stands out of that noise; at three seeds only a large effect
does (docs/ablations.md says what the table supports).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from refinery.ablations.bpb import cells_from_json, totals_by

BASELINE = "funnel"
ALPHA = 0.05
RESULTS_PREFIX = "ablations/results"
REPORT_KEY = "ablations/report.json"
REPORT_PLOT_KEY = "ablations/report.png"
ONE_SEED = "n/a: one seed"


def results_key(variant: str, seed: int) -> str:
    """Where the proxy run of `variant` with `seed` stores its results, under the main data root."""
    return f"{RESULTS_PREFIX}/{variant}/seed-{seed}.json"


# ---- the test ---------------------------------------------------------------------------------------


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


def welch(a: list[float], b: list[float]) -> tuple[float, float | None]:
    """(mean(a) - mean(b), the two-sided Welch p-value); p None with fewer than two values on a side."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return diff, None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se2 = va + vb
    if se2 == 0.0:
        return diff, 1.0 if diff == 0.0 else 0.0
    df = se2 * se2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    return diff, t_two_sided_p(diff / math.sqrt(se2), df)


def verdict(variant: list[float], baseline: list[float], alpha: float = ALPHA) -> tuple[float, float | None, str]:
    """(difference of the means, p, verdict) of a variant's per-seed bits per byte against the
    baseline's: lower is better."""
    diff, p = welch(variant, baseline)
    if p is None:
        return diff, None, ONE_SEED
    if p >= alpha:
        return diff, p, "within noise"
    return diff, p, "better" if diff < 0 else "worse"


# ---- the report -------------------------------------------------------------------------------------


def seed_figures(results: list[dict[str, Any]], axis: str) -> dict[str, dict[str, dict[int, float]]]:
    """variant -> group (a domain or language, and "all") -> seed -> bits per byte."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for result in results:
        cells = cells_from_json(result["cells"])
        groups = {**totals_by(cells, axis), **totals_by(cells, "all")}
        for group, tally in groups.items():
            if tally.bpb is not None:
                out.setdefault(result["variant"], {}).setdefault(group, {})[int(result["seed"])] = tally.bpb
    return out


def _rows(figures: dict[str, dict[str, dict[int, float]]], order: list[str], axis: str) -> list[dict[str, Any]]:
    baseline = figures.get(BASELINE, {})
    rows = []
    for variant in order:
        groups = figures.get(variant, {})
        for group in sorted(groups, key=lambda g: (g != "all", g)):
            seeds = groups[group]
            values = [seeds[s] for s in sorted(seeds)]
            row: dict[str, Any] = {
                "variant": variant, axis: group, "seeds": len(values), "bpb": statistics.fmean(values),
                "spread": statistics.stdev(values) if len(values) > 1 else None,
                "bpb_by_seed": {str(s): seeds[s] for s in sorted(seeds)},
            }
            base = baseline.get(group)
            if variant == BASELINE:
                row.update(diff=None, p=None, verdict="baseline")
            elif not base:
                row.update(diff=None, p=None, verdict=f"n/a: no {BASELINE} run")
            else:
                diff, p, call = verdict(values, [base[s] for s in sorted(base)])
                row.update(diff=diff, p=p, verdict=call)
            rows.append(row)
    return rows


def build_report(results: list[dict[str, Any]], variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report of the stored results (one dict per run: variant, seed, cells) and the variants'
    counts (name -> its build summary: documents, tokens, raw_byte_share, budget_tokens), variants in the
    order given."""
    order = list(variants) + sorted({r["variant"] for r in results} - set(variants))
    return {
        "baseline": BASELINE, "alpha": ALPHA,
        "test": "two-sided Welch t-test over seeds", "spread": "sample standard deviation over seeds",
        "variants": {name: {**variants.get(name, {}), "seeds": sorted(int(r["seed"]) for r in results
                                                                        if r["variant"] == name)} for name in order},
        "domains": _rows(seed_figures(results, "domain"), order, "domain"),
        "languages": _rows(seed_figures(results, "language"), order, "language"),
    }


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _call(row: dict[str, Any]) -> str:
    return row["verdict"] + (f" (p={row['p']:.3g})" if row["p"] is not None else "")


def _share(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "-"


def format_report(report: dict[str, Any]) -> str:
    """The table `refinery ablations` prints: variant x domain, then variant x language."""
    variants = report["variants"]
    head = (f"{'variant':<20} {'domain':<14} {'bpb':>7} {'spread':>7} {'seeds':>5} {'vs funnel':>9}  "
            f"{'verdict':<26} {'tokens':>12} {'documents':>10} {'raw kept':>8}")
    lines = [f"Bits per byte on the evaluation set (lower is better). Spread: {report['spread']}. Verdict against "
             f"{report['baseline']}: {report['test']} at alpha {report['alpha']}."]
    budgets = sorted({c["budget_tokens"] for c in variants.values() if c.get("budget_tokens") is not None})
    if budgets:
        lines.append(f"Every proxy run trains {' / '.join(f'{b:,}' for b in budgets)} tokens; `tokens` and "
                     f"`documents` are what each variant holds, `raw kept` its share of the raw text's bytes.")
    lines += ["", head]
    for row in report["domains"]:
        counts = variants.get(row["variant"], {})
        first = row["domain"] == "all"
        lines.append(f"{row['variant'] if first else '':<20} {row['domain']:<14} {row['bpb']:>7.4f} "
                     f"{_num(row['spread'], '.4f'):>7} {row['seeds']:>5} {_num(row['diff'], '+.4f'):>9}  "
                     f"{_call(row):<26} "
                     + (f"{_num(counts.get('tokens'), ','):>12} {_num(counts.get('documents'), ','):>10} "
                        f"{_share(counts.get('raw_byte_share')):>8}" if first else ""))
    lines += ["", f"{'variant':<20} {'language':<14} {'bpb':>7} {'spread':>7} {'seeds':>5} {'vs funnel':>9}  verdict"]
    for row in report["languages"]:
        if row["language"] == "all":
            continue
        lines.append(f"{row['variant']:<20} {row['language']:<14} {row['bpb']:>7.4f} {_num(row['spread'], '.4f'):>7} "
                     f"{row['seeds']:>5} {_num(row['diff'], '+.4f'):>9}  {_call(row)}")
    return "\n".join(line.rstrip() for line in lines)


def markdown_table(report: dict[str, Any], domains: set[str] | None = None) -> str:
    """The variant x domain table as markdown (the asset page), of `domains` only when given."""
    variants = report["variants"]
    lines = ["| variant | domain | bpb | spread | seeds | vs funnel | verdict | tokens | documents | raw kept |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for row in report["domains"]:
        if domains is not None and row["domain"] not in domains:
            continue
        counts = variants.get(row["variant"], {})
        lines.append(f"| {row['variant']} | {row['domain']} | {row['bpb']:.4f} | {_num(row['spread'], '.4f')} | "
                     f"{row['seeds']} | {_num(row['diff'], '+.4f')} | {_call(row)} | {_num(counts.get('tokens'), ',')} | "
                     f"{_num(counts.get('documents'), ',')} | {_share(counts.get('raw_byte_share'))} |")
    return "\n".join(lines)


def report_png(report: dict[str, Any]) -> bytes:
    """Two panels, as PNG bytes: bits per byte per domain, one bar per variant (the mean over seeds,
    the spread as an error bar, each seed as a dot); below, each variant's difference to funnel per
    domain, labelled with its verdict."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["domains"]
    variants = list(report["variants"])
    domains = sorted({r["domain"] for r in rows}, key=lambda g: (g != "all", g))
    width = 0.8 / max(1, len(variants))
    fig, (ax, diff_ax) = plt.subplots(2, 1, figsize=(max(7.0, 0.5 * len(domains) * max(1, len(variants)) + 2), 7.5),
                                      height_ratios=[3, 2], sharex=True)
    for v, name in enumerate(variants):
        for d, domain in enumerate(domains):
            row = next((r for r in rows if r["variant"] == name and r["domain"] == domain), None)
            if row is None:
                continue
            x = d + (v - (len(variants) - 1) / 2) * width
            ax.bar(x, row["bpb"], width, color=f"C{v}", label=name if d == 0 else None,
                   yerr=row["spread"] or 0.0, capsize=2)
            ax.plot([x] * len(row["bpb_by_seed"]), list(row["bpb_by_seed"].values()), "k.", markersize=3)
            if row["diff"] is not None:
                diff_ax.bar(x, row["diff"], width, color=f"C{v}")
                diff_ax.annotate(row["verdict"].replace("within noise", "noise").replace(ONE_SEED, "1 seed"),
                                 (x, row["diff"]), ha="center", va="bottom" if row["diff"] >= 0 else "top",
                                 fontsize=6, rotation=90)
    values = [r["bpb"] for r in rows]
    if values:
        spread = max(values) - min(values)
        ax.set_ylim(max(0.0, min(values) - max(spread, 0.05 * min(values))), max(values) + max(spread, 0.02) * 0.5)
    diff_ax.axhline(0.0, color="black", linewidth=0.8)
    diff_ax.margins(y=0.35)  # room for the verdicts
    diff_ax.set_xticks(range(len(domains)), domains)
    ax.set_ylabel("bits per byte (lower is better)")
    diff_ax.set_ylabel(f"minus {BASELINE} (< 0: better)")
    ax.set_title("proxy models per variant: mean over seeds, spread as error bar, seeds as dots", fontsize=9)
    ax.legend(fontsize=8, ncol=min(len(variants), 3))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def load_stored(root, variants: list[str], seeds: int) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The stored results of every run of `variants` x range(`seeds`) that has finished, and each
    variant's counts (its summary.json; {} before the variant is built)."""
    from refinery.ablations.build import SUMMARY_KEY, variant_root_key

    results = [root.read_json(results_key(v, s)) for v in variants for s in range(seeds) if root.exists(results_key(v, s))]
    summaries = {v: f"{variant_root_key(v)}/{SUMMARY_KEY}" for v in variants}
    return results, {v: root.read_json(key) if root.exists(key) else {} for v, key in summaries.items()}
