"""The contamination drop policy: scan a phase's manifest and, under `contamination.policy: drop`,
remove what was found from that manifest and scan the rebuilt one again, so the remedy is one
materialization away; with `none` the scan only reports.

The phase's exclusions (`contamination/<phase>/exclusions.json`) accumulate over scans, so a
document dropped once stays dropped when the manifest is rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import polars as pl

from refinery import layout
from refinery import contamination as cont
from refinery import contamination_tasks as ctasks
from refinery.config import RefineryConfig
from refinery.curriculum import apply_exclusions, read_manifest, write_manifest
from refinery.storage import DataRoot

HITS_SCHEMA = {"doc_id": pl.String, "url": pl.String, "bucket": pl.String, "eval_set": pl.String,
               "eval_id": pl.String, "ngram": pl.String, "matched_ngrams": pl.Int64}


@dataclass
class PolicyScan:
    """A phase scanned under the policy: the first scan, the scan after the policy (the same one
    when nothing was dropped), the newly dropped doc ids, and the hash of the written report."""

    first: cont.ScanReport
    final: cont.ScanReport
    dropped: list[str]
    report_sha256: str


def scan_and_apply_policy(cfg: RefineryConfig, root: DataRoot, phase: str,
                          log: Callable[[str], None] | None = None) -> tuple[cont.ScanReport, cont.ScanReport, list[str]]:
    """Scan `phase`; under the drop policy remove what was found and scan the rebuilt manifest.
    Returns (first scan, final scan, newly dropped doc ids)."""
    index = cont.EvalIndex.build(cfg)
    first = ctasks.scan_phase(cfg, root, phase, index, log)
    if not first.hits or cfg.contamination.policy != "drop":
        return first, first, []
    key = layout.exclusions_key(phase)
    excluded = set(root.read_json(key)) if root.exists(key) else set()
    found = {h.doc_id for h in first.hits}
    root.write_json(key, sorted(excluded | found))
    write_manifest(root, apply_exclusions(root, read_manifest(root, phase), excluded | found))
    return first, ctasks.scan_phase(cfg, root, phase, index), sorted(found - excluded)


def scan_phase_under_policy(cfg: RefineryConfig, root: DataRoot, phase: str,
                            log: Callable[[str], None] | None = None) -> PolicyScan:
    """`scan_and_apply_policy`, then the phase's scan report (the final scan, with what the first
    found and what the policy dropped) and the first scan's hits written to the data root."""
    first, final, dropped = scan_and_apply_policy(cfg, root, phase, log)
    report = {**final.to_json(), "found_before_policy": first.contaminated_docs, "dropped": dropped,
              "policy": cfg.contamination.policy}
    digest = root.write_json(layout.scan_report_key(phase), report)
    root.write_parquet(layout.hits_key(phase), pl.DataFrame([vars(h) for h in first.hits], schema=HITS_SCHEMA))
    return PolicyScan(first, final, dropped, digest)
