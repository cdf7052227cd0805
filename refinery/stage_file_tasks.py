"""The per-file tasks of the per-document stages (ingest, the funnel's pure stages, quality and
tokenize): one input file read, run through its stage a record batch at a time, and its tables
written, taking the run (`refinery.run_context.Run`) as plain values. The assets in assets/ say
which task a step runs; a pool or Ray worker runs it with only the library imported (issue 50).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Optional

import polars as pl

from refinery.documents import CLEAN_STAGE, InputShard
from refinery.fanout import FileResult, FileTask, built_stage, run_stage, stage_config_summary
from refinery.global_steps import tokenize as tk
from refinery.layout import rejects_key, stats_key
from refinery.models import difficulty_published as dpub
from refinery.models import quality as q
from refinery.run_context import Run
from refinery.stage_recipes import build_stage
from refinery.stages import ingest, registry
from refinery.stages.attributes import stage_batches
from refinery.stages.base import Stage, StageOutput, skips
from refinery.stages.parquet_batches import bounded_batches
from refinery.stages.stage_tables import SAMPLE_ROWS, stage_tables
from refinery.stages.stats import StageStats


def stream_stage_file(name: str, upstream: str, refinery: Run, shard: InputShard,
                      run: Callable[[pl.DataFrame], StageOutput], settings: dict[str, Any]) -> FileResult:
    """One file through one per-document stage, a record batch at a time: `upstream`'s kept
    documents read in slices of at most `extract.batch_rows` rows and `extract.batch_bytes` bytes
    (`stage_batches`: through the attribute tables when upstream stores no text), each slice through
    `run` and its kept documents (or attributes) and rejects written as row groups, the stats
    merged. A file's memory is one slice's, whatever its size."""
    cfg, root = refinery.config, refinery.root
    extract = cfg.stages.extract
    stats: Optional[StageStats] = None
    batches = stage_batches(root, upstream, shard.key, extract.batch_rows, max_bytes=extract.batch_bytes)  # raises before anything is written
    with stage_tables(root, name, shard.key) as tables:
        def one(batch: pl.DataFrame) -> None:
            nonlocal stats
            out = run(batch)
            # One batch's stats as they are (a sum would drop counters of zero).
            stats = out.stats if stats is None else stats + out.stats
            tables.write_documents(out.documents, batch)
            tables.write_rejects(out.rejects)

        if upstream == ingest.STAGE:  # provenance without the payload: read it again from the input file
            source = cfg.source(shard.source)
            # Each batch as read is one row group of the table it was not stored in: cut as a read of
            # that row group would be (`stage_batches`), so the stage sees the same batches.
            ingest.reread_documents(shard, source, extract, batches, lambda frame: [
                one(batch) for batch in (bounded_batches(frame, extract.batch_rows, extract.batch_bytes)
                                         if frame.height else [frame])], cfg.stages.record_timeout_s)
        else:
            for batch in batches:
                one(batch)
    root.write_json(stats_key(name, shard.key), stats.to_dict())
    return FileResult(shard.key, shard.source, stats, tables.hashes(), settings, tables.sample)


def run_stage_by_batches(name: str, upstream: str, refinery: Run, shard: InputShard, cache: dict) -> FileResult:
    """`stream_stage_file` with stage `name` as its recipe builds it (refinery/stage_recipes.py;
    built once per source in a worker, `built_stage`), its source's `skip:` and record time budget
    applied."""
    cfg = refinery.config
    stage = built_stage(cfg, name, shard.source, partial(build_stage, name, root=refinery.root))
    return stream_stage_file(name, upstream, refinery, shard, partial(run_stage, stage, cfg, shard),
                             stage_config_summary(stage, cfg, shard))


def stage_file_task(name: str, upstream: str) -> FileTask:
    """The file task of a per-document stage that reads nothing the run publishes: `upstream`'s
    kept documents in, `name`'s out, a record batch at a time."""
    return partial(run_stage_by_batches, name, upstream)


def built_in_block(name: str, refinery: Run, shard: InputShard, cache: dict) -> Stage:
    """Stage `name` for the file's source, built once per source in one block of tasks (`cache`),
    its builds sharing what they load: a stage that reads a model the run published, which a later
    run may have replaced, is not kept from one step to the next."""
    key = ("stage", name, shard.source)
    if key not in cache:
        cache[key] = build_stage(name, refinery.config, shard.source, refinery.root, shared=cache)
    return cache[key]


