"""The `raw_documents` stage: one input shard (a WARC or JSONL file, gzip or not; a Parquet file; a
Hugging Face dataset saved to disk) read into a table, by the reader of its source's format
(refinery/stages/readers/).

One row per response/resource WARC record, JSONL line or table row, with the provenance columns of
`refinery.documents` and `raw`, the decoded payload (HTML for WARC responses, the text field for
JSONL and tables). The table raw_documents stores keeps the provenance and, of the payload, only its
UTF-8 size and blake2b-64 hash (`STORED_SCHEMA`): the payload is a second copy of the crawl, and
extracted_text, its one reader, reads it again from the input file (`reread_documents`: the same
reader over the same bytes, each payload checked against its stored hash, a moved or edited file
refused in one line). Hostile input never stops the file: a bad record becomes one reject row
`ingest/<reason>` (each reader's docstring lists its reasons) and reading goes on. Only a missing
file, and a table without the source's text (or id) column, raise. A file whose symlinks lead
outside its source's folder is not read: it is one `ingest/outside_source` reject, without an
excerpt; so is a file whose name is not valid UTF-8 (`ingest/bad_file_name`, named with `\\xNN`
escapes). Handling one record (decoding, parsing) that raises or runs past `record_timeout_s` is that record's reject, `ingest/error` or
`ingest/timeout` (refinery/stages/isolation.py). For a WARC record the time budget covers its
decoding work (content and transfer codings, a charset other than UTF-8, charset detection); a
payload that is UTF-8 as it came costs one decode in C, bounded by `max_record_bytes`, and no timer.

`record_offset` locates the record in its file: a byte offset for WARC (in the file as stored) and
JSONL (in the decompressed stream), a row number for tables.

Memory is bounded per record, not per file: every reader streams (JSONL line by line, WARC record
by record, gzip decoded as it is read, tables a few rows at a time), and `stream_input_shard` hands
the rows on in batches of at most `extract.batch_rows` records and `extract.batch_bytes` of text,
which the asset writes as row groups (a record over `max_record_bytes` is an `ingest/too_large`
reject, read no further). CPU is bounded per file: past `extract.max_file_bytes` decompressed, the
rest of a file is one `ingest/file_too_large` reject and is not read (a decompression bomb), and
so is the rest of a compressed file that, past `extract.inflation_floor_bytes`, inflates more than
`extract.max_inflation_ratio` times the compressed bytes read (a bomb is stopped early).
`read_input_shard` puts the batches of a small file together.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Callable, Iterator

import polars as pl

from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import PROVENANCE_SCHEMA, InputShard, empty_rejects, make_doc_id
from refinery.documents.tables import record_position
from refinery.documents.inputs import outside_folder, pattern_parts
from refinery.stages.base import StageOutput
from refinery.stages.isolation import DEFAULT_RECORD_TIMEOUT_S
from refinery.stages.readers import RawRecord, ReadResult, input_format
from refinery.stages.stats import Drop, StageStats, count_in_out, rejects_frame

STAGE = "raw_documents"
PAYLOAD = "raw"
# What raw_documents stores of a record besides its provenance: its payload's size and hash, by
# which a reader that re-reads the payload from the input (`reread_documents`) knows it unchanged.
PAYLOAD_CHECK_SCHEMA: dict[str, pl.DataType] = {"raw_bytes": pl.Int64(), "raw_hash": pl.UInt64()}
STORED_SCHEMA: dict[str, pl.DataType] = {**PROVENANCE_SCHEMA, **PAYLOAD_CHECK_SCHEMA}
# A batch of records as read: what is stored and the payload, which is not.
RAW_SCHEMA: dict[str, pl.DataType] = {**STORED_SCHEMA, PAYLOAD: pl.String()}


def config_relative_file(path: str, pattern: str) -> str:
    """The file named as the config names it (e.g. `../data/sample/web/web-00.warc.gz`), so the
    `file` column does not depend on where the checkout lives."""
    if os.path.isabs(pattern) or "://" in pattern:
        return path
    parts = pattern.split("/")
    fixed, _ = pattern_parts(pattern)
    tail = len(parts) - fixed
    if "**" in parts[fixed:]:
        return path
    return "/".join(parts[:fixed] + path.split(os.sep)[-tail:])


def escaped_name(path: str) -> str:
    """`path` with each byte that is not UTF-8 (held as a surrogate by os.fsdecode) shown as `\\xNN`."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def read_records(shard: InputShard, source: SourceConfig, extract: ExtractConfig, result: ReadResult,
                 record_timeout_s: float | None) -> None:
    """Every record of the file, by the reader of the source's format (refinery/stages/readers/formats.py),
    into `result`."""
    fmt = input_format(source.format)
    exists = os.path.isdir if fmt.is_folder else os.path.isfile
    if not exists(shard.path):
        raise FileNotFoundError(
            f"input {shard.path} of source {source.name!r} (path {source.path!r}) does not exist; "
            f"fix the source's path or restore the file"
        )
    fmt.read(shard.path, source, extract, result, record_timeout_s)


