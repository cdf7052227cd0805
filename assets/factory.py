"""One thin factory for every per-input-shard funnel stage, and the provenance every asset attaches.

An asset body reads its partition's input table, runs a pure stage from `assets.stages`, writes the
kept documents, the rejects and the stats to the data root (each atomically), and returns a
`MaterializeResult` whose metadata has the same keys for every stage.

No `from __future__ import annotations` here: Dagster inspects the `context` annotation of the
asset functions defined below and rejects it as a string.
"""

import base64
import hashlib
import inspect
import sys
from typing import Any, Callable

import dagster as dg
import polars as pl

from assets.stages.base import Stage, StageOutput, StageStats, skips
from orchestration.resources import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, documents_key, input_shard, rejects_key, stats_key
from refinery.storage import DataRoot

SAMPLE_ROWS = 3
SAMPLE_CHARS = 160


def code_version(obj: Any) -> str:
    """A short hash of the source of the module that defines `obj`: changes when the logic does."""
    module = sys.modules[obj.__module__] if not inspect.ismodule(obj) else obj
    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()[:12]


def sample_rows_markdown(df: pl.DataFrame, text_column: str = "text") -> str:
    if df.height == 0:
        return "_no rows_"
    lines = ["| doc_id | url | text |", "| --- | --- | --- |"]
    for row in df.head(SAMPLE_ROWS).iter_rows(named=True):
        text = (row.get(text_column) or "")[:SAMPLE_CHARS].replace("\n", " ").replace("|", "\\|")
        lines.append(f"| {row['doc_id']} | {row.get('url') or ''} | {text} |")
    return "\n".join(lines)


def provenance_metadata(
    stats: StageStats,
    config: dict[str, Any],
    version: str,
    outputs: dict[str, str],
    sample: pl.DataFrame | None = None,
    text_column: str = "text",
) -> dict[str, Any]:
    """The metadata keys every asset shares: counts, retention, reasons, bytes, timing, config,
    code version, content hashes of what it wrote, and a few sample rows."""
    top = dict(stats.dropped.most_common(10))
    md: dict[str, Any] = {
        "docs_in": dg.MetadataValue.int(stats.docs_in),
        "docs_out": dg.MetadataValue.int(stats.docs_out),
        "retention": dg.MetadataValue.float(round(stats.retention, 6)),
        "bytes_in": dg.MetadataValue.int(stats.bytes_in),
        "bytes_out": dg.MetadataValue.int(stats.bytes_out),
        "byte_retention": dg.MetadataValue.float(round(stats.byte_retention, 6)),
        "removed_by_rule": dg.MetadataValue.json(top),
        "wall_s": dg.MetadataValue.float(round(stats.wall_s, 4)),
        "docs_per_s": dg.MetadataValue.float(round(stats.docs_per_s, 1)),
        "config": dg.MetadataValue.json(config),
        "code_version": dg.MetadataValue.text(version),
        "content_hashes": dg.MetadataValue.json(outputs),
    }
    if stats.counters:
        md["counters"] = dg.MetadataValue.json(dict(sorted(stats.counters.items())))
    if sample is not None:
        md["sample_rows"] = dg.MetadataValue.md(sample_rows_markdown(sample, text_column))
    return md


def publish_stage_output(root: DataRoot, stage: str, partition: str, out: StageOutput) -> dict[str, str]:
    """Write documents, rejects and stats for one partition; return content hashes by key."""
    hashes = {
        documents_key(stage, partition): root.write_parquet(documents_key(stage, partition), out.documents),
        rejects_key(stage, partition): root.write_parquet(rejects_key(stage, partition), out.rejects),
    }
    root.write_json(stats_key(stage, partition), out.stats.to_dict())
    return hashes


StageBuilder = Callable[[RefineryConfig, InputShard], Stage]


def run_stage(stage: Stage, cfg: RefineryConfig, shard: InputShard, docs: pl.DataFrame) -> StageOutput:
    """One shard through one stage, with the config's per-record time budget and the shard's
    source's `skip:` list applied."""
    stage.record_timeout_s = cfg.stages.record_timeout_s
    return stage.run_for_source(docs, cfg.source(shard.source).skip)


def stage_config_summary(stage: Stage, cfg: RefineryConfig, shard: InputShard) -> dict[str, Any]:
    skipped = skips(cfg.source(shard.source).skip, stage.skip_key)
    return {"skipped_by_source": shard.source} if skipped else stage.config_summary()


def image_markdown(png: bytes, alt: str, caption: str) -> dg.MetadataValue:
    """A PNG shown inline on the asset's metadata page (a data URI in markdown), with a caption."""
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})\n\n{caption}")


def shard_stage_asset(
    name: str,
    upstream: str,
    build: StageBuilder,
    partitions_def: dg.PartitionsDefinition,
    description: str,
    version_of: Any,
    group: str = "funnel",
    kinds: set[str] | None = None,
    extra_metadata: Callable[[DataRoot, str], dict[str, Any]] | None = None,
) -> dg.AssetsDefinition:
    """A per-input-shard stage: `upstream`'s table in, `name`'s table out. `build` returns the
    stage for a shard; a source whose `skip:` names the stage's `skip_key` gets the stage's
    `skipped` output. `extra_metadata(root, partition)` adds entries once the output is published."""

    version = code_version(version_of)

    @dg.asset(
        name=name,
        deps=[dg.AssetDep(upstream)],
        partitions_def=partitions_def,
        group_name=group,
        description=description,
        code_version=version,
        kinds=kinds or {"polars", "parquet"},
    )
    def _stage_asset(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        cfg, root = refinery.config, refinery.root
        shard = input_shard(cfg, context.partition_key)
        docs = root.read_parquet(documents_key(upstream, shard.key))
        stage = build(cfg, shard)
        out = run_stage(stage, cfg, shard, docs)
        outputs = publish_stage_output(root, name, shard.key, out)
        context.log.info(
            f"{name}[{shard.key}]: {out.stats.docs_in} -> {out.stats.docs_out} docs "
            f"({out.stats.retention:.1%}) in {out.stats.wall_s:.2f}s"
        )
        summary = stage_config_summary(stage, cfg, shard)
        metadata = provenance_metadata(out.stats, summary, version, outputs, out.documents)
        if extra_metadata is not None:
            metadata.update(extra_metadata(root, shard.key))
        return dg.MaterializeResult(metadata=metadata)

    return _stage_asset
