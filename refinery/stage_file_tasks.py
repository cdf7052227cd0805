"""The per-file tasks of the per-document stages (ingest, the funnel's pure stages, quality and
tokenize): one input file read, run through its stage a record batch at a time, and its tables
written, taking the run (`refinery.run_context.Run`) as plain values. The assets in assets/ say
which task a step runs; a pool or Ray worker runs it with only the library imported (issue 50).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Optional

import polars as pl

from refinery.config import RefineryConfig
from refinery.documents import InputShard
from refinery.fanout import FileResult, FileTask, StageBuilder, built_stage, run_stage, stage_config_summary
from refinery.global_steps import tokenize as tk
from refinery.layout import rejects_key, stats_key
from refinery.models import difficulty_published as dpub
from refinery.models import quality as q
from refinery.models import quality_training as qt
from refinery.run_context import Run
from refinery.stages import custom, extract, heuristic, ingest, language
from refinery.stages import pii as pii_stage
from refinery.stages import registry
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


def run_stage_by_batches(name: str, upstream: str, build: StageBuilder, refinery: Run,
                         shard: InputShard, cache: dict) -> FileResult:
    """`stream_stage_file` with the stage `build(cfg, source)` returns (built once per source in a
    worker, `built_stage`), its source's `skip:` and record time budget applied."""
    cfg = refinery.config
    stage = built_stage(cfg, name, shard.source, build)
    return stream_stage_file(name, upstream, refinery, shard, partial(run_stage, stage, cfg, shard),
                             stage_config_summary(stage, cfg, shard))


def stage_file_task(name: str, upstream: str, build: StageBuilder) -> FileTask:
    """The file task of a pure per-document stage: `upstream`'s kept documents in, `name`'s out, a
    record batch at a time (`build(cfg, source)` returns the stage for a source's files)."""
    return partial(run_stage_by_batches, name, upstream, build)


def build_extractor(cfg: RefineryConfig, source: str) -> extract.Extractor:
    return extract.Extractor(cfg.stages.extract)


def build_language(cfg: RefineryConfig, source: str) -> language.LanguageFilter:
    return language.LanguageFilter.from_config(cfg.stages.language, cfg.resolve)


def build_heuristic(cfg: RefineryConfig, source: str) -> Stage:
    return custom.with_custom_filters(heuristic.HeuristicFilter(cfg.stages.heuristic, cfg.source(source).rules_off), cfg)


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
    name = q.QualityScorer.name
    if not cfg.stages.quality.enabled:
        return stream_stage_file(name, UPSTREAM, refinery, shard, q.unscored, {"enabled": False})
    if "model" not in cache:
        cache["model"] = qt.load_published_model(refinery.root)
    model, pointer = cache["model"]
    stage = q.QualityScorer(model, cfg.stages.quality.threshold, model_id=pointer["model_hash"])
    enforce = not skips(cfg.source(shard.source).skip, stage.skip_key)
    settings = {**stage.config_summary(), "threshold_enforced": enforce}
    return stream_stage_file(name, UPSTREAM, refinery, shard, partial(run_stage, stage, cfg, shard), settings)


PII_STAGE = "pii_redacted"


def redact_file(refinery: Run, shard: InputShard, cache: dict) -> FileResult:
    """One file's scored documents through the safety filter and redaction, re-scored with the
    model quality_scored used where redaction changed their text, a record batch at a time."""
    cfg = refinery.config
    if "redactor" not in cache:
        rescore = qt.load_published_model(refinery.root)[0].score if cfg.stages.quality.enabled else None
        cache["redactor"] = pii_stage.SafetyThenRedact.from_config(cfg.stages, rescore)
    stage = cache["redactor"]
    return stream_stage_file(PII_STAGE, q.QualityScorer.name, refinery, shard, partial(run_stage, stage, cfg, shard),
                             stage_config_summary(stage, cfg, shard))


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
