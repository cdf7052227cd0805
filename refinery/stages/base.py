"""The shared shape of a funnel stage, with no Dagster in sight.

A stage takes one document table and returns the documents it keeps, the rejects (one row per
removed document, with the rule that removed it and a value), and `StageStats`. `RecordStage` is the
one loop every per-document stage runs on (the datatrove `BaseFilter` idea): it batches the table,
times the stage, calls the stage's `process` once per document, counts, writes reject rows, applies
the source's `skip:` and isolates every record, so that a document whose processing raises or runs
past `record_timeout_s` becomes one reject (`<family>/error`, `<family>/timeout`) and the rest of
the table goes on. A stage writes only its own logic:

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

Reason strings are an API: `<rule family>/<rule>`, snake_case, e.g. `gopher_rep/dup_line_frac`.
Counters are `total`, `kept`, `dropped`, `dropped/<reason>`.
"""

from __future__ import annotations

import signal
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple, Union

import polars as pl

from refinery.documents import EXCERPT_CHARS, REJECTS_SCHEMA, empty_rejects


class Drop(NamedTuple):
    rule: str
    value: float | None = None
    detail: str = ""


@dataclass
class BucketCounts:
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def __add__(self, other: "BucketCounts") -> "BucketCounts":
        return BucketCounts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.docs_in, self.docs_out, self.bytes_in, self.bytes_out)


@dataclass
class StageStats:
    """Counts for one stage over one partition; `+` merges partitions and workers."""

    stage: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    wall_s: float = 0.0
    dropped: Counter = field(default_factory=Counter)  # reason -> documents
    counters: Counter = field(default_factory=Counter)  # anything else, e.g. pii/email replacements
    by_bucket: dict[str, BucketCounts] = field(default_factory=dict)

    def __add__(self, other: "StageStats") -> "StageStats":
        buckets = dict(self.by_bucket)
        for b, c in other.by_bucket.items():
            buckets[b] = buckets.get(b, BucketCounts()) + c
        return StageStats(
            stage=self.stage,
            docs_in=self.docs_in + other.docs_in,
            docs_out=self.docs_out + other.docs_out,
            bytes_in=self.bytes_in + other.bytes_in,
            bytes_out=self.bytes_out + other.bytes_out,
            wall_s=self.wall_s + other.wall_s,
            dropped=self.dropped + other.dropped,
            counters=self.counters + other.counters,
            by_bucket=buckets,
        )

    @property
    def retention(self) -> float:
        return self.docs_out / self.docs_in if self.docs_in else 1.0

    @property
    def byte_retention(self) -> float:
        return self.bytes_out / self.bytes_in if self.bytes_in else 1.0

    @property
    def docs_per_s(self) -> float:
        return self.docs_in / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "docs_in": self.docs_in,
            "docs_out": self.docs_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "wall_s": round(self.wall_s, 6),
            "dropped": dict(sorted(self.dropped.items())),
            "counters": dict(sorted(self.counters.items())),
            "by_bucket": {b: vars(c) for b, c in sorted(self.by_bucket.items())},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StageStats":
        return cls(
            stage=d["stage"],
            docs_in=d["docs_in"],
            docs_out=d["docs_out"],
            bytes_in=d["bytes_in"],
            bytes_out=d["bytes_out"],
            wall_s=d["wall_s"],
            dropped=Counter(d.get("dropped", {})),
            counters=Counter(d.get("counters", {})),
            by_bucket={b: BucketCounts(**c) for b, c in d.get("by_bucket", {}).items()},
        )


def text_bytes(df: pl.DataFrame, column: str = "text") -> pl.Series:
    if column not in df.columns:
        return pl.Series([0] * df.height, dtype=pl.Int64)
    return df[column].str.len_bytes().fill_null(0).cast(pl.Int64)


