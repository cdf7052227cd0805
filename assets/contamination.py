"""`contamination_scan`, per curriculum phase, and the blocking check that gates training on it.

With `contamination.policy: drop`, contaminated documents are removed from the phase's manifest in
the same materialization and the rebuilt manifest is scanned again, so the remedy is one
materialization away; with `none` the scan only reports, and the check blocks training.
"""

import dagster as dg
import polars as pl

from assets.factory import code_version, phase_check_result, phase_check_spec
from orchestration.resources import RefineryResource
from refinery import contamination as cont
from refinery.config import RefineryConfig
from refinery.manifest import read_manifest, write_manifest

CHECK_NAME = "contamination_below_limit"
HITS_SHOWN = 10


def _hits_markdown(report: cont.ScanReport) -> str:
    if not report.hits:
        return "_no contaminated documents_"
    lines = ["| doc_id | url | eval item | matched n-gram |", "| --- | --- | --- | --- |"]
    for h in report.hits[:HITS_SHOWN]:
        lines.append(f"| {h.doc_id} | {h.url or ''} | {h.eval_set}/{h.eval_id} | {h.ngram} |")
    return "\n".join(lines)


def scan_and_apply_policy(cfg: RefineryConfig, root, phase: str, log=None) -> tuple[cont.ScanReport, cont.ScanReport, list[str]]:
    """Scan `phase`; under the drop policy remove what was found and scan the rebuilt manifest.
    Returns (first scan, final scan, newly dropped doc ids)."""
    index = cont.EvalIndex.build(cfg)
    first = cont.scan_phase(cfg, root, phase, index, log)
    if not first.hits or cfg.contamination.policy != "drop":
        return first, first, []
    key = cont.exclusions_key(phase)
    excluded = set(root.read_json(key)) if root.exists(key) else set()
    found = {h.doc_id for h in first.hits}
    root.write_json(key, sorted(excluded | found))
    write_manifest(root, cont.apply_exclusions(root, read_manifest(root, phase), excluded | found))
    return first, cont.scan_phase(cfg, root, phase, index), sorted(found - excluded)


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    if parts.phases is None:
        return dg.Definitions()

    @dg.asset(
        name="contamination_scan",
        automation_condition=dg.AutomationCondition.eager(),
        partitions_def=parts.phases,
        deps=[dg.AssetDep("phase_manifests")],
        group_name="contamination",
        code_version=code_version(cont),
        kinds={"numpy"},
        check_specs=[phase_check_spec(CHECK_NAME, "contamination_scan", parts.phases,
                                      "Fails when more documents than contamination.max_contaminated_docs share an "
                                      "n-gram with an eval set")],
        description="Word n-gram overlap of the phase's manifest documents with the configured eval sets.",
    )
    def contamination_scan(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        cfg, root = refinery.config, refinery.root
        phase = context.partition_key
        first, final, dropped = scan_and_apply_policy(cfg, root, phase, context.log.info)
        report = {**final.to_json(), "found_before_policy": first.contaminated_docs, "dropped": dropped,
                  "policy": cfg.contamination.policy}
        digest = root.write_json(cont.scan_report_key(phase), report)
        hits = pl.DataFrame([vars(h) for h in first.hits], schema={
            "doc_id": pl.String, "url": pl.String, "bucket": pl.String, "eval_set": pl.String,
            "eval_id": pl.String, "ngram": pl.String, "matched_ngrams": pl.Int64})
        root.write_parquet(cont.hits_key(phase), hits)
        context.log.info(
            f"contamination_scan[{phase}]: {first.contaminated_docs} of {first.docs_scanned} documents contaminated; "
            f"policy {cfg.contamination.policy}: {len(dropped)} dropped, {final.contaminated_docs} remain"
        )
        summary = {
            "docs_scanned": dg.MetadataValue.int(first.docs_scanned),
            "contaminated_docs": dg.MetadataValue.int(final.contaminated_docs),
            "found_before_policy": dg.MetadataValue.int(first.contaminated_docs),
            "dropped_by_policy": dg.MetadataValue.int(len(dropped)),
            "limit": dg.MetadataValue.int(cfg.contamination.max_contaminated_docs),
        }
        return dg.MaterializeResult(
            metadata={
                **summary,
                "hits": dg.MetadataValue.md(_hits_markdown(first)),
                "ngram": dg.MetadataValue.int(first.ngram),
                "docs_per_s": dg.MetadataValue.float(round(first.docs_per_s, 1)),
                "fingerprint": dg.MetadataValue.json(final.fingerprint),
                "config": dg.MetadataValue.json(cfg.contamination.model_dump(mode="json")),
                "content_hashes": dg.MetadataValue.json({cont.scan_report_key(phase): digest}),
            },
            check_results=[phase_check_result(
                CHECK_NAME, phase, final.passed,
                f"{final.contaminated_docs} of {first.docs_scanned} documents contaminated after policy "
                f"{cfg.contamination.policy} (limit {cfg.contamination.max_contaminated_docs})", summary)],
        )

    return dg.Definitions(assets=[contamination_scan])
