"""The ablation report: every variant's bits per byte on the evaluation set, per domain and per
language, with the spread over seeds and a paired verdict against `funnel`.

Inputs are the stored results of the proxy runs (one JSON file per variant and seed,
`results_key`, written by training/proxy_run.py: every evaluation document's nats and bytes) and
each variant's counts (documents, tokens, share of the raw text's bytes kept, the mixture, each
evaluation domain's 13-gram overlap). Nothing here trains or imports Dagster: `refinery ablations`
and the `ablation_report` asset both print `format_report(build_report(...))`.

Per variant and domain (and per language, and "all"), each seed gives one bits-per-byte figure
(its bits summed over the documents / their bytes summed). The table shows their mean and their
spread: the sample standard deviation over seeds (ddof 1). The difference to `funnel` is the mean
over seeds of variant_s - funnel_s: negative is better (fewer bits per byte).

Only the documents in a language the config keeps are judged (`kept`, refinery/ablations/eval_set.py):
`all` and every domain row pool those; the rest are the domain row `not kept` and their language
rows, shown with no verdict (NOT_KEPT): a variant that keeps a language the funnel drops on purpose
would win there by construction.

The verdict is refinery/ablations/stats.py's `compare`: a paired t test on the per-seed differences
(seed s of the variant against seed s of funnel: the same initial weights and data-order seed) at
ALPHA = 0.05, with a bootstrap interval over the evaluation documents; `better` or `worse` when p <
ALPHA and the interval excludes zero, else `within noise`. `detectable` is the smallest difference
the run could have called; the Welch test's p and detectable difference on the same runs stand
beside it (`p_unpaired`, `detectable_unpaired`). No verdict with fewer than two seeds paired or a
seed missing on one side.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
import polars as pl

from refinery.ablations.stats import ALPHA, ONE_SEED, Comparison, DocumentScores, compare

BASELINE = "funnel"
RESULTS_PREFIX = "ablations/results"
REPORT_KEY = "ablations/report.json"
REPORT_PLOT_KEY = "ablations/report.png"
DOCUMENT_SCHEMA = {"doc_id": pl.String, "domain": pl.String, "language": pl.String, "kept": pl.Boolean,
                   "bytes": pl.Int64, "nats": pl.Float64}


def results_key(variant: str, seed: int) -> str:
    """Where the proxy run of `variant` with `seed` stores its results, under the main data root."""
    return f"{RESULTS_PREFIX}/{variant}/seed-{seed}.json"


# ---- the figures ------------------------------------------------------------------------------------

NOT_KEPT = "n/a: language not kept"
OTHER_LANGUAGES = "not kept"  # the domain row of the evaluation documents in languages the config drops


def run_scores(result: dict[str, Any], axis: str) -> dict[str, DocumentScores]:
    """One run's documents grouped by domain (`axis` "domain": the kept documents per domain, "all"
    of them, and OTHER_LANGUAGES for the rest) or by language ("language": every document, and
    "all" of the kept ones), each group in doc_id order."""
    docs = pl.DataFrame(result["documents"], schema=DOCUMENT_SCHEMA).sort("doc_id")
    kept = docs.filter(pl.col("kept"))
    groups: dict[str, pl.DataFrame] = {"all": kept}
    if axis == "domain":
        groups.update({d: part for (d,), part in kept.group_by(["domain"], maintain_order=True)})
        if kept.height < docs.height:
            groups[OTHER_LANGUAGES] = docs.filter(~pl.col("kept"))
    else:
        groups.update({lang: part for (lang,), part in docs.group_by(["language"], maintain_order=True)})
    return {g: DocumentScores(part["nats"].to_numpy(), part["bytes"].to_numpy().astype(np.float64))
            for g, part in groups.items() if part["bytes"].sum()}


def seed_scores(results: list[dict[str, Any]], axis: str) -> dict[str, dict[str, dict[int, DocumentScores]]]:
    """variant -> group (a domain or language, and "all") -> seed -> its documents' scores."""
    out: dict[str, dict[str, dict[int, DocumentScores]]] = {}
    for result in results:
        for group, scores in run_scores(result, axis).items():
            out.setdefault(result["variant"], {}).setdefault(group, {})[int(result["seed"])] = scores
    return out


