"""Global exact and near dedup, scaled out by hash range and LSH band.

    heuristic_filtered[batch] -> dedup_signatures[batch]          hash, band hashes, bottom-k sketch per doc
    dedup_signatures[*]       -> exact_deduped[hash range]        drop list of the range
    dedup_signatures[*], exact_deduped[*] -> near_deduped[band]   verified candidate edges of the band
    near_deduped[*]           -> near_dup_clusters                union-find over the edges; drops the sketches
    heuristic_filtered[batch], exact_deduped[*], near_dup_clusters -> deduped[batch]

No step holds every document: the range and band steps read only small per-document columns
(doc_key and a hash) of every shard, the cluster step reads only edges, and the shard steps read
their own shard. The steps are `refinery.global_steps.dedup_compute`; files live under `dedup/` in the
data root (see docs/dedup.md).
"""

import sys
from collections import Counter
from typing import Any

import dagster as dg

from assets.factory import StepResult, batch_stage_asset, eager_after, global_step_asset, report_dropped
from refinery.fanout import FileResult, map_tasks
from assets.partitions import Partitions
from assets.provenance import Provenance, code_version, combined_version, stage_code_version
from assets.resource import RefineryResource
from refinery.config import RefineryConfig
from refinery.dropped import batch_of, drop_sketches
from refinery.documents import InputShard
from refinery.global_steps import dedup_compute as dc
from refinery.global_steps import exact_dedup as ex
from refinery.global_steps import minhash as mh
from refinery.global_steps import near_dedup as nd
from refinery.global_steps.dedup_compute import STAGE, UPSTREAM
from refinery.layout import NEAR_CLUSTERS_KEY, exact_drops_key, near_edges_key
from refinery import dedup_tasks
from refinery.dedup_tasks import band_task, clusters_task, dedup_file, dedup_settings, exact_range_task, signatures_of_file


def _dedup_code_version() -> str:
    """Changes when any module that shapes dedup outputs does."""
    return stage_code_version(dc.STAGE, combined_version(*(code_version(m) for m in (ex, nd, mh, dc, dedup_tasks,
                                                                                       sys.modules[__name__]))))



# dedup_signatures' metadata entry of each batch's files' shard ordinals, which every doc_key holds:
# `refinery demo --changed` plans a batch again when an input added or removed before its files
# moves them (orchestration/changed.py).
SHARD_ORDINALS = "shard_ordinals"


def signature_counts(refinery: RefineryResource, shards: list[InputShard], results: list[FileResult]) -> dict:
    ordinals = dc.shard_ordinals(refinery.config)
    return {"docs": dg.MetadataValue.int(sum(r.stats.docs_in for r in results)),
            "near_dedup_docs": dg.MetadataValue.int(sum(r.stats.counters["near_dedup_docs"] for r in results)),
            SHARD_ORDINALS: dg.MetadataValue.json({s.key: ordinals[s.key] for s in shards})}


def _ints(counts: dict[str, Any]) -> dict[str, dg.MetadataValue]:
    return {k: dg.MetadataValue.int(int(v)) for k, v in counts.items()}



# The range, band and cluster steps run their partitions as tasks (`map_tasks`): in this process,
# over `partitions.workers`, or on the Ray cluster under `execution.engine: ray`.


