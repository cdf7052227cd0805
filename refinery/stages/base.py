"""The shared shape of a funnel stage, with no Dagster in sight.

A stage takes one document table and returns the documents it keeps, the rejects (one row per
removed document, with the rule that removed it and a value), and `StageStats`. `RecordStage` is the
one loop every per-document stage runs on (the datatrove `BaseFilter` idea): it batches the table
(by documents and by bytes), times the stage, calls the stage's `process` once per document,
counts, writes reject rows, applies the source's `skip:` and isolates every record, so that a
document whose processing raises or runs past `record_timeout_s` becomes one reject
(`<family>/error`, `<family>/timeout`) and the rest of the table goes on. A stage writes only its own logic:

    class Shouting(RecordStage):
        name = "shout_filtered"        # the table it writes; stats and rejects use this name
        family = "shout"               # the prefix of its reasons: shout/too_loud, shout/error
        skip_key = "shout"             # a source listing "shout" under `skip:` passes through
        reads = ("text",)              # the columns `process` sees
        writes = {"text": pl.String}   # the columns a kept document may get from `process`

        def process(self, record, counters):
            if record["text"].isupper():
                return Drop("shout/too_loud", len(record["text"]))
            return {"text": record["text"].lower()}   # or None: keep the document as it is

`Filter` is the RecordStage that only keeps or drops: it implements `check(record) -> Drop | None`.
`Chain` runs stages one after the other and reports them as one stage (heuristic_filtered with
the config's custom filters; pii_redacted's safety filter, then redaction).

Counts and reject rows are refinery/stages/stats.py's; per-record isolation (error and timeout
rejects, the worker process) is refinery/stages/isolation.py's.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Union

import polars as pl

from refinery.documents import empty_rejects
from refinery.stages.isolation import DEFAULT_RECORD_TIMEOUT_S, guarded, record_alarm
from refinery.stages.parquet_batches import bounded_batches
from refinery.stages.stats import Drop, StageStats, count_in_out, rejects_frame


@dataclass
class StageOutput:
    documents: pl.DataFrame
    rejects: pl.DataFrame
    stats: StageStats


def without_drops(docs: pl.DataFrame, drops: dict[int, Drop]) -> pl.DataFrame:
    """The rows of `docs` whose index is not in `drops`."""
    if not drops:
        return docs
    return docs.filter(pl.Series([i not in drops for i in range(docs.height)], dtype=pl.Boolean))


def stage_output(
    stage: str, docs: pl.DataFrame, kept: pl.DataFrame, drops: dict[int, Drop], stats: StageStats,
    bytes_in_column: str = "text",
) -> StageOutput:
    """A stage's output from its input `docs`, the documents it kept and the drops by row of
    `docs`: the drops are counted by reason and become reject rows named after `stage`."""
    for drop in drops.values():
        stats.dropped[drop.rule] += 1
    count_in_out(stats, docs, kept, bytes_in_column, "text")
    return StageOutput(kept, rejects_frame(docs, stage, drops, text_column=bytes_in_column), stats)


class Stage(ABC):
    """One funnel stage over one document table."""

    name: ClassVar[str]
    # The entry of a source's `skip:` list that bypasses this stage; None when no source can.
    skip_key: ClassVar[str | None] = None
    # Seconds one record may take; `stages.record_timeout_s` sets it for the assets.
    record_timeout_s: float | None = DEFAULT_RECORD_TIMEOUT_S

    @abstractmethod
    def run(self, docs: pl.DataFrame) -> StageOutput: ...

    def skipped(self, docs: pl.DataFrame) -> StageOutput:
        """What a source that skips this stage gets: every document kept, nothing rejected."""
        stats = StageStats(stage=self.name)
        count_in_out(stats, docs, docs)
        stats.counters["skipped_by_source"] = docs.height
        return StageOutput(docs, empty_rejects(), stats)

    def run_for_source(self, docs: pl.DataFrame, skip: list[str] | tuple[str, ...]) -> StageOutput:
        """`run`, or `skipped` when `skip` (the source's `skip:` list) names this stage. The one
        place a source's `skip:` is applied to a stage."""
        return self.skipped(docs) if skips(skip, self.skip_key) else self.run(docs)

    def config_summary(self) -> dict[str, Any]:
        """The settings this stage ran with, for provenance metadata."""
        return {}


def skips(skip: list[str] | tuple[str, ...], key: str | None) -> bool:
    """Whether a source's `skip:` list bypasses the stage whose skip key is `key`."""
    return key is not None and key in skip


# --------------------------------------------------------------------------------------------------
# The stage loop
# --------------------------------------------------------------------------------------------------

# What `process` returns for one document: None keeps it as it is, a dict keeps it with those
# values for columns of `writes`, a Drop rejects it.
Outcome = Union[Drop, dict[str, Any], None]


class RecordStage(Stage):
    """A stage that handles each document on its own: see the module docstring for a whole one.

    Subclasses set `name`, `family`, `reads`, `writes` (and optionally `skip_key`) and implement
    `process(record, counters) -> Outcome`. `process_batch` may be overridden to do a batch's work
    at once (one model call per batch); it is an optimization of `process`, which stays the
    definition: when a batch raises, its records are redone one by one through `process`, so only
    the record that fails is lost. `counters` is the stage's `StageStats.counters`."""

    family: ClassVar[str]
    reads: ClassVar[tuple[str, ...]] = ("text",)
    # Columns `process` sees when the table has them, and as None when it has not (a table from
    # before the stage that adds them, or one a test builds by hand).
    optional_reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[dict[str, pl.DataType]] = {}
    # Columns the stage consumes: gone from the kept documents (extraction turns `raw` into `text`).
    consumes: ClassVar[tuple[str, ...]] = ()
    # The column whose bytes count as bytes in, and whose start is a reject's excerpt.
    bytes_in_column: ClassVar[str] = "text"
    # `process_batch` sees at most this many documents and, unless one document is larger, this
    # many bytes of strings: a model's work arrays follow a batch, whatever its documents' sizes.
    batch_size: ClassVar[int] = 1024
    batch_bytes: ClassVar[int | None] = 16 << 20

    def process(self, record: dict[str, Any], counters: Counter) -> Outcome:
        raise NotImplementedError(f"{type(self).__name__} implements neither process nor process_batch")

    def process_batch(self, batch: pl.DataFrame, counters: Counter) -> list[Outcome]:
        with record_alarm(self.record_timeout_s) as armed:
            return [
                guarded(self.family, self.record_timeout_s, armed, self.process, record, counters)
                for record in self.records(batch)
            ]

    def records(self, batch: pl.DataFrame) -> Iterator[dict[str, Any]]:
        """The rows `process` sees: `reads`, plus `optional_reads` (None where absent)."""
        missing = [pl.lit(None).alias(c) for c in self.optional_reads if c not in batch.columns]
        return batch.with_columns(missing).select([*self.reads, *self.optional_reads]).iter_rows(named=True)

    def run(self, docs: pl.DataFrame) -> StageOutput:
        start = time.perf_counter()
        stats = StageStats(stage=self.name)
        outcomes: list[Outcome] = []
        for batch in bounded_batches(docs, self.batch_size, self.batch_bytes):
            try:
                outcomes += self.process_batch(batch, stats.counters)
            except Exception:  # noqa: BLE001 - redo the batch record by record to find the culprit
                outcomes += RecordStage.process_batch(self, batch, stats.counters)
        out = self.assemble(docs, outcomes, stats)
        stats.wall_s = time.perf_counter() - start
        return out

    def assemble(self, docs: pl.DataFrame, outcomes: list[Outcome], stats: StageStats) -> StageOutput:
        """Kept documents with their new column values, reject rows and counts, from one outcome
        per document."""
        drops = {i: o for i, o in enumerate(outcomes) if isinstance(o, Drop)}
        updates = []
        for column, dtype in self.writes.items():
            if not any(isinstance(o, dict) and column in o for o in outcomes):
                if column not in docs.columns:
                    updates.append(pl.lit(None, dtype=dtype).alias(column))
                continue
            current = docs[column].to_list() if column in docs.columns else [None] * docs.height
            values = [o[column] if isinstance(o, dict) and column in o else c for o, c in zip(outcomes, current)]
            updates.append(pl.Series(column, values, dtype=dtype))
        kept = without_drops(docs.with_columns(updates) if updates else docs, drops)
        kept = kept.drop([c for c in self.consumes if c in kept.columns])
        return stage_output(self.name, docs, kept, drops, stats, self.bytes_in_column)

    def skipped(self, docs: pl.DataFrame) -> StageOutput:
        """Every document kept; the columns the stage would write are null, so every partition of
        its table has one schema."""
        out = super().skipped(docs)
        missing = [pl.lit(None, dtype=t).alias(c) for c, t in self.writes.items() if c not in docs.columns]
        return StageOutput(out.documents.with_columns(missing) if missing else out.documents, out.rejects, out.stats)


class Filter(RecordStage):
    """A stage that keeps or drops each document and never changes the kept ones."""

    reads = ("text", "url")

    @abstractmethod
    def check(self, record: dict[str, Any]) -> Drop | None:
        """None to keep the document, or the rule that drops it."""

    def process(self, record: dict[str, Any], counters: Counter) -> Outcome:
        return self.check(record)


# --------------------------------------------------------------------------------------------------
# Stages in sequence
# --------------------------------------------------------------------------------------------------


class Chain(Stage):
    """Stages run one after the other, each on the documents the one before kept, reported as one
    stage named `name`: one documents table, one rejects table (every row under `name`), and one
    StageStats whose drops and counters are the parts' added up and whose documents and bytes are
    counted at the two ends of the chain. Every part runs with the chain's `record_timeout_s`.

    `skip_key` is the `skip:` entry that bypasses the whole chain; a skipped chain still gives
    every column its parts would write (as null), so every partition of its table has one schema.
    `summary` is its `config_summary`: the settings of the parts, as the chain's users name them."""

    def __init__(self, name: str, parts: Sequence[Stage], summary: dict[str, Any], skip_key: str | None = None):
        self.name = name
        self.parts = tuple(parts)
        self.summary = summary
        self.skip_key = skip_key

    def run(self, docs: pl.DataFrame) -> StageOutput:
        start = time.perf_counter()
        stats = StageStats(stage=self.name)
        rejects, kept = [], docs
        for part in self.parts:
            part.record_timeout_s = self.record_timeout_s
            out = part.run(kept)
            rejects.append(out.rejects)
            stats.dropped += out.stats.dropped
            stats.counters += out.stats.counters
            kept = out.documents
        count_in_out(stats, docs, kept)
        stats.wall_s = time.perf_counter() - start
        return StageOutput(kept, pl.concat(rejects).with_columns(stage=pl.lit(self.name)), stats)

    def skipped(self, docs: pl.DataFrame) -> StageOutput:
        out = super().skipped(docs)
        documents = out.documents
        for part in self.parts:
            documents = part.skipped(documents).documents
        return StageOutput(documents, out.rejects, out.stats)

    def config_summary(self) -> dict[str, Any]:
        return self.summary