def ingest_file(refinery: Run, shard: InputShard, cache: dict) -> FileResult:
    """One input file read into raw_documents, with its ingest rejects and stats, written batch by
    batch (each batch a row group), so no file is ever whole in memory."""
    cfg = refinery.config
    source = cfg.source(shard.source)
    read: list[pl.DataFrame] = []  # the first batch as read, payload included: the asset's sample

    def write_documents(frame: pl.DataFrame) -> None:
        if not read or not read[0].height:
            read[:] = [frame.head(SAMPLE_ROWS)]
        tables.write_documents(frame.drop(ingest.PAYLOAD))

    with stage_tables(refinery.root, ingest.STAGE, shard.key, ingest.STORED_SCHEMA) as tables:
        stats = ingest.stream_input_shard(shard, source, cfg.stages.extract, write_documents,
                                          tables.write_rejects, cfg.stages.record_timeout_s)
    refinery.root.write_json(stats_key(ingest.STAGE, shard.key), stats.to_dict())
    settings = {"source": source.model_dump(mode="json"), "extract": cfg.stages.extract.model_dump(mode="json")}
    sample = read[0] if read else pl.DataFrame(schema=ingest.RAW_SCHEMA)
    return FileResult(shard.key, shard.source, stats, tables.hashes(), settings, sample)


UPSTREAM = registry.funnel_stage(q.QualityScorer.name).upstream


def score_file(refinery: Run, shard: InputShard, cache: dict) -> FileResult:
    """One file's deduped documents scored (and, unless its source skips quality, thresholded), a
    record batch at a time (`stream_stage_file`)."""
    cfg = refinery.config
    stage = built_in_block(q.QualityScorer.name, refinery, shard, cache)
    settings = stage.config_summary()
    if cfg.stages.quality.enabled:
        settings["threshold_enforced"] = not skips(cfg.source(shard.source).skip, stage.skip_key)
    return stream_stage_file(q.QualityScorer.name, UPSTREAM, refinery, shard, partial(run_stage, stage, cfg, shard),
                             settings)


PII_STAGE = CLEAN_STAGE


def redact_file(refinery: Run, shard: InputShard, cache: dict) -> FileResult:
    """One file's scored documents through the safety filter and redaction, re-scored with the
    model quality_scored used where redaction changed their text, a record batch at a time."""
    cfg = refinery.config
    stage = built_in_block(PII_STAGE, refinery, shard, cache)
    return stream_stage_file(PII_STAGE, registry.funnel_stage(PII_STAGE).upstream, refinery, shard,
                             partial(run_stage, stage, cfg, shard), stage_config_summary(stage, cfg, shard))


TOKENIZE_STAGE = "tokenized_shards"


def shard_hashes(index: dict) -> dict[str, str]:
    hashes = {ref["prefix"] + suffix: digest for ref in index["shards"] for suffix, digest in ref["sha256"].items()}
    hashes[index["entries_table"]["key"]] = index["entries_table"]["sha256"]
    return hashes


def tokenize_file(refinery: Run, shard: InputShard, cache: dict) -> FileResult:
    """One input file's clean documents into its token series (each document scored for
    difficulty when that is enabled), with its rejects and stats."""
    cfg, root = refinery.config, refinery.root
    if "tokenizer" not in cache:  # loaded once per fan-out worker
        cache["tokenizer"] = tk.read_tokenizer(root, cfg.tokenizer.eod_token)
        cache["reference"] = dpub.load_published_model(root) if cfg.stages.difficulty.enabled else None
    result = tk.tokenize_file(root, cfg, shard, cache["tokenizer"], reference=cache["reference"])
    key = rejects_key(TOKENIZE_STAGE, shard.key)
    hashes = {key: root.write_parquet(key, result.rejects), **shard_hashes(result.index)}
    root.write_json(stats_key(TOKENIZE_STAGE, shard.key), result.stats.to_dict())
    index = result.index
    settings = {"window": index["window"], "overlap": index["overlap"], "shard_tokens": cfg.shards.shard_tokens,
                "encode_batch_docs": cfg.shards.encode_batch_docs, "vocab_size": index["vocab_size"]}
    if "difficulty_model_sha256" in index:  # scored for difficulty
        settings["difficulty_model_sha256"] = index["difficulty_model_sha256"]
    return FileResult(shard.key, shard.source, result.stats, hashes, settings)
