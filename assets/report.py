"""`funnel_report` (global): the whole corpus's funnel on one asset page.

It is `refinery funnel` as an asset: every input batch's stats merged per stage
(refinery/funnel_report.py), drawn as the funnel chart and printed as the command's table, with
retention per stage and bucket, the top removal reasons and the raw-input budget. The chart and the
JSON report are written to the data root too, so the page and the files agree.

It covers the per-document stages it depends on (raw_documents through pii_redacted); the command
also lists tokenized_shards once buckets are tokenized.
"""

import dagster as dg

from assets.factory import code_version, image_markdown
from orchestration.resources import RefineryResource
from refinery import funnel_report as fr
from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE

REPORT_KEY = "reports/funnel.json"
CHART_KEY = "reports/funnel.png"


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    version = code_version(fr)

    @dg.asset(
        name="funnel_report",
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep(CLEAN_STAGE, partition_mapping=dg.AllPartitionMapping())],
        group_name="funnel",
        code_version=version,
        kinds={"matplotlib", "json"},
        description="The whole corpus's funnel (`refinery funnel`): chart, retention per stage and bucket, "
                    "top removal reasons and the raw-input budget.",
    )
    def funnel_report(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        cfg, root = refinery.config, refinery.root
        totals = {k: v for k, v in fr.load_stage_totals(root).items() if k in fr.FUNNEL_ORDER}
        if not totals:
            raise dg.Failure(f"no funnel stats under {root.display('stats')}; materialize the funnel first")
        report = fr.build_report(totals, fr.target_tokens(cfg), fr.DEFAULT_BYTES_PER_TOKEN)
        first, last = report["stages"][0], report["stages"][-1]
        title = f"corpus funnel: {first['docs_in']:,} records to {last['docs_out']:,} documents"
        png = fr.funnel_chart_png([t.stats for t in totals.values()], title)
        hashes = {REPORT_KEY: root.write_json(REPORT_KEY, report), CHART_KEY: root.write_bytes(CHART_KEY, png)}
        budget = report["budget"]
        context.log.info(f"funnel_report: {len(totals)} stage(s); {title}; raw input for "
                         f"{budget['target_tokens']:,} tokens: {budget['raw_input_bytes']} bytes")
        return dg.MaterializeResult(metadata={
            # one entry, so the chart and the table open together
            "funnel": image_markdown(png, title, f"documents left after each stage (`{root.display(CHART_KEY)}`), "
                                                 f"and `refinery funnel`:\n\n```\n{fr.format_report(report)}\n```"),
            "stages": dg.MetadataValue.int(len(totals)),
            "records_in": dg.MetadataValue.int(first["docs_in"]),
            "docs_out": dg.MetadataValue.int(last["docs_out"]),
            "retention": dg.MetadataValue.float(report["overall"]["retention"]),
            "byte_retention": dg.MetadataValue.float(report["overall"]["byte_retention"]),
            "target_tokens": dg.MetadataValue.int(budget["target_tokens"]),
            "raw_input_bytes": (dg.MetadataValue.int(round(budget["raw_input_bytes"])) if budget["raw_input_bytes"] is not None
                                else dg.MetadataValue.text("unbounded: nothing survives the funnel")),
            "report": dg.MetadataValue.json(report),
            "code_version": dg.MetadataValue.text(version),
            "content_hashes": dg.MetadataValue.json(hashes),
        })

    return dg.Definitions(assets=[funnel_report])
