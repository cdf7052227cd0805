"""The table reader: Parquet files, and Hugging Face datasets saved to disk (the Arrow stream files
their state.json lists; no `datasets` import).

A row is a record, its fields read as a JSONL object's (`ingest/missing_text` for a null or
non-string text; a binary column is decoded as UTF-8, `ingest/bad_utf8`). The rows of a row
group from where it cannot be read on are one `ingest/bad_rows` naming them, and the next group is
read; a file whose footer is gone, or an Arrow file cut short, is one `ingest/truncated_file` after
the rows read before it. A dataset's data file that resolves outside its directory is one
`ingest/outside_source` and is not opened. A table without the source's text (or id) column
raises `InputColumnError`: no row of it can be read.

`record_offset` is the row's number (across a dataset's Arrow files, a damaged file counting as one
row).

Rows are read a few at a time, never a row group or an Arrow batch at once: as many as
`extract.batch_bytes` holds at `extract.max_record_bytes` each (at least one, at most
`extract.batch_rows`), with Parquet pages read through a bounded buffer. So a row group of a
gigabyte of text (a few hundred KB on disk when its values repeat) costs one such slice of memory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterator

from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import EXCERPT_CHARS
from refinery.documents.inputs import outside_folder
from refinery.stages.readers.formats import HF_DATASET_DICT
from refinery.stages.isolation import ERROR_DETAIL_CHARS, guarded, record_alarm
from refinery.stages.readers.records import RawRecord, ReadResult, take_fields
from refinery.stages.stats import Drop

# Bytes of a Parquet column chunk read ahead at a time (pre-buffering would read a whole chunk).
_PARQUET_READ_BUFFER = 1 << 20


class InputColumnError(ValueError):
    """A Parquet or Arrow input without a column its source names: no row of it can be read."""


def _table_columns(names: list[str], source: SourceConfig, path: str) -> list[str]:
    """The columns to read from a table with columns `names`; raises naming the missing field."""
    required = [("text_field", source.text_field)]
    if source.id_field is not None:
        required.append(("id_field", source.id_field))
    for field_name, column in required:
        if column not in names:
            raise InputColumnError(
                f"source {source.name!r}: {path} has no column {column!r} (the source's {field_name}); "
                f"its columns are {names}; set {field_name} to one of them"
            )
    wanted = [source.text_field, source.url_field, source.id_field]
    return [c for c in dict.fromkeys(wanted) if c is not None and c in names]


@dataclass
class _TableDamage:
    """Rows of a table that cannot be read, from where reading got to: `rows` of them (None: the
    rest of the file). `rule` names another reason than damage (a file not opened)."""

    rows: int | None
    detail: str
    rule: str | None = None


def rows_per_slice(extract: ExtractConfig) -> int:
    """How many table rows are decoded at once: what `batch_bytes` holds of rows at the record
    size limit, at least one and at most `batch_rows`."""
    return max(1, min(extract.batch_rows, extract.batch_bytes // extract.max_record_bytes))


def _parquet_batches(path: str, source: SourceConfig, rows: int) -> Iterator[Any]:
    """Record batches of at most `rows` rows of the source's columns, row group by row group; a
    row group that cannot be read (from where it broke) is one `_TableDamage` and reading goes on
    with the next."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=_PARQUET_READ_BUFFER)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a broken footer
        yield _TableDamage(None, f"not a readable Parquet file: {err}")
        return
    columns = _table_columns(pf.schema_arrow.names, source, path)
    for group in range(pf.num_row_groups):
        left = pf.metadata.row_group(group).num_rows
        batches = pf.iter_batches(batch_size=rows, row_groups=[group], columns=columns, use_threads=False)
        while left > 0:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception as err:  # noqa: BLE001 - a corrupt page or column chunk
                yield _TableDamage(left, f"row group {group} unreadable: {err}")
                break
            left -= batch.num_rows
            yield batch


