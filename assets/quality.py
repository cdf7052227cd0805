"""`quality_model` (global), `quality_scored` and `pii_redacted` (per input batch, outputs per file).

quality_model reads every `deduped` partition of the positive and negative buckets, trains the
classifier of `refinery.stages.quality`, and publishes `models/quality/quality-<hash>.pt` plus the
`models/quality/latest.json` pointer. quality_scored scores each shard with the model the pointer
names; pii_redacted runs the safety filter and then PII redaction (`refinery.stages.pii`).
"""


import dagster as dg
import polars as pl

from assets.factory import (
    SAMPLE_ROWS, FileResult, batch_metadata, batch_stage_asset, code_version, image_markdown, map_files,
    publish_stage_output, run_stage,
)
from refinery.stages import pii as pii_stage
from refinery.stages import quality as q
from refinery.stages.base import skips
from orchestration.resources import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, batch_shards, documents_key, input_shards
from refinery.funnel_report import files_stage_stats, funnel_chart_png
from refinery.storage import DataRoot

UPSTREAM = "deduped"


def training_documents(cfg: RefineryConfig, root: DataRoot) -> pl.DataFrame:
    """doc_id, bucket and text of the upstream documents the classifier trains on. A first pass
    keeps only lengths, so memory holds the chosen texts (at most max_train_docs_per_class per
    class), never every document of the corpus."""
    qc = cfg.stages.quality
    wanted = set(qc.positive_buckets) | set(qc.negative_buckets)
    keys = [documents_key(UPSTREAM, s.key) for s in input_shards(cfg) if s.bucket in wanted]
    columns = ["doc_id", "bucket", "text"]
    if not keys:
        return pl.DataFrame(schema={"doc_id": pl.String, "bucket": pl.String, "text": pl.String})
    index = pl.concat([q.text_index(root.read_parquet(k, columns=columns)) for k in keys])
    chosen = q.training_set(index, list(qc.positive_buckets), list(qc.negative_buckets),
                            qc.max_train_docs_per_class, cfg.seed)["doc_id"]
    return pl.concat([root.read_parquet(k, columns=columns).filter(pl.col("doc_id").is_in(chosen)) for k in keys])


def train_and_publish(cfg: RefineryConfig, root: DataRoot) -> tuple[dict, q.TrainingReport]:
    qc = cfg.stages.quality
    model, report = q.train_quality_model(
        training_documents(cfg, root),
        list(qc.positive_buckets),
        list(qc.negative_buckets),
        num_features=qc.num_features,
        ngram=qc.ngram,
        epochs=qc.epochs,
        learning_rate=qc.learning_rate,
        holdout_fraction=qc.holdout_fraction,
        max_chars=qc.max_chars,
        max_docs_per_class=qc.max_train_docs_per_class,
        seed=cfg.seed,
    )
    settings = {**qc.model_dump(mode="json"), "seed": cfg.seed}
    return q.publish_model(root, model, report, settings), report


def _metric(value: float | None) -> dg.MetadataValue:
    return dg.MetadataValue.float(round(value, 6)) if value is not None else dg.MetadataValue.text("n/a")


def funnel_chart_metadata(root: DataRoot, files: list[str]) -> dict:
    """The run's whole funnel, raw records to clean documents over all its files, as one chart on
    its last stage (one drawing per materialization, however many files and batches it covers)."""
    title = f"funnel of {files[0]}" if len(files) == 1 else f"funnel of {len(files)} input files"
    png = funnel_chart_png(files_stage_stats(root, files), title)
    return {"funnel_chart": image_markdown(png, title, "documents left after each stage")}


def score_file(refinery: RefineryResource, shard: InputShard, cache: dict) -> FileResult:
    """One file's deduped documents scored (and, unless its source skips quality, thresholded)."""
    cfg, root = refinery.config, refinery.root
    docs = root.read_parquet(documents_key(UPSTREAM, shard.key))
    if not cfg.stages.quality.enabled:
        out = q.unscored(docs)
        hashes = publish_stage_output(root, q.QualityScorer.name, shard.key, out)
        return FileResult(shard.key, shard.source, out.stats, hashes, {"enabled": False}, out.documents.head(SAMPLE_ROWS))
    if "model" not in cache:
        cache["model"] = q.load_published_model(root)
    model, pointer = cache["model"]
    stage = q.QualityScorer(model, cfg.stages.quality.threshold, model_id=pointer["model_hash"])
    enforce = not skips(cfg.source(shard.source).skip, stage.skip_key)
    out = run_stage(stage, cfg, shard, docs)
    hashes = publish_stage_output(root, stage.name, shard.key, out)
    settings = {**stage.config_summary(), "threshold_enforced": enforce}
    return FileResult(shard.key, shard.source, out.stats, hashes, settings, out.documents.head(SAMPLE_ROWS))


