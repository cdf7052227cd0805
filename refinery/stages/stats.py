"""What a stage counts and what it rejects: the floor every stage module stands on.

`StageStats` holds one stage's counts over one partition (documents and bytes in and out, overall
and per bucket, drops by reason, other counters, wall time) and merges with `+` across partitions
and workers (datatrove's `Stats`). The bytes a stage loses come two ways, counted apart:
`bytes_dropped`, the text of the documents it removed, and `bytes_rewritten`, what it took out of
the documents it kept by changing their text (C4's line rules, PII placeholders, HTML extraction);
`bytes_in = bytes_out + bytes_dropped + bytes_rewritten`. `Drop` is the reason one document was
removed; `rejects_frame` turns the drops of a table into its reject rows.

A stats file holds `docs_in`, `docs_out` (documents in, and kept), `bytes_in`, `bytes_out`,
`bytes_rewritten`, `dropped` (removals by reason), `counters` (a stage's own counts) and `by_bucket`
(the same in and out per bucket). Reason strings are an API: `<rule family>/<rule>`, snake_case,
e.g. `gopher_rep/dup_line_frac`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import polars as pl

from refinery.documents import EXCERPT_CHARS, REJECTS_SCHEMA, empty_rejects


class Drop(NamedTuple):
    """Why one document was removed: its rule, the measured value, and a detail (the threshold);
    `others`, the further rules it fails, as (rule, value), where a stage measured them (the
    heuristic stage does)."""

    rule: str
    value: float | None = None
    detail: str = ""
    others: tuple[tuple[str, float | None], ...] = ()

    def failures(self) -> list[dict[str, Any]]:
        """Every rule the document fails, this one first: a reject's `failures` cell."""
        return [{"rule": rule, "value": None if value is None else float(value)}
                for rule, value in ((self.rule, self.value), *self.others)]


@dataclass
class BucketCounts:
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    bytes_rewritten: int = 0  # as StageStats.bytes_rewritten, for this bucket

    def __add__(self, other: "BucketCounts") -> "BucketCounts":
        return BucketCounts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.docs_in, self.docs_out, self.bytes_in, self.bytes_out, self.bytes_rewritten)

    @property
    def bytes_dropped(self) -> int:
        return self.bytes_in - self.bytes_out - self.bytes_rewritten


@dataclass
class StageStats:
    """Counts for one stage over one partition; `+` merges partitions and workers."""

    stage: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    # Bytes taken out of the documents the stage kept, by changing their text: their bytes in less
    # their bytes out, negative where the new text is longer (a placeholder longer than the email
    # it replaces). Stats files written before it was counted read as 0.
    bytes_rewritten: int = 0
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
            bytes_rewritten=self.bytes_rewritten + other.bytes_rewritten,
            wall_s=self.wall_s + other.wall_s,
            dropped=self.dropped + other.dropped,
            counters=self.counters + other.counters,
            by_bucket=buckets,
        )

    @property
    def bytes_dropped(self) -> int:
        """Bytes of the documents the stage removed, as they came in."""
        return self.bytes_in - self.bytes_out - self.bytes_rewritten

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
            "bytes_rewritten": self.bytes_rewritten,
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
            bytes_rewritten=d.get("bytes_rewritten", 0),
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
    """Fill docs/bytes in and out, and the bytes rewriting took out of the kept documents, overall
    and per bucket, from the tables either side of a stage. Bytes are those of `column` before and
    `out_column` (default: the same) after. A document of `before` is kept when its doc_id is in
    `after`; a table without doc ids must keep every row."""
    if "doc_id" in before.columns and "doc_id" in after.columns:
        kept = before["doc_id"].is_in(after["doc_id"].implode())
    elif before.height == after.height:
        kept = pl.repeat(True, before.height, eager=True)
    else:
        raise ValueError(f"{stats.stage}: without a doc_id column, which of {before.height} documents are the "
                         f"{after.height} kept cannot be told")
    sizes_in = before.select(pl.col("bucket"), text_bytes(before, column).alias("_bytes"), kept.alias("_kept"))
    sizes_out = after.select(pl.col("bucket"), text_bytes(after, out_column or column).alias("_bytes"))
    kept_bytes_in = int(sizes_in.filter(pl.col("_kept"))["_bytes"].sum() or 0)
    bytes_out = int(sizes_out["_bytes"].sum() or 0)
    stats.docs_in += before.height
    stats.docs_out += after.height
    stats.bytes_in += int(sizes_in["_bytes"].sum() or 0)
    stats.bytes_out += bytes_out
    stats.bytes_rewritten += kept_bytes_in - bytes_out
    kept_bytes = pl.col("_bytes").filter(pl.col("_kept"))
    ins = sizes_in.group_by("bucket").agg(n=pl.len(), b=pl.col("_bytes").sum(), k=kept_bytes.sum())
    for bucket, n, b, k in ins.iter_rows():
        counts = stats.by_bucket.setdefault(bucket, BucketCounts())
        counts.docs_in += n
        counts.bytes_in += int(b or 0)
        counts.bytes_rewritten += int(k or 0)  # less the bucket's bytes out, below
    for bucket, n, b in sizes_out.group_by("bucket").agg(n=pl.len(), b=pl.col("_bytes").sum()).iter_rows():
        counts = stats.by_bucket.setdefault(bucket, BucketCounts())
        counts.docs_out += n
        counts.bytes_out += int(b or 0)
        counts.bytes_rewritten -= int(b or 0)


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
            "failures": [drops[i].failures() for i in rows],
        },
        schema=REJECTS_SCHEMA,
    )
