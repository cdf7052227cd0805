"""`refinery why URL_OR_DOC_ID`: one document's path through the funnel, read from what the graph
wrote (refinery/reports/trail.py follows it)."""

from __future__ import annotations

import argparse
import json
import sys

from refinery.config import load_config
from refinery.preflight import READ_ONLY
from refinery.reports.trail import DocumentTrail, format_trail
from refinery.storage import open_data_root


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    trail = DocumentTrail(cfg, root)
    doc_ids = trail.doc_ids(args.document)
    if not doc_ids:
        print(f"refinery why: no document with doc_id or url {args.document!r} in raw_documents or its rejects under "
              f"{root.display('documents')}; check the config is the one the data root was materialized with, and "
              f"materialize raw_documents for the input file that holds it", file=sys.stderr)
        return 1
    trails = [trail.trace(d) for d in doc_ids]
    if args.json:
        print(json.dumps(trails, indent=2, sort_keys=True, ensure_ascii=False, default=str))
    else:
        print("\n\n".join(format_trail(t, args.config) for t in trails))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "why",
        help="one document's path through the funnel: which stage removed it and why, or where its tokens are",
        description="Follow one document (by doc_id or url; every document with that url) through every funnel "
                    "stage it reached. A removed document shows the stage, the rule, the measured value and the "
                    "threshold, and for dedup the document kept instead; a kept one shows its final shards and token "
                    "offsets, which `refinery lineage --shard S --offset N` takes. It reads what the graph wrote "
                    "under the data root.",
        epilog="examples:\n  refinery why --config configs/demo.yaml https://example.com/page\n"
               "  refinery why --config configs/demo.yaml web-web-00.warc.gz/0000015 --json",
    )
    p.add_argument("document", metavar="URL_OR_DOC_ID", help="a doc_id (<input file>/<record>) or a url")
    p.add_argument("--config", required=True, help="the run's YAML config (e.g. configs/demo.yaml)")
    p.add_argument("--json", action="store_true", help="print a JSON list (one object per document)")
    p.set_defaults(func=run, needs=READ_ONLY)
