"""The funnel's stored verdicts of one input file, read back without text: every rejection after
extracted_text, the language and quality_score the funnel recorded for each document, and a digest
that changes when a stage reruns. Memory: one file's rejects and facts (doc ids, no text)."""

from __future__ import annotations

import hashlib
from typing import Iterator

import polars as pl

from refinery.config import RefineryConfig
from refinery.documents import input_shards
from refinery.layout import rejects_key, signatures_key, stats_key
from refinery.stages.attributes import read_stage_documents
from refinery.stages.registry import STAGES, TEXT_STAGE
from refinery.storage import DataRoot

LANGUAGE_STAGE, QUALITY_STAGE = "language_filtered", "quality_scored"
# The stages after extracted_text, whose rejects a variant may let back in (funnel order).
VERDICT_TABLES = tuple(s.name for s in STAGES[[s.name for s in STAGES].index(TEXT_STAGE) + 1:])


def verdicts_digest(root: DataRoot, cfg: RefineryConfig, stages: tuple[str, ...]) -> str:
    """A digest of the stats files `stages` wrote for every input file: each rerun of a stage
    rewrites them (with its wall time), so a changed one means the verdicts may have changed."""
    h = hashlib.sha256()
    for stage in stages:
        for shard in input_shards(cfg):
            key = stats_key(stage, shard.key)
            if root.exists(key):
                h.update(f"{key}:{root.sha256(key)}\n".encode())
    return h.hexdigest()


def partition_rejects(root: DataRoot, partition: str) -> pl.DataFrame:
    """doc_id, table (the stage folder), stage (the verdict), rule and value, detail of every document
    the stages after extracted_text removed from one file."""
    frames = []
    for table in VERDICT_TABLES:
        key = rejects_key(table, partition)
        if root.exists(key):
            df = root.read_parquet(key, columns=["doc_id", "stage", "rule", "value", "detail"])
            frames.append(df.with_columns(table=pl.lit(table)))
    if not frames:
        return pl.DataFrame(schema={"doc_id": pl.String, "stage": pl.String, "rule": pl.String, "value": pl.Float64,
                                    "detail": pl.String, "table": pl.String})
    return pl.concat(frames)


def recorded_facts(root: DataRoot, partition: str, rejects: pl.DataFrame) -> pl.DataFrame:
    """doc_id, language, quality_score the funnel recorded for one file's documents: the language
    stage's and the quality stage's kept columns, and the language and score their rejects hold."""
    lang = read_stage_documents(root, LANGUAGE_STAGE, partition, columns=["doc_id", "language"])
    lang_rej = rejects.filter(pl.col("table") == LANGUAGE_STAGE).select("doc_id", language=pl.col("detail"))
    score = read_stage_documents(root, QUALITY_STAGE, partition, columns=["doc_id", "quality_score"])
    score_rej = rejects.filter(pl.col("table") == QUALITY_STAGE).select("doc_id", quality_score=pl.col("value"))
    return (pl.concat([lang.cast({"language": pl.String}), lang_rej])
            .join(pl.concat([score.cast({"quality_score": pl.Float64}), score_rej]), on="doc_id", how="full",
                  coalesce=True))


def dedup_hashes(root: DataRoot, cfg: RefineryConfig) -> Iterator[pl.DataFrame]:
    """hash_hi and hash_lo (exact dedup's normalized-text hash) of every document that reached
    dedup, a signature table (one input file) at a time."""
    for shard in input_shards(cfg):
        key = signatures_key(shard.key)
        if root.exists(key):
            yield root.read_parquet(key, columns=["hash_hi", "hash_lo"])