# What receives each batch's kept documents (a `raw_documents` frame) and, apart, its rejects.
FrameSink = Callable[[pl.DataFrame], None]


def stream_input_shard(
    shard: InputShard, source: SourceConfig, extract: ExtractConfig, write_documents: FrameSink,
    write_rejects: FrameSink, record_timeout_s: float | None = DEFAULT_RECORD_TIMEOUT_S,
) -> StageStats:
    """Read one input file and hand its `raw_documents` rows and reject rows on batch by batch
    (at most `extract.batch_rows` records and about `extract.batch_bytes` of text each), in file
    order; the file's stats, merged over its batches. Handling one record (decoding, parsing its
    JSON) that raises or runs past `record_timeout_s` is that record's reject, `ingest/error` or
    `ingest/timeout`."""
    start = time.perf_counter()
    stats = StageStats(stage=STAGE)
    file_label = escaped_name(config_relative_file(shard.path, source.path))

    def write_batch(records: list[RawRecord]) -> None:
        documents, rejects = _batch_frames(shard, file_label, records, stats)
        write_documents(documents)
        write_rejects(rejects)

    result = ReadResult(sink=write_batch, batch_rows=extract.batch_rows, batch_bytes=extract.batch_bytes,
                        max_file_bytes=extract.max_file_bytes, max_inflation_ratio=extract.max_inflation_ratio,
                        inflation_floor=extract.inflation_floor_bytes)
    outside = outside_folder(shard.path, shard.folder) if shard.folder is not None else None
    name = escaped_name(shard.path)
    if name != shard.path:
        # No text column can hold the name, and lineage could not point back at the file: refuse it.
        result.add(RawRecord(index=0, offset=0, url=None, fetch_time=None, content_type=None, drop=Drop(
            "ingest/bad_file_name", None, f"file name is not valid UTF-8: {name}")))
    elif outside is not None:
        # One reject for the file, without an excerpt: nothing of a file outside the source is read.
        result.add(RawRecord(index=0, offset=0, url=None, fetch_time=None, content_type=None, drop=Drop(
            "ingest/outside_source", None, f"resolves to {outside}, outside the source's folder {shard.folder}")))
    else:
        read_records(shard, source, extract, result, record_timeout_s)
    result.flush()
    stats.counters.update(result.counters)
    stats.wall_s = time.perf_counter() - start
    return stats


