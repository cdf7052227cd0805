"""`phase_manifests`, one partition per curriculum phase, and the blocking check that stops a phase
whose curriculum fails validation from reaching the contamination scan and the trainer.

A partition's reads of the entry tables (quality cutoffs, difficulty bands, selections and band
files) run as a task per final shard (per batch of entries for the bands' sums) in the pool of
`partitions.workers` processes (`refinery.fanout.task_pool`); the step adds up the tasks' counts and
histograms and writes the files, the same bytes whatever ran the tasks.

The manifest is written even when validation fails, so the reason can be read from the file as
well as from the check; the check then blocks everything downstream.
"""

import dagster as dg

from refinery import layout
from assets.factory import StepResult, global_step_asset, phase_check_result, phase_check_spec
from refinery.fanout import task_pool
from assets.partitions import Partitions
from assets.provenance import Provenance, code_version, image_markdown
from assets.resource import RefineryResource
from refinery import curriculum as cur
from refinery.config import RefineryConfig
from refinery.curriculum import write_manifest
from refinery.layout import manifest_key
from refinery.reports.contract import bucket_rows, markdown_table, phase_rows, summary_lines, write_schedule_plot
from refinery.layout import SCHEDULE_PLOT_KEY

CHECK_NAME = "curriculum_valid"


def contract_markdown(report: cur.ValidationReport, phase: str) -> str:
    """The contract tables as markdown, the phase's row in bold, then the findings."""
    if report.contract is None:
        return "\n".join(["_the schedule could not be computed_", *(f"- error: {e}" for e in report.errors)])
    lines = [
        *markdown_table(*phase_rows(report.contract), bold_first=phase),
        "",
        *markdown_table(*bucket_rows(report.contract)),
        "",
        *(f"- {line}" for line in summary_lines(report.contract)),
        *(f"- error: {e}" for e in report.errors),
        *(f"- warning: {w}" for w in report.warnings),
    ]
    return "\n".join(lines)


def build_manifest(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root = refinery.config, refinery.root
        phase = context.partition_key
        with task_pool(refinery) as pool:
            run_tasks = cur.CountedTasks(pool)
            report, inventory, selections = cur.validate_data_root(cfg, root, run_tasks)
            if inventory is None:
                raise cur.CurriculumError(
                    f"{root.display(layout.FINAL_SHARDS_PREFIX)}: no final shards in any bucket; materialize shuffled_shards first"
                )
            manifest = cur.build_phase_manifest(cfg, root, phase, report, inventory, selections, run_tasks)
        context.log.info(f"phase_manifests[{phase}]: {run_tasks.tasks} tasks on {cfg.partitions.workers} workers")
        digest = write_manifest(root, manifest)
        plot_sha = write_schedule_plot(cfg, root, report.schedule, (report.contract.get("difficulty") or {}).get("bands"))
        for finding in report.errors:
            context.log.error(f"phase_manifests[{phase}]: {finding}")
        hashes = {manifest_key(phase): digest, SCHEDULE_PLOT_KEY: plot_sha}
        hashes.update({b.selection: b.selection_sha256 for b in manifest.buckets.values() if b.selection})
        hashes.update({o["file"]: o["sha256"] for o in (manifest.order or {}).get("buckets", {}).values()})
        summary = {
            "valid": dg.MetadataValue.bool(report.ok),
            "errors": dg.MetadataValue.int(len(report.errors)),
            "warnings": dg.MetadataValue.int(len(report.warnings)),
        }
        return StepResult(
            Provenance(version, cfg.curriculum.model_dump(mode="json"), hashes),
            {
                **summary,
                "tasks": dg.MetadataValue.int(run_tasks.tasks),
                "token_budget": dg.MetadataValue.int(manifest.token_budget),
                "seq_len": dg.MetadataValue.int(manifest.seq_len),
                "lr_scale": dg.MetadataValue.float(manifest.lr_scale),
                "weights": dg.MetadataValue.json(manifest.weights),
                "bucket_tokens": dg.MetadataValue.json({b: s.tokens for b, s in manifest.buckets.items()}),
                "bucket_entries": dg.MetadataValue.json({b: s.entries for b, s in manifest.buckets.items()}),
                "quality_cutoffs": dg.MetadataValue.json(
                    {b: s.quality_cutoff for b, s in manifest.buckets.items() if s.quality_cutoff is not None}
                ),
                "quality_languages": dg.MetadataValue.json(
                    {b: s.languages for b, s in manifest.buckets.items() if s.languages is not None}
                ),
                "contract": dg.MetadataValue.md(contract_markdown(report, phase)),
                "schedule_plot": image_markdown(
                    root.read_bytes(SCHEDULE_PLOT_KEY), "curriculum schedule", f"`{root.display(SCHEDULE_PLOT_KEY)}`"
                ),
                "manifest_path": dg.MetadataValue.path(root.display(manifest_key(phase))),
            },
            [phase_check_result(
                CHECK_NAME, phase, report.ok,
                f"curriculum {'valid' if report.ok else 'invalid'}: {len(report.errors)} error(s), "
                f"{len(report.warnings)} warning(s)",
                {**summary, "findings": dg.MetadataValue.json(report.to_json()["errors"] + report.to_json()["warnings"])},
            )],
        )
    return step


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    if parts.phases is None:
        return dg.Definitions()
    version = code_version(cur)
    return dg.Definitions(assets=[global_step_asset(
        "phase_manifests", build_manifest(version), version=version, group="curriculum", kinds={"json"},
        automation_condition=dg.AutomationCondition.eager(), partitions_def=parts.phases,
        deps=[dg.AssetDep("shuffled_shards", partition_mapping=dg.AllPartitionMapping())],
        check_specs=[phase_check_spec(CHECK_NAME, "phase_manifests", parts.phases,
                                      "Fails when the curriculum has a blocking validation error (refinery validate)")],
        description="Per phase: the final shards and entries it may draw, its token budget, mixture, seq_len, "
        "lr_scale and the curriculum's validation result.",
    )])