def count_in_out(
    stats: StageStats, before: pl.DataFrame, after: pl.DataFrame, column: str = "text", out_column: str | None = None
) -> None:
    """Fill docs/bytes in and out, overall and per bucket, from the tables either side of a stage.
    Bytes are those of `column` before and `out_column` (default: the same) after."""
    for df, suffix, col in ((before, "in", column), (after, "out", out_column or column)):
        sizes = df.select(pl.col("bucket"), text_bytes(df, col).alias("_bytes"))
        setattr(stats, f"docs_{suffix}", getattr(stats, f"docs_{suffix}") + df.height)
        setattr(stats, f"bytes_{suffix}", getattr(stats, f"bytes_{suffix}") + int(sizes["_bytes"].sum() or 0))
        for row in sizes.group_by("bucket").agg(pl.len().alias("n"), pl.col("_bytes").sum().alias("b")).iter_rows():
            bucket, n, b = row
            counts = stats.by_bucket.setdefault(bucket, BucketCounts())
            setattr(counts, f"docs_{suffix}", getattr(counts, f"docs_{suffix}") + n)
            setattr(counts, f"bytes_{suffix}", getattr(counts, f"bytes_{suffix}") + int(b or 0))


def rejects_frame(df: pl.DataFrame, stage: str, drops: dict[int, Drop], text_column: str = "text") -> pl.DataFrame:
    """Reject rows for the documents at the given row indices of `df`."""
    if not drops:
        return empty_rejects()
    rows = sorted(drops)
    sub = df[rows]
    excerpt = (
        sub[text_column].str.slice(0, EXCERPT_CHARS)
        if text_column in sub.columns
        else pl.Series([None] * len(rows), dtype=pl.String)
    )
    return pl.DataFrame(
        {
            "doc_id": sub["doc_id"],
            "url": sub["url"],
            "source": sub["source"],
            "bucket": sub["bucket"],
            "stage": [stage] * len(rows),
            "rule": [drops[i].rule for i in rows],
            "value": [None if drops[i].value is None else float(drops[i].value) for i in rows],
            "detail": [drops[i].detail for i in rows],
            "excerpt": excerpt,
        },
        schema=REJECTS_SCHEMA,
    )




DEFAULT_RECORD_TIMEOUT_S = 5.0


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
# Per-record isolation
# --------------------------------------------------------------------------------------------------

ERROR_DETAIL_CHARS = 300


class RecordTimeout(Exception):
    """A record ran past its time budget (raised by the budget's alarm inside the record's work)."""


def error_drop(family: str, err: BaseException) -> Drop:
    """`<family>/error`, with the exception's type and message as the detail."""
    return Drop(f"{family}/error", None, f"{type(err).__name__}: {err}"[:ERROR_DETAIL_CHARS])


def timeout_drop(family: str, elapsed: float, budget: float) -> Drop:
    return Drop(f"{family}/timeout", round(elapsed, 3), f"ran past the {budget:g} s budget per record")


def _on_alarm(signum: int, frame: Any) -> None:
    raise RecordTimeout()


@contextmanager
def record_alarm(budget: float | None) -> Iterator[bool]:
    """Installs the SIGALRM handler that turns an overrun into `RecordTimeout` for the duration of a
    stage run; yields whether the alarm is armed. Signals reach only the main thread, so in any
    other thread (or with no budget) records are timed, not interrupted: an overrun is still
    rejected, once the record finishes. Code in C that never returns to the interpreter (a parser
    deep inside one call) is not interrupted either; such work runs in an `IsolatedWorker` process."""
    if not budget or threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def guarded(family: str, budget: float | None, armed: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or the Drop that rejects the record: `<family>/error` when it raises,
    `<family>/timeout` when it runs past `budget` seconds."""
    start = time.perf_counter()
    try:
        try:
            if armed:
                signal.setitimer(signal.ITIMER_REAL, budget)
            result = fn(*args)
        finally:
            if armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except RecordTimeout:
        return timeout_drop(family, time.perf_counter() - start, budget or 0.0)
    except Exception as err:  # noqa: BLE001 - any failure of one record is that record's reject
        return error_drop(family, err)
    if budget and time.perf_counter() - start > budget:
        return timeout_drop(family, time.perf_counter() - start, budget)
    return result


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
    batch_size: ClassVar[int] = 1024

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
        for offset in range(0, docs.height, self.batch_size):
            batch = docs.slice(offset, self.batch_size)
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
