"""The ablation assets, present when the config has an `ablations` section (docs/ablations.md).

- `ablation_variants`, one partition per variant: the variant's documents selected over the stored
  verdicts (less those sharing an n-gram with an evaluation domain), a sample of them bounded by
  the budget tokenized, packed and shuffled into a data root of its own with one phase of the
  ablation's token budget at the fixed mixture (refinery/ablations/build.py), the held-out
  evaluation set first; its counts are the variant's summary.json. Its data version covers the evaluation set too, so a new
  evaluation set makes the runs stale.
- `ablation_runs`, one partition per variant and seed: one proxy run (training/proxy_run.py), the
  project's trainer on that data root, then the model's bits per byte on the held-out evaluation
  set. Launched like `training_run` (assets/training.py): a Pipes subprocess here or on a Ray node
  (`training.launch: ray`), relaunched from its latest checkpoint when it dies, in the same pool.
- `ablation_report`: the table of `refinery ablations` and its plot, from the stored results.
"""

import os
import sys
import warnings
from typing import Any

import dagster as dg

from assets.factory import StepResult, global_step_asset
from assets.partitions import Partitions
from assets.provenance import Provenance, code_version, image_markdown
from assets.resource import RefineryResource
from assets.training import POOL, launches_metadata, train_through_pipes, training_curves
from refinery.ablations import build, report
from refinery.ablations.eval_set import EVAL_DOCUMENTS_KEY
from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE
from refinery.layout import manifest_key

VARIANT, SEED = "variant", "seed"