def dataset_splits(paths: list[str], folder: str | None = None) -> list[str]:
    """The `save_to_disk` Dataset directories among `paths`: a DatasetDict's directory stands for its
    splits, in the order its dataset_dict.json lists them. Anything else stays, to be refused by
    name when it is read; so does a path that leaves `folder` (the source's): nothing in it is opened."""
    out: list[str] = []
    for path in paths:
        index = os.path.join(path, HF_DATASET_DICT)
        if (folder is None or outside_folder(path, folder) is None) and os.path.isfile(index):
            with open(index) as f:
                out += [os.path.join(path, split) for split in json.load(f).get("splits", [])]
        else:
            out.append(path)
    return out


def _hf_dataset_batches(path: str, source: SourceConfig, rows: int) -> Iterator[Any]:
    """Record batches of at most `rows` rows of a `save_to_disk` directory's Arrow stream files,
    in the order its state.json lists them (each stored batch is memory-mapped and sliced); a file
    cut short or corrupt ends that file with one `_TableDamage`."""
    import pyarrow as pa

    state = os.path.join(path, "state.json")
    if not os.path.isfile(state):
        raise InputColumnError(f"source {source.name!r}: {path} is not a Hugging Face dataset saved with "
                               f"save_to_disk (no state.json); point the source's path at such a directory")
    with open(state) as f:
        files = [entry["filename"] for entry in json.load(f).get("_data_files", [])]
    for name in files:
        outside = outside_folder(os.path.join(path, name), path)
        if outside is not None:
            # A data file is the dataset's only inside its directory: one reject, nothing of it read.
            yield _TableDamage(None, f"{name} resolves to {outside}, outside the dataset's folder",
                               "ingest/outside_source")
            continue
        try:
            with pa.memory_map(os.path.join(path, name)) as source_file:
                reader = pa.ipc.open_stream(source_file)
                columns = _table_columns(reader.schema.names, source, f"{path}/{name}")
                for batch in reader:
                    batch = batch.select(columns)
                    for start in range(0, batch.num_rows, rows):
                        yield batch.slice(start, rows)
        except InputColumnError:
            raise
        except Exception as err:  # noqa: BLE001 - a missing, cut-short or corrupt Arrow stream
            yield _TableDamage(None, f"{name}: {err}")


def read_parquet(path: str, source: SourceConfig, extract: ExtractConfig, result: ReadResult,
                 budget: float | None) -> None:
    """One row of a Parquet file per record (`_read_rows`). Parquet's pages are read in no order a
    position could follow: its text is set against the whole file's size."""
    _read_rows(_parquet_batches(path, source, rows_per_slice(extract)), os.path.getsize(path), source, extract,
               result, budget)


def read_dataset(path: str, source: SourceConfig, extract: ExtractConfig, result: ReadResult,
                 budget: float | None) -> None:
    """One row of a `save_to_disk` dataset per record (`_read_rows`), numbered across its files."""
    _read_rows(_hf_dataset_batches(path, source, rows_per_slice(extract)), 0, source, extract, result, budget)


def _read_rows(batches: Iterator[Any], size: int, source: SourceConfig, extract: ExtractConfig,
               result: ReadResult, budget: float | None) -> None:
    """One row per record: the text column as the document, url and id columns as for JSONL;
    `record_offset` is the row's number in the file (in the dataset, for a Hugging Face dataset).
    `size`: the bytes the inflation bound sets the text against (0: none)."""
    row = 0  # the next row's number; a damaged stretch is one reject numbered by its first row
    with record_alarm(budget) as armed:
        for batch in batches:
            if isinstance(batch, _TableDamage):
                span = f"rows {row}..{row + batch.rows}" if batch.rows is not None else f"rows from {row}"
                rule = batch.rule or ("ingest/bad_rows" if batch.rows is not None else "ingest/truncated_file")
                result.add(RawRecord(row, row, None, None, None, drop=Drop(rule, float(row),
                    (batch.detail if batch.rule else f"{span} unreadable: {batch.detail}")[:ERROR_DETAIL_CHARS])))
                row += batch.rows or 1
                continue
            for obj in _rows(batch, source):
                rec = RawRecord(index=row, offset=row, url=None, fetch_time=None, content_type="text/plain")
                row += 1
                failed = guarded("ingest", budget, armed, _take_row, rec, obj, source, extract, result)
                if failed is not None:
                    rec.raw, rec.drop = None, failed
                if result.past_file_bound(rec.payload_bytes, rec.index, rec.offset) or (
                        size and result.past_inflation_bound(lambda: size, rec.index, rec.offset, whole_file=True)):
                    return
                result.add(rec)
    if not result.read:
        result.count("empty_file")


