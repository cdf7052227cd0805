"""The schedule variants' and anneal branches' report: refinery/ablations/report.py's table (bits
per byte per domain and language, mean and spread over seeds, the paired verdict with its
interval) against `schedule.curriculum` instead of `funnel`, and what each run costs.

Each run's counts are its table's: the tokens it trains (every run the data variants' budget), its
token-weighted mixture over the whole run (blend windows included), and its compute in token-FLOPs:
per token 6N for the weights (N = 12 n_layer n_embd^2, the non-embedding parameters) plus
6 n_layer L n_embd for attention at the phase's seq_len L (Kaplan et al. 2020, C = 6N + 6 n_layer
n_ctx d), summed over the phases' tokens; so length warmup's saving shows, and an anneal branch's
own cost is its last phase's share of the run (`share_of_run`).
"""

from __future__ import annotations

from typing import Any

from refinery.ablations.report import build_report, format_report, results_key
from refinery.ablations.schedule_runs import funnel_root
from refinery.ablations.schedules import (ANNEAL, CURRICULUM, SCHEDULE, ScheduleError, phases_of, read_definition,
                                          run_name, schedule_of)
from refinery.config import RefineryConfig
from refinery.storage import DataRoot

SCHEDULE_BASELINE = run_name(SCHEDULE, CURRICULUM)


def run_names(cfg: RefineryConfig) -> list[tuple[str, str]]:
    """(kind, name) of every schedule run the config declares, schedules first."""
    ab = cfg.ablations
    assert ab is not None
    mixtures = list(ab.anneal_search.mixtures) if ab.anneal_search is not None else []
    return [(SCHEDULE, n) for n in ab.schedules] + [(ANNEAL, m) for m in mixtures]


def token_flops(curriculum: dict[str, Any], n_layer: int, n_embd: int) -> float:
    """Training FLOPs of a written curriculum section at the proxy's shape (module docstring)."""
    weights = 6 * 12 * n_layer * n_embd**2
    return float(sum(p["tokens"] * (weights + 6 * n_layer * p["seq_len"] * n_embd) for p in curriculum["phases"]))


def run_counts(cfg: RefineryConfig, curriculum: dict[str, Any], kind: str) -> dict[str, Any]:
    assert cfg.ablations is not None
    phases = phases_of(curriculum)
    planned = schedule_of(cfg, phases).bucket_tokens()
    total = curriculum["total_tokens"]
    model = cfg.ablations.model
    counts = {"tokens": total, "budget_tokens": total, "weights": {b: t / total for b, t in planned.items() if t},
              "phases": len(phases), "mean_seq_len": sum(p.tokens * p.seq_len for p in phases) / total,
              "token_flops": token_flops(curriculum, model.n_layer, model.n_embd)}
    if kind == ANNEAL:
        counts["share_of_run"] = phases[-1].tokens / total
    return counts


def schedule_report(root: DataRoot, cfg: RefineryConfig) -> dict[str, Any] | None:
    """The report of every stored schedule run (None when none has finished)."""
    assert cfg.ablations is not None
    froot, counts, results = funnel_root(root), {}, []
    for kind, name in run_names(cfg):
        try:
            curriculum = read_definition(froot, kind, name)
        except ScheduleError:
            continue  # not prepared yet
        counts[run_name(kind, name)] = run_counts(cfg, curriculum, kind)
        results += [root.read_json(key) for key in (results_key(run_name(kind, name), s)
                                                    for s in range(cfg.ablations.seeds)) if root.exists(key)]
    return build_report(results, counts, baseline=SCHEDULE_BASELINE) if results else None


def format_schedule_report(report: dict[str, Any]) -> str:
    """`format_report`'s tables, then each run's phases, mean seq_len and compute."""
    lines = [format_report(report), "", f"{'run':<28} {'phases':>6} {'mean seq_len':>12} {'token-FLOPs':>12} "
                                        f"{'vs curriculum':>13} {'share of run':>12}"]
    variants = report["variants"]
    base = variants.get(SCHEDULE_BASELINE, {}).get("token_flops")
    for name, c in variants.items():
        if "token_flops" not in c:
            continue
        ratio = f"{c['token_flops'] / base:.3f}x" if base else "-"
        share = f"{c['share_of_run']:.1%}" if "share_of_run" in c else "-"
        lines.append(f"{name:<28} {c['phases']:>6} {c['mean_seq_len']:>12.1f} {c['token_flops']:>12.3e} {ratio:>13} "
                     f"{share:>12}")
    return "\n".join(lines)