def _batch_frames(shard: InputShard, file_label: str, records: list[RawRecord],
                  stats: StageStats) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The kept documents and the reject rows of one batch of records; counted into `stats`."""
    raw = _text_column([r.raw for r in records])
    table = pl.DataFrame(
        {
            "doc_id": [make_doc_id(shard.key, r.index) for r in records],
            "url": [r.url for r in records],
            "source": [shard.source] * len(records),
            "bucket": [shard.bucket] * len(records),
            "file": [file_label] * len(records),
            "record_index": [r.index for r in records],
            "record_offset": [r.offset for r in records],
            "fetch_time": [r.fetch_time for r in records],
            "content_type": [r.content_type for r in records],
            **payload_checks(raw),
            "raw": raw,
            "_excerpt": [r.excerpt for r in records],
        },
        schema={**RAW_SCHEMA, "_excerpt": pl.String()},
    )
    drops = {i: r.drop for i, r in enumerate(records) if r.drop is not None}
    rejects = rejects_frame(table, STAGE, drops, text_column="_excerpt")
    documents = table.filter(pl.Series([r.drop is None for r in records], dtype=pl.Boolean)).drop("_excerpt")
    count_in_out(stats, table, documents, column="raw")
    for i in drops:
        # rejected records have no `raw`; count the bytes they occupied in the input
        stats.bytes_in += records[i].payload_bytes
        stats.by_bucket[shard.bucket].bytes_in += records[i].payload_bytes
    for rule in (d.rule for d in drops.values()):
        stats.dropped[rule] += 1
    return documents, rejects


def _text_column(values: list[str | bytes | None]) -> pl.Series:
    """The `raw` column of a batch. Text a reader kept as its UTF-8 bytes (`RawRecord.raw`) goes in
    as bytes, checked by polars' cast: a Python str of text that is not ASCII costs polars an
    encoding back to UTF-8, about twice the time of the bytes."""
    if not any(isinstance(v, bytes) for v in values):
        return pl.Series("raw", values, dtype=pl.String)
    try:
        data = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
    except UnicodeEncodeError:  # a lone surrogate in a decoded text: polars takes the strs as they are
        return pl.Series("raw", [v.decode("utf-8") if isinstance(v, bytes) else v for v in values], dtype=pl.String)
    return pl.Series("raw", data, dtype=pl.Binary).cast(pl.String)


def payload_checks(raw: pl.Series) -> dict[str, pl.Series]:
    """Each payload's UTF-8 bytes and their blake2b-64 (null for no payload): what raw_documents keeps
    of it."""
    data = raw.cast(pl.Binary).to_list()
    return {"raw_bytes": pl.Series([None if d is None else len(d) for d in data], dtype=pl.Int64),
            "raw_hash": pl.Series([None if d is None else int.from_bytes(hashlib.blake2b(d, digest_size=8).digest(), "little")
                                   for d in data], dtype=pl.UInt64)}


class InputChanged(ValueError):
    """An input file that no longer holds a document raw_documents read from it (moved, deleted or edited)."""


def reread_documents(shard: InputShard, source: SourceConfig, extract: ExtractConfig,
                     stored: Iterator[pl.DataFrame], write_documents: FrameSink,
                     record_timeout_s: float | None = DEFAULT_RECORD_TIMEOUT_S) -> None:
    """The documents raw_documents kept of `shard` (`stored`: its table's rows, in file order), each
    with its payload read again from the input file as ingest read it, handed on as
    `write_documents` frames of the provenance columns and `raw`, one per batch the file is read in
    (a file without documents: one empty frame, as `stage_batches` gives). Each payload is checked
    against the hash stored; a document the file no longer holds as it was, or a file gone, raises
    `InputChanged` in one line naming what to do. Memory is a batch's: the stored rows are read
    along with the file."""
    pending = pl.DataFrame(schema=STORED_SCHEMA)
    written = 0
    label = config_relative_file(shard.path, source.path)
    again = (f"raw_documents keeps provenance, not the payload: restore the file as it was, or materialize "
             f"raw_documents for input file {shard.key!r} again")

    def check(frame: pl.DataFrame) -> None:
        nonlocal pending, written
        if frame.height == 0:
            return
        last = frame["record_index"][-1]
        while pending.height == 0 or pending["record_index"][-1] < last:
            more = next(stored, None)
            if more is None:
                break
            pending = pl.concat([pending, more.select(list(STORED_SCHEMA)).cast(STORED_SCHEMA)])
        here, pending = pending.filter(pl.col("record_index") <= last), pending.filter(pl.col("record_index") > last)
        now = frame.select("record_index", pl.col("raw_hash").alias("_now"), PAYLOAD, pl.lit(True).alias("_read"))
        matched = here.join(now, on="record_index", how="left", maintain_order="left")
        changed = matched.filter(pl.col("_read").is_null() | pl.col("_now").ne_missing(pl.col("raw_hash")))
        if changed.height:
            raise InputChanged(f"{label}: {_changed_record(changed)}; {again}")
        if matched.height:
            write_documents(matched.select(*PROVENANCE_SCHEMA, PAYLOAD))
            written += 1

    try:
        stream_input_shard(shard, source, extract, check, lambda rejects: None, record_timeout_s)
    except FileNotFoundError:
        raise InputChanged(f"{label}: gone since raw_documents read it (moved or deleted); {again}") from None
    rest = pending.height + sum(frame.height for frame in stored)
    if rest:
        raise InputChanged(f"{label}: {rest} document(s) raw_documents read are no longer in it (the file changed "
                           f"since); {again}")
    if not written:
        write_documents(pl.DataFrame(schema={**PROVENANCE_SCHEMA, PAYLOAD: pl.String()}))


def _changed_record(changed: pl.DataFrame) -> str:
    row = changed.row(0, named=True)
    where = record_position(row["file"], row["record_index"], row["record_offset"])
    what = "is no longer there" if row["_read"] is None else "holds another payload (its hash differs)"
    more = f" (and {changed.height - 1} more)" if changed.height > 1 else ""
    return f"{where} {what} since raw_documents read it{more}: the file changed"


def read_input_shard(
    shard: InputShard, source: SourceConfig, extract: ExtractConfig,
    record_timeout_s: float | None = DEFAULT_RECORD_TIMEOUT_S,
) -> StageOutput:
    """The whole `raw_documents` table for one input file, with its rejects and stats, in memory:
    `stream_input_shard` with its batches put together (for a file known to be small, and tests)."""
    documents, rejects = [pl.DataFrame(schema=RAW_SCHEMA)], [empty_rejects()]
    stats = stream_input_shard(shard, source, extract, documents.append, rejects.append, record_timeout_s)
    return StageOutput(pl.concat(documents), pl.concat(rejects), stats)
