"""`quality_model` (global), `quality_scored` and `pii_redacted` (per input batch, outputs per file).

quality_model trains the classifier on every `deduped` partition of the positive and negative
buckets, streamed in bounded batches (refinery/models/quality_training.py), and publishes
`models/quality/quality-<hash>.pt` plus the `models/quality/latest.json` pointer. quality_scored
scores each shard with the model the pointer names and writes its kept documents' scores as an
attribute table (refinery/stages/attributes.py); pii_redacted runs the safety filter and then PII
redaction (`refinery.stages.pii`), scores the documents whose text redaction changed again with the
same published model (so the `quality_score` a clean document carries is its kept text's), and
stores the final text.
"""

import inspect
from collections import Counter

import dagster as dg
import polars as pl

from assets.factory import StepResult, batch_stage_asset, global_step_asset
from refinery.fanout import FileResult
from assets.partitions import Partitions
from assets.provenance import Provenance, code_version, image_markdown, stage_code_version
from assets.resource import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard
from refinery.reports.funnel import files_stage_stats, funnel_chart_png
from refinery.models import quality as q
from refinery.models import quality_features, quality_fit
from refinery.models import quality_training as qt
from refinery.stages.attributes import read_stage_documents
from refinery.models.quality_training import quality_settings, train_and_publish
from refinery.stage_recipes import recipe, stage_code
from refinery.stages import registry
from refinery.stages.base import skips
from refinery.stage_file_tasks import PII_STAGE, UPSTREAM, redact_file, score_file
from refinery.storage import DataRoot


# The registry's stages whose assets this module makes, each with its own file task: they read the
# model the run published (assets/funnel.py makes the others').
STAGE_ASSETS = (q.QualityScorer.name, PII_STAGE)


def _metric(value: float | None) -> dg.MetadataValue:
    return dg.MetadataValue.float(round(value, 6)) if value is not None else dg.MetadataValue.text("n/a")