def build_variants(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root, name = refinery.config, refinery.root, context.partition_key
        summary = build.build_variant(root, cfg, name)
        vroot = build.variant_root(root, name)
        written = [build.SUMMARY_KEY, manifest_key(build.PHASE)]
        hashes = {f"{build.variant_root_key(name)}/{key}": vroot.sha256(key) for key in written}
        hashes[EVAL_DOCUMENTS_KEY] = root.sha256(EVAL_DOCUMENTS_KEY)
        context.log.info(f"ablation_variants[{name}]: selects {summary['documents']:,} documents, "
                         f"{summary['tokens']:,} tokens, {summary['raw_byte_share']:.1%} of the raw text; stores "
                         f"{summary['stored']['documents']:,} documents, {summary['stored']['tokens']:,} tokens; "
                         f"budget {summary['budget_tokens']:,} tokens")
        return StepResult(
            Provenance(version, cfg.ablations.variants[name].model_dump(mode="json"), hashes,
                       docs_out=summary["documents"], bytes_out=summary["bytes"]),
            {"summary": dg.MetadataValue.json(summary),
             "documents": dg.MetadataValue.int(summary["documents"]),
             "tokens": dg.MetadataValue.int(summary["tokens"]),
             "stored_documents": dg.MetadataValue.int(summary["stored"]["documents"]),
             "stored_tokens": dg.MetadataValue.int(summary["stored"]["tokens"]),
             "weights": dg.MetadataValue.json(summary["weights"]),
             "eval_overlap": dg.MetadataValue.json(summary["eval_overlap"]),
             "budget_tokens": dg.MetadataValue.int(summary["budget_tokens"]),
             "raw_byte_share": dg.MetadataValue.float(summary["raw_byte_share"]),
             "data_root": dg.MetadataValue.path(root.display(build.variant_root_key(name)))},
        )
    return step


def result_tables(results: dict[str, Any]) -> dict[str, Any]:
    """A run's bits per byte per domain and per language, as metadata."""
    from refinery.ablations.bpb import cells_from_json, totals_by

    cells = cells_from_json(results["cells"])
    return {f"bpb_by_{axis}": dg.MetadataValue.json({k: round(t.bpb, 6) for k, t in totals_by(cells, axis).items()
                                                    if t.bpb is not None})
            for axis in ("domain", "language")}


def run_ablation(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        from training.proxy_run import single_phase

        cfg, root = refinery.config, refinery.root
        keys = context.partition_key.keys_by_dimension
        variant, seed = keys[VARIANT], int(keys[SEED])
        vcfg = build.variant_config(cfg, variant, seed)
        config_path = os.path.abspath(refinery.config_path)
        training, checkpoints, nodes = train_through_pipes(
            context, cfg, vcfg, single_phase(vcfg),
            lambda resume, _: ["-m", "assets.pipes_ablation", "--config", config_path, "--variant", variant,
                               "--seed", str(seed), "--resume", resume])
        key = report.results_key(variant, seed)
        results = root.read_json(key)
        context.log.info(f"ablation_runs[{variant}, seed {seed}]: {results['bpb']:.4f} bits per byte")
        return StepResult(
            Provenance(version, {"variant": cfg.ablations.variants[variant].model_dump(mode="json"), "seed": seed,
                                 "model": results["model"], "seq_len": results["seq_len"]},
                       {key: root.sha256(key)}),
            {
                "bpb": dg.MetadataValue.float(round(results["bpb"], 6)),
                **result_tables(results),
                "eval_documents": dg.MetadataValue.int(sum(c["documents"] for c in results["cells"])),
                "tokens_trained": dg.MetadataValue.int(int(results["tokens_trained"])),
                "steps": dg.MetadataValue.int(int(results["steps"])),
                "model_sha256": dg.MetadataValue.text(results["model_sha256"]),
                "results": dg.MetadataValue.path(root.display(key)),
                **launches_metadata(training, checkpoints, nodes),
                **training_curves(training.run_dir, training.phase),
            },
        )
    return step


def report_ablations(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root = refinery.config, refinery.root
        results, counts = report.load_stored(root, list(cfg.ablations.variants), cfg.ablations.seeds)
        if not results:
            raise dg.Failure(f"no proxy run has finished under {root.display(report.RESULTS_PREFIX)}; "
                             "materialize ablation_runs first")
        table = report.build_report(results, counts)
        png = report.report_png(table)
        hashes = {report.REPORT_KEY: root.write_json(report.REPORT_KEY, table),
                  report.REPORT_PLOT_KEY: root.write_bytes(report.REPORT_PLOT_KEY, png)}
        missing = len(cfg.ablations.variants) * cfg.ablations.seeds - len(results)
        if missing:
            context.log.warning(f"ablation_report: {missing} proxy run(s) have no results yet; the table covers "
                                f"the {len(results)} that finished")
        return StepResult(
            Provenance(version, cfg.ablations.model_dump(mode="json"), hashes),
            {
                "plot": image_markdown(png, "bits per byte per variant and domain",
                                       f"mean over seeds, spread as error bar; below, the difference to funnel "
                                       f"(`{root.display(report.REPORT_PLOT_KEY)}`)"),
                # The whole evaluation set per variant, short enough for the page to draw in place;
                # then every domain (behind "Show Markdown" once it is long) and the command's text.
                "table": dg.MetadataValue.md(report.markdown_table(table, {"all"})),
                "table_by_domain": dg.MetadataValue.md(report.markdown_table(table)),
                "report_text": dg.MetadataValue.md(f"`refinery ablations`:\n\n```\n{report.format_report(table)}\n```"),
                "runs": dg.MetadataValue.int(len(results)),
                "runs_missing": dg.MetadataValue.int(missing),
                "report": dg.MetadataValue.json(table),
            },
        )
    return step


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    if parts.ablation_variants is None or parts.ablation_runs is None:
        return dg.Definitions()
    from refinery.ablations import bpb, eval_set
    from training import proxy_run

    group, kinds = "ablations", {"pytorch"}
    with warnings.catch_warnings():  # Dagster 1.13 marks this mapping beta
        warnings.simplefilter("ignore", dg.BetaWarning)
        by_variant = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=VARIANT)
    variants_version = code_version(build, eval_set, report)
    runs_version = code_version(sys.modules[__name__], train_through_pipes, proxy_run, bpb)
    report_version = code_version(report)
    return dg.Definitions(assets=[
        global_step_asset(
            "ablation_variants", build_variants(variants_version), version=variants_version, group=group,
            kinds={"polars", "parquet"}, automation_condition=None, partitions_def=parts.ablation_variants,
            # the funnel variant's documents are scored by the main graph's difficulty model (build.scores_difficulty)
            deps=[dg.AssetDep(CLEAN_STAGE, partition_mapping=dg.AllPartitionMapping()), dg.AssetDep("tokenizer"),
                  *([dg.AssetDep("difficulty_model")] if cfg.stages.difficulty.enabled else [])],
            description="Per variant: its documents selected over the stored verdicts, tokenized, packed and shuffled "
                        "into a data root of its own, one phase of the ablation's token budget.",
        ),
        global_step_asset(
            "ablation_runs", run_ablation(runs_version), version=runs_version, group=group, kinds=kinds,
            automation_condition=None, partitions_def=parts.ablation_runs, pool=POOL,
            deps=[dg.AssetDep("ablation_variants", partition_mapping=by_variant)],
            description="Per variant and seed: the project's trainer on the variant's data root (Pipes subprocess, "
                        "auto-resume), then the model's bits per byte on the held-out evaluation set.",
        ),
        global_step_asset(
            "ablation_report", report_ablations(report_version), version=report_version, group=group,
            kinds={"matplotlib", "json"}, automation_condition=None,
            deps=[dg.AssetDep("ablation_runs", partition_mapping=dg.AllPartitionMapping())],
            description="Variant x domain bits per byte (mean and spread over seeds), tokens, documents, share of the "
                        "raw text kept, and each variant's difference to funnel with its verdict (`refinery ablations`).",
        ),
    ])