def exact_ranges(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        counts, hashes = Counter(), {}
        keys = list(context.partition_keys)
        for hash_range, (range_counts, digest) in zip(keys, map_tasks(refinery, keys, exact_range_task)):
            counts.update(range_counts)
            hashes[exact_drops_key(hash_range)] = digest
        docs = counts["docs_in_range"]
        return StepResult(Provenance(version, dedup_settings(refinery.config), hashes, docs_in=docs,
                                     docs_out=docs - counts["duplicates_dropped"]), _ints(counts))
    return step


def near_bands(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        counts, hashes = Counter(), {}
        keys = list(context.partition_keys)
        for band, (band_counts, digest) in zip(keys, map_tasks(refinery, keys, band_task)):
            counts.update(band_counts)
            hashes[near_edges_key(band)] = digest
        return StepResult(Provenance(version, dedup_settings(refinery.config), hashes, docs_in=counts["docs"]),
                          _ints(counts))
    return step


def clusters(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        [(summary, digest)] = map_tasks(refinery, [None], clusters_task)
        sizes = summary.pop("cluster_sizes")
        # Every band's edges are joined: the sketches they were verified with are read by nothing else.
        dropped = drop_sketches(refinery.root, refinery.config)
        report_dropped(context, "dedup_signatures", batch_of(refinery.config), dropped.parts,
                       "its bottom-k sketches were dropped once near_dup_clusters joined every band's edges")
        return StepResult(
            Provenance(version, dedup_settings(refinery.config), {NEAR_CLUSTERS_KEY: digest},
                       docs_in=summary["members"], docs_out=summary["clusters"]),
            {**_ints(summary), "cluster_sizes": dg.MetadataValue.json(sizes), **_ints(dropped.metadata())},
        )
    return step


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    version = _dedup_code_version()
    settings = nd.DedupSettings.from_config(cfg)
    ranges = dg.StaticPartitionsDefinition(ex.range_keys(settings.hash_ranges))
    bands = dg.StaticPartitionsDefinition(nd.band_keys(settings.bands))
    every = dg.AllPartitionMapping()

    dedup_signatures = batch_stage_asset(
        "dedup_signatures", signatures_of_file, parts, version=version, deps=[dg.AssetDep(UPSTREAM)],
        kinds={"numpy", "parquet"}, documents_out=False, extra_metadata=signature_counts,
        description="Per document: 128-bit normalized-text hash, LSH band hashes of its MinHash signature, and "
        "apart its bottom-k sketch (dropped by near_dup_clusters).",
    )
    exact_deduped = global_step_asset(
        "exact_deduped", exact_ranges(version), version=version, group="funnel", kinds={"polars", "parquet"},
        automation_condition=dg.AutomationCondition.eager(), partitions_def=ranges,
        backfill_policy=parts.split_backfill, deps=[dg.AssetDep("dedup_signatures", partition_mapping=every)],
        description="Exact duplicates of one hash range: every copy but the first in (source, file, record) order.",
    )
    near_deduped = global_step_asset(
        "near_deduped", near_bands(version), version=version, group="funnel", kinds={"numpy", "parquet"},
        automation_condition=eager_after("exact_deduped"), partitions_def=bands,
        backfill_policy=parts.split_backfill,
        deps=[dg.AssetDep("dedup_signatures", partition_mapping=every),
              dg.AssetDep("exact_deduped", partition_mapping=every)],
        description="MinHash LSH candidate pairs of one band, verified by signature similarity.",
    )
    near_dup_clusters = global_step_asset(
        "near_dup_clusters", clusters(version), version=version, group="funnel", kinds={"polars", "parquet"},
        automation_condition=dg.AutomationCondition.eager(),
        deps=[dg.AssetDep("near_deduped", partition_mapping=every)],
        description="Union-find over every band's edges; one keeper (smallest doc_key) per cluster. Then the "
        "bottom-k sketches, read by nothing else, are dropped (dropped_bytes).",
    )
    deduped = batch_stage_asset(
        STAGE, dedup_file, parts, version=version, automation_condition=eager_after("near_dup_clusters"),
        deps=[dg.AssetDep(UPSTREAM), dg.AssetDep("exact_deduped", partition_mapping=every),
              dg.AssetDep("near_dup_clusters")],
        description="heuristic_filtered minus exact and near duplicates, with dup_cluster and dup_cluster_size.",
    )
    return dg.Definitions(assets=[dedup_signatures, exact_deduped, near_deduped, near_dup_clusters, deduped])
