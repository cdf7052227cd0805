"""`tokenizer` (global), `difficulty_model` (global, with stages.difficulty.enabled), `tokenized_shards`
(per input batch, one token series per file), `shuffled_shards` (per bucket, its step fanned out as a
task per input file and per key range, then the bucket's token series dropped: refinery/dropped.py), `lineage_index` (global, fanned out as a task per input file
and per final shard).

Thin wrappers: the work is in `refinery.global_steps.tokenize`, `refinery.global_steps.shuffle`,
`refinery.models.difficulty` and `refinery.lineage_index`. Tokenization is a per-batch stage like the
funnel's (fanned out over the batch's files and `partitions.workers`); each bucket's shuffle reads the
series of the files routed to it (a static partition mapping from input batch to bucket). The
shuffle's and the lineage index's tasks run in the same pool of `partitions.workers` processes
(`refinery.fanout.task_pool`).
"""

from collections import Counter

import dagster as dg

from refinery import layout
from assets.factory import StepResult, batch_stage_asset, eager_after, global_step_asset, report_dropped
from refinery.fanout import FileResult, task_pool
from assets.partitions import Partitions
from assets.provenance import Provenance, code_version
from assets.resource import RefineryResource
from refinery import lineage_index as lin
from refinery.config import RefineryConfig
from refinery.dropped import batch_of, drop_token_series
from refinery.documents import CLEAN_STAGE, InputShard, input_batches
from refinery.models import difficulty as dfc
from refinery.models import difficulty_published as dpub
from refinery.global_steps import shuffle as sh
from refinery.global_steps import tokenize as tk
from refinery.stage_file_tasks import TOKENIZE_STAGE, shard_hashes, tokenize_file
from refinery.storage import LocalDataRoot
from refinery import tokenizer_file

GROUP = "tokens"



def _shard_metadata(index: dict) -> dict:
    return {
        "tokens": dg.MetadataValue.int(index["tokens"]),
        "entries": dg.MetadataValue.int(index["entries"]),
        "documents": dg.MetadataValue.int(index["documents"]),
        "shards": dg.MetadataValue.int(len(index["shards"])),
        "dtype": dg.MetadataValue.text(index["dtype"]),
    }


def _tokens_per_s(tokens: int, wall_s: float) -> dg.MetadataValue:
    return dg.MetadataValue.float(round(tokens / wall_s, 1) if wall_s else 0.0)