def _rows(batch: Any, source: SourceConfig) -> list[dict]:
    """The batch's rows as dicts. A string value that is not UTF-8 (a writer that skipped validation)
    makes pyarrow refuse the whole batch; then the batch's strings are read as bytes, so that the
    text goes through the check a binary column gets (`ingest/bad_utf8`, or replacement characters
    below MAX_INVALID_UTF8_FRACTION) and the other fields take replacement characters: the bad
    value costs its own row at most."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        import pyarrow as pa

        as_bytes = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}
        columns = [c.cast(as_bytes[c.type]) if c.type in as_bytes else c for c in batch.columns]
        rows = pa.table(dict(zip(batch.schema.names, columns))).to_pylist()
        return [{k: v.decode("utf-8", "replace") if isinstance(v, bytes) and k != source.text_field else v
                 for k, v in obj.items()} for obj in rows]


def _take_row(rec: RawRecord, obj: dict, source: SourceConfig, extract: ExtractConfig, result: ReadResult) -> None:
    # The row as its excerpt, each value cut to what an excerpt can show: the repr of a whole
    # 100 KB value costs more than reading its row.
    cut = {k: v[:EXCERPT_CHARS] if isinstance(v, (str, bytes)) else v for k, v in obj.items()}
    take_fields(rec, obj, source, extract, result, excerpt=str(cut))


# ---- what preflight and `refinery init` read of a table before any row -----------------------------


def parquet_schemas(path: str) -> list[tuple[str, list[str]]]:
    """(file, column names) of the Parquet file; none when its schema cannot be read (reading it is
    a counted reject, not a config problem)."""
    import pyarrow.parquet as pq

    try:
        return [(path, pq.read_schema(path).names)]
    except Exception:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        return []


def dataset_schemas(path: str) -> list[tuple[str, list[str]]]:
    """(file, column names) of each Arrow file a save_to_disk dataset's state.json lists, leaving
    out those that resolve outside its folder (ingest refuses them unread) and those whose schema
    cannot be read; none for a DatasetDict (its splits are datasets of their own, checked when read)."""
    import pyarrow as pa

    try:
        with open(os.path.join(path, "state.json")) as f:
            files = [os.path.join(path, e["filename"]) for e in json.load(f).get("_data_files", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    out = []
    for file in files:
        if outside_folder(file, path) is not None:
            continue
        try:
            with pa.memory_map(file) as stream:
                out.append((file, pa.ipc.open_stream(stream).schema.names))
        except Exception:  # noqa: BLE001 - pyarrow raises several types for a damaged file
            continue
    return out


def sample_parquet(path: str, records: int) -> tuple[list[str], list[dict]]:
    """The Parquet file's columns and its first `records` rows."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    batch = next(pf.iter_batches(batch_size=records), None)
    return pf.schema_arrow.names, batch.to_pylist() if batch is not None else []


def sample_dataset(path: str, records: int) -> tuple[list[str], list[dict]]:
    """A save_to_disk dataset's columns and the first `records` rows of its first Arrow file."""
    import pyarrow as pa

    with open(os.path.join(path, "state.json")) as f:
        first = json.load(f)["_data_files"][0]["filename"]
    if outside_folder(os.path.join(path, first), path) is not None:
        raise ValueError(f"{first} is a symlink out of the dataset's folder")  # ingest refuses it unread
    with pa.memory_map(os.path.join(path, first)) as source:
        reader = pa.ipc.open_stream(source)
        batch = next(iter(reader), None)
        return reader.schema.names, batch.to_pylist()[:records] if batch is not None else []
