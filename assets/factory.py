"""The two asset factories: per-batch stages and global steps. Every asset of the graph is made by one
of them, so every asset records the same provenance (assets/provenance.py).

- `batch_stage_asset`: partitioned by input batch. For every file of the run's batches it runs a
  file task (refinery/fanout.py), fanned out over `partitions.workers`, and merges the files' stats,
  hashes, settings and samples into one `MaterializeResult`. A per-document stage's file task
  (`stage_file_task`) reads its input and writes its output a record batch at a time.
- `global_step_asset`: everything else, whose partition is a hash range, an LSH band, a bucket, a
  curriculum phase, or nothing. Its step returns a `StepResult`: provenance, the metadata only that
  asset has, and the verdicts of its checks.

No `from __future__ import annotations` here: Dagster inspects the `context` annotation of the
asset functions defined below and rejects it as a string.
"""

import json
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

import dagster as dg
import polars as pl

from refinery.fanout import FileResult, FileTask, map_files
from assets.partitions import Partitions
from assets.provenance import (PROVENANCE_KEYS, SAMPLE_ROWS, Provenance, output_data_version, provenance_metadata,
                               stage_code_version)
from refinery.ray_engine import node_summary, recording_nodes
from assets.resource import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, batch_shards, input_batches
from refinery.layout import stats_key
from refinery.stages import registry
from refinery.stage_file_tasks import stage_file_task
from refinery.stages.stats import StageStats

DEFAULT_KINDS = frozenset({"polars", "parquet"})


def with_provenance(provenance: Provenance, metadata: dict[str, Any], first: bool = True) -> dict[str, Any]:
    """The shared provenance keys and an asset's own entries in one dict (provenance first, or last
    when `first` is false); an asset's entry may not reuse a provenance key."""
    clash = sorted(set(metadata) & set(PROVENANCE_KEYS))
    if clash:
        raise ValueError(f"asset metadata {clash} would replace the shared provenance keys")
    shared = provenance_metadata(provenance)
    return {**shared, **metadata} if first else {**metadata, **shared}


def versioned(context: dg.AssetExecutionContext, code: str) -> str:
    """The code version the asset runs under: its code's, with the digest of the config it reads
    when the definitions added it (orchestration/definitions.py, `config_versioned`)."""
    return context.assets_def.code_versions_by_key.get(context.asset_key) or code


def report_dropped(context: dg.AssetExecutionContext, asset: str, batches: dict[str, str], parts: list[str],
                   why: str) -> None:
    """An observation on each batch of `asset` whose files' store this step dropped (refinery/dropped.py),
    saying so: Dagster shows it beside the materialization whose files are gone, which a reader that
    needs them refuses in one line."""
    files: dict[str, list[str]] = {}
    for part in parts:
        files.setdefault(batches.get(part, part), []).append(part)
    for batch, named in sorted(files.items()):
        context.instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=asset, partition=batch, metadata={"dropped": dg.MetadataValue.text(f"{', '.join(named)}: {why}")}))


# ---- per-batch stages ------------------------------------------------------------------------------


def merged_stats(stage: str, results: list[FileResult]) -> StageStats:
    return sum((r.stats for r in results), StageStats(stage=stage))


def batch_provenance(stage: str, results: list[FileResult], version: str, text_column: str = "text",
                     documents_out: bool = True) -> Provenance:
    """Provenance of a run over one or more batches: the files' stats merged, every hash, the
    settings (one dict, or one per source when the sources' differ) and the first files' samples."""
    settings = {r.source: r.settings for r in results}
    distinct = {json.dumps(v, sort_keys=True) for v in settings.values()}
    config = next(iter(settings.values())) if len(distinct) == 1 else {"by_source": settings}
    samples = [r.sample for r in results if r.sample is not None and r.sample.height]
    sample = pl.concat(samples, how="diagonal_relaxed").head(SAMPLE_ROWS) if samples else pl.DataFrame()
    hashes = {k: v for r in results for k, v in r.hashes.items()}
    provenance = Provenance.of_stats(merged_stats(stage, results), config, version, hashes, sample, text_column)
    if not documents_out:
        provenance = replace(provenance, bytes_in=None, bytes_out=None, byte_retention=None, sample=None)
    return provenance