def train_model(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg = refinery.config
        if not cfg.stages.quality.enabled:
            context.log.info("stages.quality.enabled is false: no classifier trained")
            return StepResult(Provenance(version, quality_settings(cfg), {}),
                              {"enabled": dg.MetadataValue.bool(False)})
        pointer, report = train_and_publish(cfg, refinery.root)
        context.log.info(
            f"quality_model {pointer['model_hash']}: AUC {report.auc}, accuracy {report.accuracy} on "
            f"{report.holdout_size} held out"
        )
        for flag in report.metrics["flags"]:
            context.log.warning(flag)
        seen = report.train_positive + report.train_negative + report.holdout_size
        check = report.metrics["check"]
        return StepResult(
            Provenance(version, pointer["settings"], {pointer["model_key"]: pointer["sha256"]}, wall_s=report.wall_s,
                       docs_in=seen),
            {
                "model_key": dg.MetadataValue.path(refinery.root.display(pointer["model_key"])),
                "model_hash": dg.MetadataValue.text(pointer["model_hash"]),
                "holdout_accuracy": _metric(report.accuracy),
                "holdout_precision": _metric(report.precision),
                "holdout_recall": _metric(report.recall),
                "holdout_f1": _metric(report.f1),
                "holdout_auc": _metric(report.auc),
                "decision_threshold": dg.MetadataValue.float(report.metrics["decision_threshold"]),
                "holdout_by_language": dg.MetadataValue.json(report.metrics["holdout_by_language"]),
                "share_above_threshold": dg.MetadataValue.json(report.metrics["share_above_threshold"]),
                "check_auc_high_vs_low": _metric(check and check["high_vs_low"]["auc"]),
                "check_auc_high_vs_spam": _metric(check and check["high_vs_spam"]["auc"]),
                "labelled_check": dg.MetadataValue.json(check or {}),
                "within_bucket": dg.MetadataValue.json(report.metrics["within_bucket"] or {}),
                "source_separation": dg.MetadataValue.text("; ".join(report.metrics["flags"]) or "none"),
                "train_by_language": dg.MetadataValue.json(report.train_by_language),
                "untrained_languages": dg.MetadataValue.json(report.untrained_languages),
                "train_by_bucket": dg.MetadataValue.json(report.train_by_bucket),
                "holdout_by_bucket": dg.MetadataValue.json(report.holdout_by_bucket),
                "train_positive": dg.MetadataValue.int(report.train_positive),
                "train_negative": dg.MetadataValue.int(report.train_negative),
            },
        )
    return step



def score_metadata(refinery: RefineryResource, shards: list[InputShard], results: list[FileResult]) -> dict:
    """The model the run scored with, whether every source's threshold held, and score quantiles."""
    cfg, root = refinery.config, refinery.root
    if not cfg.stages.quality.enabled:
        return {}
    skipping = sorted({s.source for s in shards if skips(cfg.source(s.source).skip, q.QualityScorer.skip_key)})
    md = {"quality_model": dg.MetadataValue.text(root.read_json(q.LATEST_KEY)["model_hash"]),
          "threshold_enforced": dg.MetadataValue.bool(not skipping)}
    if skipping:
        md["note"] = dg.MetadataValue.text(
            f"source(s) {', '.join(map(repr, skipping))} skip quality: their documents are scored but never "
            f"dropped on score"
        )
    scores = pl.concat([read_stage_documents(root, q.QualityScorer.name, s.key, columns=["quality_score"])
                        for s in shards])["quality_score"].drop_nulls()
    if len(scores):
        md["score_quantiles"] = dg.MetadataValue.json(
            {f"p{p}": round(float(scores.quantile(p / 100, "nearest")), 6) for p in (10, 50, 90)}
        )
    counters = sum((Counter(r.stats.counters) for r in results), Counter())
    md["share_above_threshold"] = dg.MetadataValue.json(q.shares_above_threshold(counters))
    return md


def funnel_chart_metadata(root: DataRoot, files: list[str]) -> dict:
    """The run's whole funnel, raw records to clean documents over all its files, as one chart on
    its last stage (one drawing per materialization, however many files and batches it covers)."""
    title = f"funnel of {files[0]}" if len(files) == 1 else f"funnel of {len(files)} input files"
    png = funnel_chart_png(files_stage_stats(root, files), title)
    return {"funnel_chart": image_markdown(png, title, "documents left after each stage")}


def funnel_chart_of_run(refinery: RefineryResource, shards: list[InputShard], results: list[FileResult]) -> dict:
    return funnel_chart_metadata(refinery.root, [r.shard for r in results])



def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    model_version = code_version(q, quality_features, quality_fit, qt)
    quality_model = global_step_asset(
        "quality_model", train_model(model_version), version=model_version, group="funnel", kinds={"torch"},
        automation_condition=dg.AutomationCondition.on_missing(),
        deps=[dg.AssetDep(UPSTREAM, partition_mapping=dg.AllPartitionMapping())],
        description="Hashed word n-gram logistic regression: curated buckets positive, raw web negative.",
    )
    quality_scored = batch_stage_asset(
        "quality_scored", score_file, parts, version=stage_code_version("quality_scored", code_version(*stage_code("quality_scored", cfg))), kinds={"torch", "polars", "parquet"},
        deps=[dg.AssetDep(UPSTREAM), dg.AssetDep("quality_model")], extra_metadata=score_metadata,
        description=inspect.getdoc(recipe(q.QualityScorer.name)),
    )
    pii_redacted = batch_stage_asset(
        PII_STAGE, redact_file, parts, version=stage_code_version(PII_STAGE, code_version(*stage_code(PII_STAGE, cfg))),
        deps=[dg.AssetDep(registry.funnel_stage(PII_STAGE).upstream)], extra_metadata=funnel_chart_of_run,
        description=inspect.getdoc(recipe(PII_STAGE)),
    )
    return dg.Definitions(assets=[quality_model, quality_scored, pii_redacted])
