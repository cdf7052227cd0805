"""`refinery ablations`: the ablation report from the stored proxy-run results.

It reads what the `ablation_variants` and `ablation_runs` assets stored under the data root (each
variant's counts, one results file per variant and seed) and prints `refinery/ablations/report.py`'s
table: variant x domain bits per byte, mean and spread over seeds, tokens, documents, share of the
raw text kept, and the difference to `funnel` with its verdict; then the same per language. It
trains nothing and imports no Dagster.
"""

from __future__ import annotations

import argparse
import json
import sys

from refinery.preflight import READ_ONLY


def run(args: argparse.Namespace) -> int:
    from refinery.ablations.report import build_report, format_report, load_stored
    from refinery.config import load_config
    from refinery.storage import open_data_root

    cfg = getattr(args, "loaded_config", None) or load_config(args.config)
    if cfg.ablations is None:
        print(f"refinery ablations: {args.config} has no `ablations` section; declare the variants to compare "
              f"there (docs/ablations.md)", file=sys.stderr)
        return 2
    root = open_data_root(cfg.resolve(cfg.data_root))
    variants = list(cfg.ablations.variants)
    results, counts = load_stored(root, variants, cfg.ablations.seeds)
    if not results:
        print(f"refinery ablations: no proxy run has finished under {root.display('ablations/results')}; "
              f"materialize ablation_runs on this config first (`make ui CONFIG={args.config}`, the ablations group)",
              file=sys.stderr)
        return 1
    report = build_report(results, counts)
    schedules = None
    if cfg.ablations.schedules:  # the schedule variants' table, against schedule.curriculum
        from refinery.ablations.schedule_report import format_schedule_report, schedule_report

        schedules = schedule_report(root, cfg)
    if args.json:
        print(json.dumps({**report, **({"schedules": schedules} if schedules else {})}, indent=2, sort_keys=True))
    else:
        print(format_report(report))
        if schedules:
            print(f"\n== Schedule variants and anneal mixtures, on the funnel variant's data\n\n"
                  f"{format_schedule_report(schedules)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ablations",
        help="bits per byte of proxy models trained on each ablation variant, with verdicts against the funnel",
        description="The ablation report: for every variant of the config's `ablations` section, the bits per byte "
                    "of its proxy models on the held-out evaluation set, per domain and per language (mean and spread "
                    "over seeds), the tokens and documents it trained on and the share of the raw text it keeps, and "
                    "the difference to `funnel` with a verdict from the seeds (better, worse or within noise: a "
                    "two-sided Welch t-test at 0.05; none from one seed). It reads the results the ablation_runs "
                    "asset stored; materialize the ablations group first.",
        epilog="examples:\n  refinery ablations --config configs/ablations.yaml\n"
               "  refinery ablations --config configs/ablations.yaml --json",
    )
    p.add_argument("--config", required=True, help="the run's YAML config, with an `ablations` section")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run, needs=READ_ONLY)