def pure_stage_asset(name: str, parts: Partitions, description: str, version: str,
                     **options: Any) -> dg.AssetsDefinition:
    """The asset of a pure per-document stage of the registry (refinery/stages/registry.py): its
    upstream's kept documents in, the stage its recipe builds over each file; `options` go to
    `batch_stage_asset`."""
    upstream = registry.funnel_stage(name).upstream
    return batch_stage_asset(name, stage_file_task(name, upstream), parts, description=description,
                             version=stage_code_version(name, version), deps=[dg.AssetDep(upstream)], **options)


# Entries an asset adds once every file is published: (resource, the run's files, their results).
ExtraMetadata = Callable[[RefineryResource, list[InputShard], list[FileResult]], dict[str, Any]]


def batch_stage_asset(
    name: str,
    file_task: FileTask,
    parts: Partitions,
    description: str,
    version: str,
    deps: list[dg.AssetDep],
    kinds: set[str] = DEFAULT_KINDS,
    automation_condition: dg.AutomationCondition = dg.AutomationCondition.eager(),
    text_column: str = "text",
    documents_out: bool = True,
    extra_metadata: Optional[ExtraMetadata] = None,
    check_input: Optional[Callable[[RefineryConfig], None]] = None,
    group: str = "funnel",
) -> dg.AssetsDefinition:
    """A per-document step over input batches: `file_task` on every file of the run's batches,
    fanned out over `partitions.workers`; one run may cover many batches (the batch backfill
    policy). `version` is the asset's code version: `code_version` of the modules it runs.
    `check_input(cfg)` may refuse the run before any file is read; `documents_out=False` (a step that
    writes no document table) records no bytes or sample rows."""

    @dg.asset(
        name=name,
        automation_condition=automation_condition,
        deps=deps,
        partitions_def=parts.input_batches,
        backfill_policy=parts.batch_backfill,
        group_name=group,
        description=description,
        code_version=version,
        kinds=set(kinds),
    )
    def _batch_asset(context: dg.AssetExecutionContext, refinery: RefineryResource) -> Iterator[dg.MaterializeResult]:
        if check_input is not None:
            check_input(refinery.config)
        shards = batch_shards(refinery.config, context.partition_keys)
        with recording_nodes() as nodes:
            results = map_files(refinery, shards, file_task)
        ran_on = dict(zip((s.key for s in shards), nodes))  # file -> Ray node (empty on the local engine)
        refinery.root.remove_leftover_temporaries(
            [k for r in results for k in r.hashes] + [stats_key(name, s.key) for s in shards])
        stats = merged_stats(name, results)
        context.log.info(
            f"{name}: {len(context.partition_keys)} batch(es), {len(shards)} file(s), {stats.docs_in} -> "
            f"{stats.docs_out} docs ({stats.retention:.1%}) in {stats.wall_s:.2f}s of stage time"
        )

        def metadata(files: list[InputShard], done: list[FileResult]) -> dict[str, Any]:
            extra = {"input_files": dg.MetadataValue.int(len(done))}
            if ran_on:
                extra["ray_nodes"] = dg.MetadataValue.json(node_summary([ran_on[f.key] for f in files]))
            if extra_metadata is not None:
                extra.update(extra_metadata(refinery, files, done))
            return with_provenance(batch_provenance(name, done, versioned(context, version), text_column, documents_out),
                                   extra)

        if len(context.partition_keys) == 1:
            version_of_output = output_data_version({k: v for r in results for k, v in r.hashes.items()})
            yield dg.MaterializeResult(metadata=metadata(shards, results),
                                       data_version=dg.DataVersion(version_of_output))
            return
        # A run over many batches: each batch's materialization carries its own files' numbers,
        # hashes and samples, not the run's, and its own data version (`with_partition_data_versions`).
        members = {batch.key: {shard.key for shard in batch.shards} for batch in input_batches(refinery.config)}
        versions = {}
        for key in context.partition_keys:
            own = [r for r in results if r.shard in members[key]]
            context.add_asset_metadata(metadata([s for s in shards if s.key in members[key]], own), partition_key=key)
            versions[key] = output_data_version({k: v for r in own for k, v in r.hashes.items()})
        yield dg.MaterializeResult()
        with_partition_data_versions(context, versions)

    return _batch_asset