def _safety_then_redact(cfg: RefineryConfig, source: str) -> pii_stage.SafetyThenRedact:
    return pii_stage.SafetyThenRedact.from_config(cfg.stages)


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    model_version = code_version(q)

    @dg.asset(
        name="quality_model",
        automation_condition=dg.AutomationCondition.on_missing(),
        deps=[dg.AssetDep(UPSTREAM, partition_mapping=dg.AllPartitionMapping())],
        group_name="funnel",
        code_version=model_version,
        kinds={"torch"},
        description="Hashed word n-gram logistic regression: curated buckets positive, raw web negative.",
    )
    def quality_model(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        if not refinery.config.stages.quality.enabled:
            context.log.info("stages.quality.enabled is false: no classifier trained")
            return dg.MaterializeResult(metadata={"enabled": dg.MetadataValue.bool(False)})
        pointer, report = train_and_publish(refinery.config, refinery.root)
        context.log.info(
            f"quality_model {pointer['model_hash']}: accuracy {report.accuracy} on {report.holdout_size} held out"
        )
        return dg.MaterializeResult(
            metadata={
                "model_key": dg.MetadataValue.path(refinery.root.display(pointer["model_key"])),
                "model_hash": dg.MetadataValue.text(pointer["model_hash"]),
                "holdout_accuracy": _metric(report.accuracy),
                "holdout_precision": _metric(report.precision),
                "holdout_recall": _metric(report.recall),
                "train_by_bucket": dg.MetadataValue.json(report.train_by_bucket),
                "holdout_by_bucket": dg.MetadataValue.json(report.holdout_by_bucket),
                "train_positive": dg.MetadataValue.int(report.train_positive),
                "train_negative": dg.MetadataValue.int(report.train_negative),
                "wall_s": dg.MetadataValue.float(round(report.wall_s, 3)),
                "config": dg.MetadataValue.json(pointer["settings"]),
                "code_version": dg.MetadataValue.text(model_version),
                "content_hashes": dg.MetadataValue.json({pointer["model_key"]: pointer["sha256"]}),
            }
        )

    @dg.asset(
        name="quality_scored",
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep(UPSTREAM), dg.AssetDep("quality_model")],
        partitions_def=parts.input_batches,
        backfill_policy=parts.batch_backfill,
        group_name="funnel",
        code_version=model_version,
        kinds={"torch", "polars", "parquet"},
        description="quality_score on every document; drops those below stages.quality.threshold.",
    )
    def quality_scored(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        cfg, root = refinery.config, refinery.root
        shards = batch_shards(cfg, context.partition_keys)
        results = map_files(refinery, shards, score_file)
        md = batch_metadata(q.QualityScorer.name, results, model_version)
        if not cfg.stages.quality.enabled:
            return dg.MaterializeResult(metadata=md)
        skipping = sorted({s.source for s in shards if skips(cfg.source(s.source).skip, q.QualityScorer.skip_key)})
        md["quality_model"] = dg.MetadataValue.text(root.read_json(q.LATEST_KEY)["model_hash"])
        md["threshold_enforced"] = dg.MetadataValue.bool(not skipping)
        if skipping:
            md["note"] = dg.MetadataValue.text(
                f"source(s) {', '.join(map(repr, skipping))} skip quality: their documents are scored but never "
                f"dropped on score"
            )
        scores = pl.concat([root.read_parquet(documents_key(q.QualityScorer.name, s.key), columns=["quality_score"])
                            for s in shards])["quality_score"].drop_nulls()
        if len(scores):
            md["score_quantiles"] = dg.MetadataValue.json(
                {f"p{p}": round(float(scores.quantile(p / 100, "nearest")), 6) for p in (10, 50, 90)}
            )
        return dg.MaterializeResult(metadata=md)

    pii_redacted = batch_stage_asset(
        name="pii_redacted",
        upstream="quality_scored",
        build=_safety_then_redact,
        partitions_def=parts.input_batches,
        backfill_policy=parts.batch_backfill,
        description="Safety filter (blocked words and domains), then PII replaced by typed placeholders.",
        version=code_version(pii_stage),
        extra_metadata=funnel_chart_metadata,
    )

    return dg.Definitions(assets=[quality_model, quality_scored, pii_redacted])
