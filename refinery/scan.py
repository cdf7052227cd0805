"""`refinery scan --config CONFIG --phase NAME [--json]`: the contamination scan of one phase's
manifest, from the command line. It only reads: the drop policy is applied by the
`contamination_scan` asset. Exits 1 when contamination exceeds the configured limit."""

from __future__ import annotations

import argparse
import json
import sys

from refinery.config import load_config
from refinery.contamination import ContaminationError, scan_phase
from refinery.manifest import ManifestError
from refinery.storage import open_data_root


def run_scan(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if cfg.curriculum is None or args.phase not in [p.name for p in cfg.curriculum.phases]:
        known = [p.name for p in cfg.curriculum.phases] if cfg.curriculum else []
        print(f"refinery scan: unknown phase {args.phase!r}; the curriculum has {known}", file=sys.stderr)
        return 2
    if not cfg.contamination.eval_sets:
        print("refinery scan: no eval sets configured; list them under contamination.eval_sets", file=sys.stderr)
        return 2
    root = open_data_root(cfg.resolve(cfg.data_root))
    try:
        report = scan_phase(cfg, root, args.phase)
    except (ContaminationError, ManifestError) as err:
        print(f"refinery scan: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=1, sort_keys=True))
    else:
        verdict = "PASS" if report.passed else "FAIL"
        print(f"phase {report.phase}: {report.contaminated_docs} of {report.docs_scanned} documents share a "
              f"{report.ngram}-gram with an eval set (limit {report.max_contaminated_docs}): {verdict}")
        print(f"scanned at {report.docs_per_s:,.0f} docs/s")
        for h in report.hits:
            print(f"  {h.doc_id}  {h.url or '-'}  {h.eval_set}/{h.eval_id}  \"{h.ngram}\"")
    return 0 if report.passed else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("scan", help="scan a phase's manifest documents for eval-set n-gram overlap")
    p.add_argument("--config", required=True)
    p.add_argument("--phase", required=True)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_scan)
