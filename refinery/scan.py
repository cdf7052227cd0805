"""`refinery scan --config CONFIG --phase NAME [--json]`: the contamination scan of one phase's
manifest, from the command line, and the documents the drop policy has removed from the phase. It
only reads: the drop policy is applied by the `contamination_scan` asset, which records what it
removed in the phase's exclusions file. The report is the asset's: the reduction of the partials
the asset's tasks stored per clean table (refinery/contamination.py); a table with none of the
current key is scanned here, in memory, and no partial is written. Exits 1 when the phase does not pass: contamination over
the configured limit, or nothing to scan for (no eval sets), which it calls "not scanned" as the
asset check (a warning) and the demo summary do."""

from __future__ import annotations

import argparse
import json
import sys

from typing import Any

from refinery.config import load_config
from refinery.contamination import ContaminationError, scan_phase, verdict
from refinery.layout import exclusions_key, hits_key, scan_report_key
from refinery.curriculum import ManifestError
from refinery.documents import CLEAN_STAGE
from refinery.layout import documents_key
from refinery.preflight import Needs
from refinery.storage import DataRoot, open_data_root


def excluded_doc_ids(root: DataRoot, phase: str) -> list[str]:
    """Every document the drop policy has removed from `phase` over all its scans, in doc_id order."""
    return sorted(root.read_json(exclusions_key(phase))) if root.exists(exclusions_key(phase)) else []


def dropped_documents(root: DataRoot, phase: str) -> list[dict[str, Any]]:
    """Every document the drop policy removed from `phase` (its exclusions file), in doc_id order,
    with its URL (from the clean documents table), `latest`: whether the latest contamination_scan
    dropped it, and the eval item it matched when that scan found it."""
    excluded = excluded_doc_ids(root, phase)
    if not excluded:
        return []
    latest = set(root.read_json(scan_report_key(phase)).get("dropped", [])) if root.exists(scan_report_key(phase)) else set()
    matched: dict[str, str] = {}
    if root.exists(hits_key(phase)):
        for doc_id, eval_set, eval_id in root.read_parquet(hits_key(phase), columns=["doc_id", "eval_set", "eval_id"]).iter_rows():
            matched.setdefault(doc_id, f"{eval_set}/{eval_id}")
    urls: dict[str, str | None] = {}
    for partition in sorted({d.rsplit("/", 1)[0] for d in excluded}):  # a doc_id starts with its input shard
        key = documents_key(CLEAN_STAGE, partition)
        if root.exists(key):
            urls.update(root.read_parquet(key, columns=["doc_id", "url"]).iter_rows())
    return [{"doc_id": d, "url": urls.get(d), "latest": d in latest, "eval_item": matched.get(d)} for d in excluded]


def format_dropped(phase: str, dropped: list[dict[str, Any]]) -> list[str]:
    if not dropped:
        return [f"drop policy: no document removed from phase {phase}"]
    latest = sum(d["latest"] for d in dropped)
    lines = [f"drop policy: {len(dropped)} document(s) removed from phase {phase}, {latest} by the latest "
             f"contamination_scan (marked *):"]
    for d in dropped:
        lines.append(f"  {'*' if d['latest'] else ' '} {d['doc_id']}  {d['url'] or '-'}  {d['eval_item'] or ''}".rstrip())
    return lines


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