def with_partition_data_versions(context: dg.AssetExecutionContext, versions: dict[str, str]) -> None:
    """Give each partition of a run over many its own data version (partition key -> version).

    Dagster 1.13 writes one data version for every partition of a ranged run (the version is a
    step's, not a partition's: dagster-io/dagster#18123), so a batch re-run alone would always look
    changed. Once the run's own materializations are stored, each partition's is recorded again
    with the same metadata and provenance (code version, input versions) and its own version in
    place of the run's; the stale status and the steps after it read that latest record."""
    from dagster._core.definitions.data_version import DATA_VERSION_IS_USER_PROVIDED_TAG, DATA_VERSION_TAG

    for key, version in versions.items():
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=context.asset_key, asset_partitions=[key]), limit=1).records
        recorded = records[0].asset_materialization
        tags = {**(recorded.tags or {}), DATA_VERSION_TAG: version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}
        context.log_event(dg.AssetMaterialization(asset_key=context.asset_key, partition=key,
                                                  metadata=recorded.metadata, tags=tags))


# ---- global steps ----------------------------------------------------------------------------------


@dataclass
class StepResult:
    """What a global step hands its asset: its provenance (a `wall_s` left None is the step's
    measured time), the metadata only this asset has, and its checks' verdicts."""

    provenance: Provenance
    metadata: dict[str, Any] = field(default_factory=dict)
    check_results: list[dg.AssetCheckResult] = field(default_factory=list)


Step = Callable[[dg.AssetExecutionContext, RefineryResource], StepResult]


def global_step_asset(
    name: str,
    step: Step,
    description: str,
    version: str,
    group: str,
    kinds: set[str],
    automation_condition: Optional[dg.AutomationCondition],
    deps: list[dg.AssetDep],
    partitions_def: Optional[dg.PartitionsDefinition] = None,
    backfill_policy: Optional[dg.BackfillPolicy] = None,
    check_specs: Optional[list[dg.AssetCheckSpec]] = None,
    pool: Optional[str] = None,
) -> dg.AssetsDefinition:
    """A step over the whole corpus or one key of a hash range, band, bucket or phase: `step` does
    the work through plain helpers and says what it made; the asset's own metadata comes first on
    its page, then the shared provenance."""

    @dg.asset(
        name=name,
        automation_condition=automation_condition,
        deps=deps,
        partitions_def=partitions_def,
        backfill_policy=backfill_policy,
        group_name=group,
        description=description,
        code_version=version,
        kinds=kinds,
        check_specs=check_specs,
        pool=pool,
    )
    def _step_asset(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        start = time.perf_counter()
        with recording_nodes() as nodes:
            result = step(context, refinery)
        if nodes:
            result.metadata["ray_nodes"] = dg.MetadataValue.json(node_summary(nodes))
        provenance = replace(result.provenance, code_version=versioned(context, result.provenance.code_version))
        refinery.root.remove_leftover_temporaries(provenance.content_hashes or {})
        if provenance.wall_s is None:
            provenance = replace(provenance, wall_s=time.perf_counter() - start)
        # The data version is the output's, so a rerun that writes the same bytes (a pinned
        # tokenizer, an unchanged manifest) marks nothing after it stale.
        version_of_output = output_data_version(provenance.content_hashes) if provenance.content_hashes else None
        return dg.MaterializeResult(metadata=with_provenance(provenance, result.metadata, first=False),
                                    check_results=result.check_results or None,
                                    data_version=dg.DataVersion(version_of_output) if version_of_output else None)

    return _step_asset


# ---- conditions and checks shared by the asset modules ---------------------------------------------


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


def phase_check_result(name: str, phase: str, passed: bool, verdict: str, metadata: dict[str, Any],
                       severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR) -> dg.AssetCheckResult:
    """The check's verdict on one phase, named in its description and metadata."""
    return dg.AssetCheckResult(
        check_name=name, passed=passed, metadata={"phase": dg.MetadataValue.text(phase), **metadata},
        description=f"phase {phase}: {verdict}", severity=severity,
    )
