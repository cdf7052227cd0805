"""`refinery scan --config CONFIG --phase NAME [--json]`: the contamination scan of one phase's
manifest, from the command line, and the documents the drop policy has removed from the phase. It
only reads: the drop policy is applied by the `contamination_scan` asset, which records what it
removed in the phase's exclusions file. The report is the asset's: the reduction of the partials
the asset's tasks stored per clean table (refinery/contamination_tasks.py); a table with none of the
current key is scanned here, in memory, and no partial is written. Exits 1 when the phase does not pass: contamination over
the configured limit, or nothing to scan for (no eval sets), which it calls "not scanned" as the
asset check (a warning) and the demo summary do."""

from __future__ import annotations

import argparse
import json
import sys

from refinery.config import load_config
from refinery.contamination import ContaminationError, verdict
from refinery.contamination_tasks import scan_phase
from refinery.curriculum import ManifestError
from refinery.preflight import Needs
from refinery.reports.exclusions import dropped_documents, format_dropped
from refinery.storage import open_data_root


def run_scan(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if cfg.curriculum is None or args.phase not in [p.name for p in cfg.curriculum.phases]:
        known = [p.name for p in cfg.curriculum.phases] if cfg.curriculum else []
        print(f"refinery scan: unknown phase {args.phase!r}; the curriculum has {known}", file=sys.stderr)
        return 2
    root = open_data_root(cfg.resolve(cfg.data_root))
    try:
        report = scan_phase(cfg, root, args.phase)
    except (ContaminationError, ManifestError) as err:
        print(f"refinery scan: {err}", file=sys.stderr)
        return 2
    dropped = dropped_documents(root, args.phase)
    if args.json:
        print(json.dumps({**report.to_json(), "dropped_by_policy": dropped}, indent=1, sort_keys=True))
    else:
        print(f"phase {report.phase}: {verdict(report.to_json())}")
        if report.not_scanned is None:
            print(f"scanned at {report.docs_per_s:,.0f} docs/s")
        for h in report.hits:
            print(f"  {h.doc_id}  {h.url or '-'}  {h.eval_set}/{h.eval_id}  \"{h.ngram}\"")
        print("\n".join(format_dropped(args.phase, dropped)))
    return 0 if report.passed else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "scan", help="scan a phase's manifest documents for eval-set n-gram overlap",
        description="Scan the documents a phase's manifest may draw for word n-grams (contamination.ngram) of the "
                    "configured eval sets, and print each contaminated document with the eval item and the n-gram "
                    "it shares, then the documents the last drop of the contamination_scan asset removed from the "
                    "phase (policy drop). It only reads; exit 1 when more documents than "
                    "contamination.max_contaminated_docs are contaminated, or when the phase is not scanned "
                    "(no eval sets, or none with an item of contamination.ngram words).",
        epilog="example:\n  refinery scan --config configs/demo.yaml --phase anneal",
    )
    p.add_argument("--config", required=True, help="the run's YAML config (e.g. configs/demo.yaml)")
    p.add_argument("--phase", required=True, help="a curriculum phase whose manifest is built")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_scan, needs=Needs(eval_sets=True, curriculum=True))
