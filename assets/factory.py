"""One thin factory for every per-document funnel stage, and the provenance every asset attaches.

A partition is a batch of input files (assets/partitions.py). An asset body reads each file's input
table, runs a pure stage from `refinery.stages`, writes that file's kept documents, rejects and stats
to the data root (each atomically), and returns one `MaterializeResult` for the run whose metadata
has the same keys for every stage.

No `from __future__ import annotations` here: Dagster inspects the `context` annotation of the
asset functions defined below and rejects it as a string.
"""

import base64
import hashlib
import inspect
import json
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context
from typing import Any, Callable, TypeVar

import dagster as dg
import polars as pl

from refinery.stages.base import Stage, StageOutput, StageStats, skips
from orchestration.resources import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, batch_shards, documents_key, rejects_key, stats_key
from refinery.storage import DataRoot

SAMPLE_ROWS = 3
SAMPLE_CHARS = 160


def code_version(*objs: Any) -> str:
    """A short hash of the sources of the modules that define `objs` (modules, classes, functions),
    in order: changes when the logic does. One object's hash is its module's source's alone."""
    modules = [o if inspect.ismodule(o) else sys.modules[o.__module__] for o in objs]
    return hashlib.sha256("\n".join(inspect.getsource(m) for m in modules).encode()).hexdigest()[:12]


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
    """Write documents, rejects and stats for one input file; return content hashes by key."""
    hashes = {
        documents_key(stage, partition): root.write_parquet(documents_key(stage, partition), out.documents),
        rejects_key(stage, partition): root.write_parquet(rejects_key(stage, partition), out.rejects),
    }
    root.write_json(stats_key(stage, partition), out.stats.to_dict())
    return hashes


# Builds the stage for one source's files (built once per source and fan-out worker).
StageBuilder = Callable[[RefineryConfig, str], Stage]


def run_stage(stage: Stage, cfg: RefineryConfig, shard: InputShard, docs: pl.DataFrame) -> StageOutput:
    """One shard through one stage, with the config's per-record time budget and the shard's
    source's `skip:` list applied."""
    stage.record_timeout_s = cfg.stages.record_timeout_s
    return stage.run_for_source(docs, cfg.source(shard.source).skip)


def stage_config_summary(stage: Stage, cfg: RefineryConfig, shard: InputShard) -> dict[str, Any]:
    skipped = skips(cfg.source(shard.source).skip, stage.skip_key)
    return {"skipped_by_source": shard.source} if skipped else stage.config_summary()


# ---- fan-out over the files of a partition ---------------------------------------------------------


@dataclass
class FileResult:
    """What one input file's step returns to the asset: its stats, the hashes of what it wrote, the
    settings it ran with and a few sample rows (never the whole table, which stays in the data root)."""

    shard: str
    source: str
    stats: StageStats
    hashes: dict[str, str]
    settings: dict[str, Any]
    sample: pl.DataFrame | None = None


# A file's step: (resource, file, cache) -> its result (a FileResult for the funnel stages). The
# cache lives as long as the fan-out and holds what is expensive to build once per source (a stage
# with its model). A module-level function (or a partial of one) so a worker process can unpickle it.
T = TypeVar("T")
FileTask = Callable[[RefineryResource, InputShard, dict], T]

_worker: dict[str, Any] = {}  # in a pool worker process: its resource and cache


def _init_worker(config_path: str) -> None:
    from orchestration.resources import build_resources

    _worker["refinery"] = build_resources(config_path)["refinery"]
    _worker["cache"] = {}


def _run_in_worker(task: FileTask[T], shard: InputShard) -> T:
    return task(_worker["refinery"], shard, _worker["cache"])


def map_files(refinery: RefineryResource, shards: list[InputShard], task: FileTask[T]) -> list[T]:
    """Run `task` on every file, in `partitions.workers` processes (in this one when 1), and return
    the results in file order whatever order the workers finish in."""
    workers = min(refinery.config.partitions.workers, len(shards))
    if workers <= 1:
        cache: dict = {}
        return [task(refinery, shard, cache) for shard in shards]
    # spawn, not fork: the run's process has Dagster's threads, which a fork would copy mid-lock.
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(refinery.config_path,)) as pool:
        return list(pool.map(partial(_run_in_worker, task), shards))


def merged_stats(stage: str, results: list[FileResult]) -> StageStats:
    return sum((r.stats for r in results), StageStats(stage=stage))


def batch_metadata(stage: str, results: list[FileResult], version: str, text_column: str = "text") -> dict[str, Any]:
    """Provenance of a run over one or more batches: the files' stats merged, every hash, the
    settings (one dict, or one per source when the sources' differ) and the first files' samples."""
    settings = {r.source: r.settings for r in results}
    distinct = {json.dumps(v, sort_keys=True) for v in settings.values()}
    config = next(iter(settings.values())) if len(distinct) == 1 else {"by_source": settings}
    samples = [r.sample for r in results if r.sample is not None and r.sample.height]
    sample = pl.concat(samples, how="diagonal_relaxed").head(SAMPLE_ROWS) if samples else None
    hashes = {k: v for r in results for k, v in r.hashes.items()}
    md = provenance_metadata(merged_stats(stage, results), config, version, hashes, sample, text_column)
    md["input_files"] = dg.MetadataValue.int(len(results))
    return md