def _same_documents(runs: list[DocumentScores]) -> bool:
    return all(np.array_equal(r.bytes, runs[0].bytes) for r in runs)


def _comparison(seeds: dict[int, DocumentScores], base: dict[int, DocumentScores]) -> Comparison:
    together = [*seeds.values(), *base.values()]
    documents = (seeds, base) if _same_documents(together) else None
    return compare({s: r.bpb for s, r in seeds.items()}, {s: r.bpb for s, r in base.items()}, documents)


def _rows(scores: dict[str, dict[str, dict[int, DocumentScores]]], order: list[str], axis: str,
          kept_languages: set[str], against: str = BASELINE) -> list[dict[str, Any]]:
    baseline = scores.get(against, {})
    rows = []
    for variant in order:
        groups = scores.get(variant, {})
        for group in sorted(groups, key=lambda g: (g != "all", g == OTHER_LANGUAGES, g)):
            seeds = groups[group]
            values = [seeds[s].bpb for s in sorted(seeds)]
            row: dict[str, Any] = {
                "variant": variant, axis: group, "seeds": len(values), "bpb": statistics.fmean(values),
                "spread": statistics.stdev(values) if len(values) > 1 else None,
                "bpb_by_seed": {str(s): seeds[s].bpb for s in sorted(seeds)},
                "diff": None, "p": None, "interval": None, "detectable": None, "p_unpaired": None,
                "detectable_unpaired": None,
            }
            judged = group != OTHER_LANGUAGES and (axis != "language" or group in kept_languages)
            base = baseline.get(group)
            if variant == against:
                row["verdict"] = "baseline"
            elif not judged:
                row["verdict"] = NOT_KEPT
            elif not base:
                row["verdict"] = f"n/a: no {against} run"
            else:
                c = _comparison(seeds, base)
                row.update(diff=c.diff, p=c.p, interval=list(c.interval) if c.interval else None,
                           detectable=c.detectable, p_unpaired=c.p_unpaired,
                           detectable_unpaired=c.detectable_unpaired, verdict=c.verdict)
            rows.append(row)
    return rows


def build_report(results: list[dict[str, Any]], variants: dict[str, dict[str, Any]],
                 baseline: str = BASELINE) -> dict[str, Any]:
    """The report of the stored results (one dict per run: variant, seed, documents) and the
    variants' counts (name -> its build summary: documents, tokens, raw_byte_share, budget_tokens,
    mixture, eval_overlap), variants in the order given, verdicts against `baseline` (the schedule
    variants' is `schedule.curriculum`, refinery/ablations/schedule_report.py)."""
    order = list(variants) + sorted({r["variant"] for r in results} - set(variants))
    kept = {lang for r in results for lang, k in zip(r["documents"]["language"], r["documents"]["kept"]) if k}
    return {
        "baseline": baseline, "alpha": ALPHA,
        "test": "paired t test over seeds, bootstrap interval over evaluation documents",
        "spread": "sample standard deviation over seeds",
        "variants": {name: {**variants.get(name, {}), "seeds": sorted(int(r["seed"]) for r in results
                                                                        if r["variant"] == name)} for name in order},
        "kept_languages": sorted(kept),
        "domains": _rows(seed_scores(results, "domain"), order, "domain", kept, baseline),
        "languages": _rows(seed_scores(results, "language"), order, "language", kept, baseline),
    }


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _call(row: dict[str, Any]) -> str:
    return row["verdict"] + (f" (p={row['p']:.3g})" if row["p"] is not None else "")


