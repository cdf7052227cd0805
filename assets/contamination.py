"""`contamination_scan`, per curriculum phase, and the blocking check that gates training on it.

The scan and the drop policy are refinery/drop_policy.py: with `contamination.policy: drop`,
contaminated documents are removed from the phase's manifest in the same materialization and the
rebuilt manifest is scanned again; with `none` the scan only reports, and the check blocks training.

A phase with nothing to scan for (no eval sets) is "not scanned": the check does not pass, at WARN
severity. A warning, not an error: with no eval set nothing can leak into the phase, and an error
would stop every first run of a config `refinery init` writes (it lists no eval set); the warning
keeps it in sight in the UI, in `refinery scan` (exit 1) and in the demo summary, which all word it
alike (`refinery.contamination.verdict`).

The scan's per-document work fans out in the step: one task per clean table holding the phase's
documents (`refinery.contamination.ensure_partial`), over `partitions.workers` processes
(refinery/fanout.py), each storing a partial keyed by its table's and the eval sets' hashes; a table
another phase already scanned against the same eval sets is not scanned again. The policy's scans
are then reductions of those partials, and the check reads the final one.
"""

import dagster as dg

from refinery import layout
from assets.factory import StepResult, global_step_asset, phase_check_result, phase_check_spec
from refinery.fanout import map_tasks
from assets.partitions import Partitions
from assets.provenance import Provenance, code_version
from assets.resource import RefineryResource
from refinery import contamination as cont
from refinery import contamination_tasks as ctasks
from refinery.contamination_tasks import scan_table_task
from refinery.config import RefineryConfig
from refinery.curriculum import read_manifest
from refinery.drop_policy import scan_phase_under_policy
from refinery.reports.exclusions import excluded_doc_ids

CHECK_NAME = "contamination_below_limit"
HITS_SHOWN = 10


def _hits_markdown(report: cont.ScanReport) -> str:
    if not report.hits:
        return "_no contaminated documents_"
    lines = ["| doc_id | url | eval item | matched n-gram |", "| --- | --- | --- | --- |"]
    for h in report.hits[:HITS_SHOWN]:
        lines.append(f"| {h.doc_id} | {h.url or ''} | {h.eval_set}/{h.eval_id} | {h.ngram} |")
    return "\n".join(lines)


def check_result(phase: str, final: cont.ScanReport, verdict: str, summary: dict) -> dg.AssetCheckResult:
    """The check on the scan after the policy: an error over the limit, a warning when not scanned."""
    return phase_check_result(CHECK_NAME, phase, final.passed, verdict, summary,
                              dg.AssetCheckSeverity.WARN if final.not_scanned else dg.AssetCheckSeverity.ERROR)



def scan_tables(context: dg.AssetExecutionContext, refinery: RefineryResource, phase: str) -> list[ctasks.PartialRun]:
    """Store the partial of every clean table holding `phase`'s documents, fanned out over
    `partitions.workers` processes; nothing when there is nothing to scan for."""
    cfg, root = refinery.config, refinery.root
    if cont.unscannable(cfg.contamination, cont.EvalIndex.build(cfg)) is not None:
        return []
    partitions = ctasks.phase_partitions(root, read_manifest(root, phase))
    runs = map_tasks(refinery, partitions, scan_table_task)
    for run in runs:
        if run.damaged:
            context.log.warning(run.damaged)
    scanned = sum(r.scanned for r in runs)
    context.log.info(f"contamination_scan[{phase}]: {len(runs)} tables, {scanned} scanned now, "
                     f"{len(runs) - scanned} partials reused")
    return runs


def scan_phase(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, phase = refinery.config, context.partition_key
        runs = scan_tables(context, refinery, phase)
        scan = scan_phase_under_policy(cfg, refinery.root, phase, context.log.info)
        first, final, dropped = scan.first, scan.final, scan.dropped
        dropped_so_far = len(excluded_doc_ids(refinery.root, phase))
        verdict = cont.verdict(final.to_json())
        context.log.info(
            f"contamination_scan[{phase}]: {cont.verdict(first.to_json())}; policy {cfg.contamination.policy}: "
            f"{len(dropped)} dropped now, {dropped_so_far} dropped from the phase so far, {final.contaminated_docs} remain"
        )
        summary = {
            "status": dg.MetadataValue.text(final.status),
            "docs_scanned": dg.MetadataValue.int(first.docs_scanned),
            "contaminated_docs": dg.MetadataValue.int(final.contaminated_docs),
            "found_before_policy": dg.MetadataValue.int(first.contaminated_docs),
            "dropped_by_policy": dg.MetadataValue.int(len(dropped)),
            "dropped_so_far": dg.MetadataValue.int(dropped_so_far),
            "limit": dg.MetadataValue.int(cfg.contamination.max_contaminated_docs),
        }
        provenance = Provenance(
            version, cfg.contamination.model_dump(mode="json"), {layout.scan_report_key(phase): scan.report_sha256},
            wall_s=first.wall_s, docs_in=first.docs_scanned, docs_out=first.docs_scanned - len(dropped),
            removed_by_rule={"contamination/dropped_by_policy": len(dropped)} if dropped else {},
        )
        return StepResult(
            provenance,
            {
                **summary,
                "hits": dg.MetadataValue.md(_hits_markdown(first)),
                "ngram": dg.MetadataValue.int(first.ngram),
                "tasks": dg.MetadataValue.int(len(runs)),
                "tables_scanned": dg.MetadataValue.int(sum(r.scanned for r in runs)),
                "fingerprint": dg.MetadataValue.json(final.fingerprint),
            },
            [check_result(phase, final, f"{verdict}; policy {cfg.contamination.policy}", summary)],
        )
    return step


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    if parts.phases is None:
        return dg.Definitions()
    version = code_version(cont)
    return dg.Definitions(assets=[global_step_asset(
        "contamination_scan", scan_phase(version), version=version, group="contamination", kinds={"numpy"},
        automation_condition=dg.AutomationCondition.eager(), partitions_def=parts.phases,
        deps=[dg.AssetDep("phase_manifests")],
        check_specs=[phase_check_spec(CHECK_NAME, "contamination_scan", parts.phases,
                                      "Fails when more documents than contamination.max_contaminated_docs share an "
                                      "n-gram with an eval set; warns (not scanned) when there is no eval set to "
                                      "scan for")],
        description="Word n-gram overlap of the phase's manifest documents with the configured eval sets.",
    )])