def run_stage_on_file(name: str, upstream: str, build: StageBuilder, refinery: RefineryResource,
                      shard: InputShard, cache: dict) -> FileResult:
    """One file through one stage: `upstream`'s table in, `name`'s documents, rejects and stats out."""
    cfg, root = refinery.config, refinery.root
    docs = root.read_parquet(documents_key(upstream, shard.key))
    if (name, shard.source) not in cache:
        cache[name, shard.source] = build(cfg, shard.source)
    stage = cache[name, shard.source]
    out = run_stage(stage, cfg, shard, docs)
    hashes = publish_stage_output(root, name, shard.key, out)
    return FileResult(shard.key, shard.source, out.stats, hashes, stage_config_summary(stage, cfg, shard),
                      out.documents.head(SAMPLE_ROWS))


def image_markdown(png: bytes, alt: str, caption: str) -> dg.MetadataValue:
    """A PNG shown inline on the asset's metadata page (a data URI in markdown), with a caption."""
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})\n\n{caption}")


def eager_after(dep: str) -> dg.AutomationCondition:
    """Dagster's `eager`, triggered only by `dep` updating. For an asset whose other dependencies
    reach `dep` first (through steps over other partitions, which cannot share their run): on their
    update alone it would run on `dep`'s old output, then again once `dep` updates."""
    cond = dg.AutomationCondition
    updated = cond.any_deps_updated().allow(dg.AssetSelection.assets(dep))
    return (cond.in_latest_time_window() & updated.since_last_handled() & ~cond.any_deps_missing()
            & ~cond.any_deps_in_progress() & ~cond.in_progress()).with_label(f"eager after {dep}")


def phase_check_spec(name: str, asset: str, phases: dg.PartitionsDefinition, description: str) -> dg.AssetCheckSpec:
    """A blocking check on a per-phase asset, partitioned like it, so each evaluation records the
    phase it judged (without `partitions_def` Dagster stores the evaluation with no partition)."""
    with warnings.catch_warnings():  # Dagster 1.13 marks partitioned check specs preview
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.AssetCheckSpec(name, asset=asset, blocking=True, partitions_def=phases, description=description)


def phase_check_result(name: str, phase: str, passed: bool, verdict: str, metadata: dict[str, Any]) -> dg.AssetCheckResult:
    """The check's verdict on one phase, named in its description and metadata."""
    return dg.AssetCheckResult(
        check_name=name, passed=passed, metadata={"phase": dg.MetadataValue.text(phase), **metadata},
        description=f"phase {phase}: {verdict}",
    )


def batch_stage_asset(
    name: str,
    upstream: str,
    build: StageBuilder,
    partitions_def: dg.PartitionsDefinition,
    backfill_policy: dg.BackfillPolicy,
    description: str,
    version: str,
    group: str = "funnel",
    kinds: set[str] | None = None,
    extra_metadata: Callable[[DataRoot, list[str]], dict[str, Any]] | None = None,
) -> dg.AssetsDefinition:
    """A per-document stage over input batches: for every file of the run's batches, `upstream`'s
    table in, `name`'s table out, fanned out over `partitions.workers`. One run may cover many
    batches (`backfill_policy`). `extra_metadata(root, file keys)` adds entries once
    every file is published. `build(cfg, source)` returns the
    stage for a source's files; a source whose `skip:` names the stage's `skip_key` gets the stage's
    `skipped` output. `version` is the asset's code version: `code_version` of the modules it runs."""

    @dg.asset(
        name=name,
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep(upstream)],
        partitions_def=partitions_def,
        backfill_policy=backfill_policy,
        group_name=group,
        description=description,
        code_version=version,
        kinds=kinds or {"polars", "parquet"},
    )
    def _stage_asset(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        shards = batch_shards(refinery.config, context.partition_keys)
        results = map_files(refinery, shards, partial(run_stage_on_file, name, upstream, build))
        stats = merged_stats(name, results)
        context.log.info(
            f"{name}: {len(context.partition_keys)} batch(es), {len(shards)} file(s), {stats.docs_in} -> "
            f"{stats.docs_out} docs ({stats.retention:.1%}) in {stats.wall_s:.2f}s of stage time"
        )
        metadata = batch_metadata(name, results, version)
        if extra_metadata is not None:
            metadata.update(extra_metadata(refinery.root, [r.shard for r in results]))
        return dg.MaterializeResult(metadata=metadata)

    return _stage_asset