def _share(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "-"


def _interval(row: dict[str, Any]) -> str:
    return "-" if row["interval"] is None else f"[{row['interval'][0]:+.4f}, {row['interval'][1]:+.4f}]"


def _mixture(counts: dict[str, Any]) -> str:
    weights = counts.get("weights") or {}
    return " ".join(f"{b} {w:.1%}" for b, w in weights.items()) or "-"


def _overlap(counts: dict[str, Any]) -> str:
    overlap = counts.get("eval_overlap")
    return "-" if overlap is None else " ".join(f"{d} {n}" for d, n in overlap.items()) or "none"


def format_report(report: dict[str, Any]) -> str:
    """The table `refinery ablations` prints: the variants' counts, variant x domain, then variant x
    language."""
    variants = report["variants"]
    lines = [f"Bits per byte on the evaluation set (lower is better). Spread: {report['spread']}. Verdict against "
             f"{report['baseline']}: {report['test']} at alpha {report['alpha']}; `detectable` is the smallest "
             f"difference the run could have called, `unpaired` the Welch test's p and detectable difference on "
             f"the same runs.",
             f"Judged on the evaluation documents in the languages the config keeps ({', '.join(report['kept_languages'])})"
             f"; the rest are shown apart (`{OTHER_LANGUAGES}`, {NOT_KEPT})."]
    budgets = sorted({c["budget_tokens"] for c in variants.values() if c.get("budget_tokens") is not None})
    if budgets:
        lines.append(f"Every proxy run trains {' / '.join(f'{b:,}' for b in budgets)} tokens, mixed as `mixture` "
                     f"says; `tokens` and `documents` are what each variant's selection holds, `raw kept` its share "
                     f"of the raw text's bytes, `overlap removed` its documents that shared a 13-gram with each "
                     f"evaluation domain (none of them trains).")
    lines += ["", f"{'variant':<20} {'tokens':>12} {'documents':>10} {'raw kept':>8}  {'mixture':<32} overlap removed"]
    for name, counts in variants.items():
        lines.append(f"{name:<20} {_num(counts.get('tokens'), ','):>12} {_num(counts.get('documents'), ','):>10} "
                     f"{_share(counts.get('raw_byte_share')):>8}  {_mixture(counts):<32} {_overlap(counts)}")
    lines += ["", f"{'variant':<20} {'domain':<14} {'bpb':>7} {'spread':>7} {'seeds':>5} {'vs ' + report['baseline'].rsplit('.', 1)[-1]:>9} "
                  f"{'95% interval':>19} {'detectable':>10}  {'verdict':<34} {'unpaired':>17}"]
    for row in report["domains"]:
        unpaired = ("-" if row["p_unpaired"] is None else
                    f"p={row['p_unpaired']:.3g} {_num(row['detectable_unpaired'], '.4f')}")
        lines.append(f"{row['variant'] if row['domain'] == 'all' else '':<20} {row['domain']:<14} {row['bpb']:>7.4f} "
                     f"{_num(row['spread'], '.4f'):>7} {row['seeds']:>5} {_num(row['diff'], '+.4f'):>9} "
                     f"{_interval(row):>19} {_num(row['detectable'], '.4f'):>10}  {_call(row):<34} {unpaired:>17}")
    lines += ["", f"{'variant':<20} {'language':<14} {'bpb':>7} {'spread':>7} {'seeds':>5} {'vs ' + report['baseline'].rsplit('.', 1)[-1]:>9} "
                  f"{'95% interval':>19}  verdict"]
    for row in report["languages"]:
        if row["language"] == "all":
            continue
        lines.append(f"{row['variant']:<20} {row['language']:<14} {row['bpb']:>7.4f} {_num(row['spread'], '.4f'):>7} "
                     f"{row['seeds']:>5} {_num(row['diff'], '+.4f'):>9} {_interval(row):>19}  {_call(row)}")
    return "\n".join(line.rstrip() for line in lines)


def markdown_table(report: dict[str, Any], domains: set[str] | None = None) -> str:
    """The variant x domain table as markdown (the asset page), of `domains` only when given."""
    lines = ["| variant | domain | bpb | spread | seeds | vs funnel | 95% interval | detectable | verdict |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in report["domains"]:
        if domains is not None and row["domain"] not in domains:
            continue
        lines.append(f"| {row['variant']} | {row['domain']} | {row['bpb']:.4f} | {_num(row['spread'], '.4f')} | "
                     f"{row['seeds']} | {_num(row['diff'], '+.4f')} | {_interval(row)} | "
                     f"{_num(row['detectable'], '.4f')} | {_call(row)} |")
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
