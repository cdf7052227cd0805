"""The documents the contamination drop policy removed from a phase: what `refinery scan` prints and
the contamination assets and the demo summary read."""

from __future__ import annotations

from typing import Any

from refinery.documents import CLEAN_STAGE
from refinery.layout import documents_key, exclusions_key, hits_key, scan_report_key
from refinery.storage import DataRoot


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
