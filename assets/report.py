"""`funnel_report` (global): the whole corpus's funnel on one asset page.

It is `refinery funnel` as an asset: every input batch's stats merged per stage
(refinery/reports/funnel.py), drawn as the funnel chart and printed as the command's table, with
retention per stage, bucket and language, the top removal reasons and the raw-input budget. The chart and the
JSON report are written to the data root too, so the page and the files agree.

It covers the per-document stages it depends on (raw_documents through pii_redacted); the command
also lists tokenized_shards once buckets are tokenized.
"""

from collections import Counter

import dagster as dg

from assets.factory import StepResult, global_step_asset
from assets.partitions import Partitions
from assets.provenance import TOP_REASONS, Provenance, code_version, image_markdown
from assets.resource import RefineryResource
from refinery.reports import funnel as fr
from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE
from refinery.layout import FUNNEL_CHART_KEY, FUNNEL_REPORT_KEY, STATS_PREFIX



def report_funnel(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root = refinery.config, refinery.root
        totals = {k: v for k, v in fr.load_stage_totals(root).items() if k in fr.FUNNEL_ORDER}
        if not totals:
            raise dg.Failure(f"no funnel stats under {root.display(STATS_PREFIX)}; materialize the funnel first")
        report = fr.build_report(totals, fr.target_tokens(cfg), fr.bytes_per_token(None, []))
        report["languages"] = fr.language_retention(root)
        first, last = report["stages"][0], report["stages"][-1]
        title = f"corpus funnel: {first['docs_in']:,} records to {last['docs_out']:,} documents"
        png = fr.funnel_chart_png([t.stats for t in totals.values()], title, report["languages"])
        hashes = {FUNNEL_REPORT_KEY: root.write_json(FUNNEL_REPORT_KEY, report), FUNNEL_CHART_KEY: root.write_bytes(FUNNEL_CHART_KEY, png)}
        budget = report["budget"]
        context.log.info(f"funnel_report: {len(totals)} stage(s); {title}; raw input for "
                         f"{budget['target_tokens']:,} tokens: {budget['raw_input_bytes']} bytes")
        removed = sum((t.stats.dropped for t in totals.values()), Counter())
        provenance = Provenance(
            version, {"target_tokens": budget["target_tokens"], "bytes_per_token": budget["bytes_per_token"]}, hashes,
            docs_in=first["docs_in"], docs_out=last["docs_out"], bytes_in=first["bytes_in"], bytes_out=last["bytes_out"],
            retention=report["overall"]["retention"], byte_retention=report["overall"]["byte_retention"],
            removed_by_rule=dict(removed.most_common(TOP_REASONS)),
        )
        return StepResult(provenance, {
            "funnel": image_markdown(png, title, f"documents left after each stage (`{root.display(FUNNEL_CHART_KEY)}`)"),
            "funnel_table": dg.MetadataValue.md(f"`refinery funnel`:\n\n```\n{fr.format_report(report)}\n```"),
            "stages": dg.MetadataValue.int(len(totals)),
            "records_in": dg.MetadataValue.int(first["docs_in"]),
            "target_tokens": dg.MetadataValue.int(budget["target_tokens"]),
            "raw_input_bytes": (dg.MetadataValue.int(round(budget["raw_input_bytes"])) if budget["raw_input_bytes"] is not None
                                else dg.MetadataValue.text("unbounded: nothing survives the funnel")),
            "report": dg.MetadataValue.json(report),
            # documents kept of those entering language ID, per language: the first question on a multilingual corpus
            "retention_by_language": dg.MetadataValue.json(
                {lang: {k: v[k] for k in ("docs_in", "docs_out", "retention", "bytes_in", "bytes_out", "byte_retention")}
                 for lang, v in report["languages"].items()}),
        })
    return step


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    version = code_version(fr)
    return dg.Definitions(assets=[global_step_asset(
        "funnel_report", report_funnel(version), version=version, group="funnel", kinds={"matplotlib", "json"},
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep(CLEAN_STAGE, partition_mapping=dg.AllPartitionMapping())],
        description="The whole corpus's funnel (`refinery funnel`): chart, retention per stage, bucket and language, "
                    "top removal reasons and the raw-input budget.",
    )])