def build_tokenizer(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg = refinery.config
        info = tk.build_tokenizer(refinery.root, cfg).info
        context.log.info(f"tokenizer: {info['source']}, vocab {info['vocab_size']}, sha256 {info['sha256'][:12]}")
        sample = info.get("sample", {})
        return StepResult(
            Provenance(version, {**cfg.tokenizer.model_dump(mode="json"), "seed": cfg.seed},
                       {layout.TOKENIZER_KEY: info["sha256"]}, wall_s=info["wall_s"],
                       docs_in=sample.get("docs", 0), bytes_in=sample.get("bytes", 0)),
            {
                "vocab_size": dg.MetadataValue.int(info["vocab_size"]),
                "eod_id": dg.MetadataValue.int(info["eod_id"]),
                "eod_token": dg.MetadataValue.text(info["eod_token"]),
                "dtype": dg.MetadataValue.text(info["dtype"]),
                "source": dg.MetadataValue.text("trained" if info["source"] == "trained" else
                                                f"reused pinned {info['path']}" if info["source"] == "pinned"
                                                else info["path"]),
                "train_docs": dg.MetadataValue.int(sample.get("docs", 0)),
                "train_bytes": dg.MetadataValue.int(sample.get("bytes", 0)),
                "train_shards": dg.MetadataValue.json(sample.get("shards", {})),
            },
        )
    return step


def build_difficulty_model(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root = refinery.config, refinery.root
        built = dpub.build_reference_model(root, cfg, tk.read_tokenizer(root, cfg.tokenizer.eod_token))
        model = built.model
        context.log.info(f"difficulty_model: {model.order}-gram over {model.tokens} tokens ({built.source}), "
                         f"sha256 {built.sha256[:12]}")
        return StepResult(
            Provenance(version, dpub.difficulty_settings(cfg), {layout.DIFFICULTY_MODEL_KEY: built.sha256},
                       wall_s=built.wall_s),
            {
                "source": dg.MetadataValue.text(built.source),
                "tokens_trained_on": dg.MetadataValue.int(model.tokens),
                "distinct_ngrams": dg.MetadataValue.json({f"order_{k + 1}": n
                                                          for k, n in enumerate(model.distinct_ngrams())}),
                "model_bytes": dg.MetadataValue.int(root.local_path(layout.DIFFICULTY_MODEL_KEY).stat().st_size),
                "model_sha256": dg.MetadataValue.text(built.sha256),
            },
        )
    return step



def token_metadata(refinery: RefineryResource, shards: list[InputShard], results: list[FileResult]) -> dict:
    """Tokens, entries and shards written by a run's files, and its tokens per second of stage time."""
    counters = sum((r.stats.counters for r in results), Counter())
    wall_s = sum(r.stats.wall_s for r in results)
    return {
        "tokens": dg.MetadataValue.int(counters["tokens"]),
        "entries": dg.MetadataValue.int(counters["entries"]),
        "shards": dg.MetadataValue.int(counters["shards"]),
        "windowed_docs": dg.MetadataValue.int(counters["windowed_docs"]),
        "tokens_per_s": _tokens_per_s(counters["tokens"], wall_s),
    }


def shuffle_bucket(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root, bucket = refinery.config, refinery.root, context.partition_key
        parts = [shard.key for shard in tk.bucket_shards(cfg, bucket)]
        fields = tk.series_fields(cfg, tk.read_tokenizer(root, cfg.tokenizer.eod_token))
        # The scatter and gather tasks meet in a staging folder: inside a local data root (a mount
        # every node shares), else in this machine's temp folder, where only tasks on it can reach.
        with task_pool(refinery, on_this_machine=not isinstance(root, LocalDataRoot)) as run_tasks:
            result = sh.shuffle_bucket(root, cfg.seed, bucket, parts, fields, cfg.shards.shard_tokens,
                                       cfg.shards.shuffle_buffer_mb, run_tasks=run_tasks)
        index = result.index
        context.log.info(f"shuffled_shards[{bucket}]: {index['entries']} entries through {result.runs} key ranges, "
                         f"{result.tasks} tasks on {cfg.partitions.workers} workers, in {result.wall_s:.2f}s")
        # The final shards hold every token of the series now: they are read by nothing else.
        dropped = drop_token_series(root, cfg, bucket, parts)
        report_dropped(context, TOKENIZE_STAGE, batch_of(cfg), dropped.parts,
                       f"its token series was dropped once shuffled_shards[{bucket}] published")
        config = {"seed": cfg.seed, "shard_tokens": cfg.shards.shard_tokens,
                  "shuffle_buffer_mb": cfg.shards.shuffle_buffer_mb}
        return StepResult(
            Provenance(version, config, shard_hashes(index), wall_s=result.wall_s,
                       docs_in=index["documents"], docs_out=index["documents"]),
            {
                **_shard_metadata(index),
                "runs": dg.MetadataValue.int(result.runs),
                "tasks": dg.MetadataValue.int(result.tasks),
                "tokens_per_s": _tokens_per_s(index["tokens"], result.wall_s),
                "difficulty": dg.MetadataValue.json(sh.bucket_difficulty(root, bucket)),
                "index": dg.MetadataValue.path(root.display(layout.shard_index_key(tk.FINAL, bucket))),
                **{k: dg.MetadataValue.int(v) for k, v in dropped.metadata().items()},
            },
        )
    return step


def index_lineage(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg = refinery.config
        with task_pool(refinery) as run_tasks:
            index = lin.build_lineage_index(refinery.root, cfg, log=context.log.info, run_tasks=run_tasks)
        context.log.info(f"lineage_index: {index['documents']} documents in {index['documents_parts']} parts, "
                         f"{index['final_shards_verified']} final shards verified and indexed, {index['tasks']} tasks "
                         f"on {cfg.partitions.workers} workers")
        return StepResult(
            Provenance(version, {"buckets": list(cfg.buckets)}, {layout.LINEAGE_INDEX_KEY: index["sha256"]},
                       wall_s=index["wall_s"], docs_in=index["documents"], docs_out=index["documents"]),
            {
                "documents": dg.MetadataValue.int(index["documents"]),
                "documents_parts": dg.MetadataValue.int(index["documents_parts"]),
                "tasks": dg.MetadataValue.int(index["tasks"]),
                "columns": dg.MetadataValue.json(index["columns"]),
                "final_shards_verified": dg.MetadataValue.int(index["final_shards_verified"]),
                "buckets": dg.MetadataValue.json(index["buckets"]),
            },
        )
    return step


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    # A batch holds one source's files, so it feeds one bucket; dynamic batches are unknown here.
    to_bucket = {} if cfg.partitions.dynamic else {b.key: cfg.source(b.source).bucket for b in input_batches(cfg)}
    tokenized_by_bucket = dg.AssetDep(
        TOKENIZE_STAGE,
        partition_mapping=dg.StaticPartitionMapping(to_bucket) if to_bucket else dg.AllPartitionMapping(),
    )
    every = dg.AllPartitionMapping()
    tokenize_version = code_version(tk, tokenizer_file, dfc, dpub)
    difficulty = cfg.stages.difficulty.enabled
    shuffle_version, lineage_version = code_version(sh), code_version(lin)
    difficulty_model = [global_step_asset(
        "difficulty_model", build_difficulty_model(tokenize_version), version=tokenize_version, group=GROUP,
        kinds={"numpy"}, automation_condition=dg.AutomationCondition.on_missing(),
        deps=[dg.AssetDep("tokenizer"), dg.AssetDep(CLEAN_STAGE, partition_mapping=every)],
        description="The difficulty score's reference model: an interpolated absolute-discounting token n-gram "
        "model trained on the reference buckets' clean documents (at most stages.difficulty.max_train_tokens "
        "tokens), or stages.difficulty.model_path; written to models/difficulty/reference.npz.",
    )] if difficulty else []
    return dg.Definitions(assets=[
        *difficulty_model,
        global_step_asset(
            "tokenizer", build_tokenizer(tokenize_version), version=tokenize_version, group=GROUP,
            kinds={"tokenizers"}, automation_condition=dg.AutomationCondition.on_missing(),
            deps=[dg.AssetDep(CLEAN_STAGE, partition_mapping=every)],
            description="Byte-level BPE trained on a seeded sample of the clean corpus, or tokenizer.path loaded; "
            "written to tokenizer/tokenizer.json.",
        ),
        batch_stage_asset(
            TOKENIZE_STAGE, tokenize_file, parts, group=GROUP, version=tokenize_version, kinds={"numpy"},
            deps=[dg.AssetDep("tokenizer"), dg.AssetDep(CLEAN_STAGE),
                  *([dg.AssetDep("difficulty_model")] if difficulty else [])],
            documents_out=False, extra_metadata=token_metadata,
            description="Each input file's clean documents encoded in batches, EOD appended, windowed at the packing "
            "window with overlap, packed into shards/tokenized/<bucket>/<file>/ (.bin/.idx/.entries.parquet) plus "
            "entries.parquet and index.json: one series per file, fanned out like the funnel; each document's "
            "difficulty (stages.difficulty) beside its quality_score. Its bucket's shuffle drops the series once the "
            "final shards are published (index.json stays; docs/formats.md, \"Dropped stores\").",
        ),
        global_step_asset(
            "shuffled_shards", shuffle_bucket(shuffle_version), version=shuffle_version, group=GROUP,
            kinds={"numpy"}, automation_condition=dg.AutomationCondition.eager(), partitions_def=parts.buckets,
            deps=[tokenized_by_bucket],
            description="Seeded shuffle of the bucket's entries (never tokens) in bounded memory, as parallel tasks: a "
            "scatter per input file's token series into key ranges, a gather per key range into its shards, then "
            "the shards numbered in key order into shards/final/<bucket>/ with sha256 of every file in index.json; "
            "then the bucket's token series, read by nothing else, are dropped (dropped_bytes).",
        ),
        global_step_asset(
            "lineage_index", index_lineage(lineage_version), version=lineage_version, group=GROUP,
            kinds={"parquet"}, automation_condition=eager_after("shuffled_shards"),
            deps=[dg.AssetDep("shuffled_shards", partition_mapping=every),
                  dg.AssetDep(CLEAN_STAGE, partition_mapping=every)],
            description="lineage/documents/<input>.arrow (each input file's clean documents without text), "
            "lineage/final/<bucket>/shard-N.rows (each final shard's entries with their documents) and "
            "lineage/index.json: answers `refinery lineage --shard S --offset N` reading one row.",
        ),
    ])
