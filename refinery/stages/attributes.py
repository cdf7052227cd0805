"""Attribute tables: the verdicts of the per-document stages between the extracted text and the final
redacted text, stored beside the text rather than as copies of it (Dolma's attributes).

A stage of `refinery.layout.ATTRIBUTE_STAGES` keeps documents of the table it narrows (its
upstream) and may add columns (language_filtered: language and language_score; deduped: dup_cluster
and dup_cluster_size; quality_scored: quality_score) or edit the text (heuristic_filtered's C4 line
rules). Its attribute table holds one row per kept document, in the order of its documents:

    doc_id        the kept document
    text_spans    the stage's text as spans of its upstream's text, [start, end, start, end, ...] in
                  code points, concatenated in order; null where the text is unchanged
    text_literal  the stage's text where it is no concatenation of the upstream's (never, for the
                  built-in rules; a custom filter may write any text); null otherwise
    <columns>     the columns the stage adds, in the order the stage appends them

A stage's kept documents are then its upstream's, filtered to these doc ids, with the edits applied
and the columns appended; `stage_batches` reads them back that way, a record batch of the text table
at a time, so that every reader of a stage's documents gets the rows, columns and dtypes the stage
produced. The contract that makes it exact is checked when a table is written: a stage keeps its
upstream's rows in order, keeps every upstream column (the text may change, nothing else), and
appends its new columns after them.
"""

from __future__ import annotations

from typing import Any, Iterator

import polars as pl
import pyarrow.parquet as pq

from refinery.documents import PROVENANCE_COLUMNS
from refinery.layout import ATTRIBUTE_STAGES, attributes_key, documents_key, stats_key
from refinery.stages.parquet_batches import parquet_batches
from refinery.storage import DataRoot
from refinery.storage.damaged import DamagedTableError, named_batches, reading_table

TEXT_EDIT_SCHEMA = {"text_spans": pl.List(pl.Int64), "text_literal": pl.String}
# Rows of a table read at a time by `read_stage_documents` (the text table's batches when streaming),
# and the bytes of strings a reader that streams a file's text holds at once (`parquet_batches`).
READ_ROWS = 10_000
READ_BYTES = 64 << 20


class AttributeTableError(ValueError):
    """An attribute table that does not fit the documents it narrows, or a stage that broke the
    attribute contract (reordered rows, changed a column other than the text)."""


# ---- text edits as spans ------------------------------------------------------------------------


def _cover(old: str, piece: str, hint: int, spans: list[int]) -> bool:
    """Append spans of `old` that spell `piece` (the occurrence at or after `hint` first, so that
    consecutive pieces merge into one span); False if some character of it is not in `old`."""
    at = old.find(piece, hint)
    if at < 0:
        at = old.find(piece)
    if at >= 0:
        if spans and spans[-1] == at:
            spans[-1] = at + len(piece)
        else:
            spans.extend((at, at + len(piece)))
        return True
    if len(piece) == 1:
        return False
    middle = len(piece) // 2
    return (_cover(old, piece[:middle], hint, spans)
            and _cover(old, piece[middle:], spans[-1] if spans else hint, spans))


def text_spans(old: str, new: str) -> list[int] | None:
    """`new` as spans of `old` ([start, end, ...], code points), or None when it is not a
    concatenation of pieces of `old`. Pieces are `new`'s lines: a line-filtered text's kept lines
    are found where they stand, and runs of untouched lines become one span."""
    spans: list[int] = []
    for piece in new.splitlines(keepends=True):
        if not _cover(old, piece, spans[-1] if spans else 0, spans):
            return None
    return spans


def apply_spans(old: str, spans: list[int]) -> str:
    return "".join(old[spans[i]:spans[i + 1]] for i in range(0, len(spans), 2))


def text_edits(old: pl.Series, new: pl.Series) -> pl.DataFrame:
    """text_spans and text_literal of each row: null where `new` equals `old`."""
    spans: list[list[int] | None] = []
    literals: list[str | None] = []
    unchanged = (old == new).fill_null(False) | (old.is_null() & new.is_null())
    for same, before, after in zip(unchanged.to_list(), old.to_list(), new.to_list()):
        if after is None and not same:
            raise AttributeTableError("a stage set the text of a kept document to null; an attribute stage may "
                                      "edit the text, not remove it")
        edit = None if same or before is None else text_spans(before, after)
        spans.append(edit)
        literals.append(after if not same and edit is None else None)
    return pl.DataFrame({"text_spans": spans, "text_literal": literals}, schema=TEXT_EDIT_SCHEMA)


def _edited_text(old: pl.Series, edits: pl.DataFrame) -> pl.Series:
    if edits["text_spans"].null_count() == edits.height and edits["text_literal"].null_count() == edits.height:
        return old
    texts = [
        literal if literal is not None else apply_spans(before, spans) if spans is not None else before
        for before, spans, literal in zip(old.to_list(), edits["text_spans"].to_list(), edits["text_literal"].to_list())
    ]
    return pl.Series(old.name, texts, dtype=old.dtype)


# ---- writing ------------------------------------------------------------------------------------


def attribute_rows(stage: str, upstream: pl.DataFrame, kept: pl.DataFrame) -> pl.DataFrame:
    """The attribute rows of `kept`, the documents `stage` kept of `upstream` (one batch of each),
    checked against the contract in the module docstring."""
    added = [c for c in kept.columns if c not in upstream.columns]
    if kept.columns[:len(upstream.columns)] != upstream.columns or len(kept.columns) != len(upstream.columns) + len(added):
        raise AttributeTableError(f"{stage} must keep every column of its input in order and append its own: "
                                  f"input {upstream.columns}, output {kept.columns}")
    changed = [c for c in upstream.columns if upstream.schema[c] != kept.schema[c]]
    if changed:
        raise AttributeTableError(f"{stage} changed the dtype of {changed}; an attribute stage may only add columns")
    before = upstream.filter(pl.col("doc_id").is_in(kept["doc_id"].implode()))
    if not before["doc_id"].equals(kept["doc_id"]):
        raise AttributeTableError(f"{stage} reordered or repeated documents of its input; its attribute table "
                                  f"must list its kept documents in input order")
    shared = [c for c in upstream.columns if c != "text"]
    if not before.select(shared).equals(kept.select(shared)):
        moved = [c for c in shared if not before[c].equals(kept[c])]
        raise AttributeTableError(f"{stage} changed the column(s) {moved} of kept documents; an attribute stage may "
                                  f"edit only the text")
    edits = (text_edits(before["text"], kept["text"]) if "text" in kept.columns
             else pl.DataFrame(schema=TEXT_EDIT_SCHEMA).clear(kept.height))
    return pl.concat([kept.select("doc_id"), edits, kept.select(added)], how="horizontal")


def publish_attributes(root: DataRoot, stage: str, partition: str, upstream: pl.DataFrame,
                       kept: pl.DataFrame) -> tuple[str, str]:
    """Write `stage`'s attribute table of one file (atomically); returns its key and sha256."""
    key = attributes_key(stage, partition)
    return key, root.write_parquet(key, attribute_rows(stage, upstream, kept))


# ---- reading ------------------------------------------------------------------------------------


class _Verdicts:
    """An attribute table read in step with the table it narrows: `take(ids)` returns the rows of
    the next batch's kept documents (a prefix of what is left, since both tables are in the same
    order), holding at most one read batch beyond them."""

    def __init__(self, path: Any, rows: int):
        self.path = path
        self.batches = named_batches(parquet_batches(path, rows), path)
        self.pending = next(self.batches)
        self.done = False

    def take(self, ids: pl.Series) -> pl.DataFrame:
        wanted = ids.implode()
        while not self.done and (self.pending.height == 0 or self.pending["doc_id"].is_in(wanted).all()):
            more = next(self.batches, None)
            if more is None:
                self.done = True
            else:
                self.pending = pl.concat([self.pending, more])
        inside = self.pending["doc_id"].is_in(wanted)
        count = self.pending.height if inside.all() else int(inside.arg_min())
        taken, self.pending = self.pending.head(count), self.pending.slice(count)
        return taken

    def finish(self) -> None:
        if self.pending.height or next(self.batches, None) is not None:
            raise AttributeTableError(f"{self.path}: doc ids that the table it narrows does not hold in that order, "
                                      f"e.g. {self.pending['doc_id'][0] if self.pending.height else '?'}; rebuild the stage")


def _narrowed(batches: Iterator[pl.DataFrame], path: Any, rows: int) -> Iterator[pl.DataFrame]:
    """Each batch filtered to the documents the attribute table at `path` keeps, edited and extended."""
    verdicts = _Verdicts(path, rows)
    for batch in batches:
        taken = verdicts.take(batch["doc_id"])
        kept = batch.filter(pl.col("doc_id").is_in(taken["doc_id"].implode()))
        if not kept["doc_id"].equals(taken["doc_id"]):
            raise AttributeTableError(f"{path}: its rows are out of step with the table it narrows; rebuild the stage")
        if "text" in kept.columns:
            kept = kept.with_columns(_edited_text(kept["text"], taken.select(list(TEXT_EDIT_SCHEMA))))
        yield pl.concat([kept, taken.drop("doc_id", *TEXT_EDIT_SCHEMA)], how="horizontal")
    verdicts.finish()


def stage_columns(root: DataRoot, stage: str, partition: str) -> list[str]:
    """The columns of `stage`'s kept documents of one file, read from the tables' schemas alone."""
    names = []
    while stage in ATTRIBUTE_STAGES:
        names = [c for c in _schema(root.local_path(attributes_key(stage, partition))).names
                 if c != "doc_id" and c not in TEXT_EDIT_SCHEMA] + names
        stage = ATTRIBUTE_STAGES[stage]
    return _schema(root.local_path(documents_key(stage, partition))).names + names


def check_row_count(root: DataRoot, stage: str, partition: str, path: Any) -> None:
    """Raise DamagedTableError when the table at `path` holds another number of rows than `stage`
    recorded writing (its stats file's `docs_out`; no stats file, no check). Read from the Parquet
    footer alone: a row removed from one table of a chain is blamed on that table, not on the
    attribute table that narrows it."""
    key = stats_key(stage, partition)
    if not root.exists(key):
        return
    with reading_table(path):
        rows = pq.ParquetFile(path).metadata.num_rows
    wrote = root.read_json(key).get("docs_out")
    if isinstance(wrote, int) and rows != wrote:
        raise DamagedTableError(f"{path}: {rows} rows, but {stage} wrote {wrote} ({root.display(key)}); the table "
                                f"changed after it was written: materialize {stage} again")


def _schema(path: Any):
    with reading_table(path):
        return pq.read_schema(path)


def stage_batches(root: DataRoot, stage: str, partition: str, rows: int,
                  columns: list[str] | None = None, max_bytes: int | None = None) -> Iterator[pl.DataFrame]:
    """The kept documents of `stage` for one input file, in frames of at most `rows` rows (and, with
    `max_bytes`, cut from text-table frames of at most that many bytes of strings, `parquet_batches`):
    the rows, columns and dtypes the stage produced. A text stage's table is read as it is; an attribute
    stage's is its text table's record batches, each narrowed by every attribute table from there to
    `stage`, so memory is a batch's, never a file's. Frames without rows are skipped (a file without
    kept documents: one empty frame with the schema). With `columns`, only those (in that order),
    and the text table's other columns are not read. A missing table raises here, before the first
    frame is asked for."""
    chain = []
    while stage in ATTRIBUTE_STAGES:
        chain.append(stage)
        stage = ATTRIBUTE_STAGES[stage]
    paths = [root.local_path(attributes_key(s, partition)) for s in reversed(chain)]
    text_path = root.local_path(documents_key(stage, partition))
    for table_stage, path in [(stage, text_path), *zip(reversed(chain), paths)]:
        check_row_count(root, table_stage, partition, path)
    if not paths:
        return named_batches(parquet_batches(text_path, rows, columns, max_bytes), text_path)
    read = None if columns is None else [c for c in _schema(text_path).names if c in columns or c == "doc_id"]
    batches = named_batches(parquet_batches(text_path, rows, read, max_bytes), text_path)
    for path in paths:
        batches = _narrowed(batches, path, rows)
    return _without_empty_frames(batches if columns is None else (b.select(columns) for b in batches))


def _without_empty_frames(batches: Iterator[pl.DataFrame]) -> Iterator[pl.DataFrame]:
    empty = None
    for batch in batches:
        if batch.height:
            empty = False
            yield batch
        elif empty is None:
            empty = batch
    if empty is not None and empty is not False:
        yield empty


def read_stage_documents(root: DataRoot, stage: str, partition: str,
                         columns: list[str] | None = None) -> pl.DataFrame:
    """`stage_batches` of one file as one frame (or only `columns` of it). A text stage's table is
    read whole, and columns of an attribute stage's own table alone (doc_id, a score) from it,
    without the text."""
    if stage not in ATTRIBUTE_STAGES:
        return root.read_parquet(documents_key(stage, partition), columns=columns)
    if columns is not None:
        path = root.local_path(attributes_key(stage, partition))
        if set(columns) <= set(_schema(path).names) - set(TEXT_EDIT_SCHEMA):
            check_row_count(root, stage, partition, path)
            with reading_table(path):
                return pl.read_parquet(path, columns=columns)
    frames = list(stage_batches(root, stage, partition, READ_ROWS, columns))
    return pl.concat(frames) if len(frames) > 1 else frames[0]


def write_stage_documents(root: DataRoot, stage: str, partition: str, docs: pl.DataFrame) -> None:
    """Write `docs` as `stage`'s kept documents of one file, for a test or benchmark that starts the
    funnel mid-way: a text stage's table as it is; for an attribute stage, the provenance and text
    columns as its text table, every attribute stage before it keeping every document, and its own
    attribute table adding the other columns (which must follow those)."""
    if stage not in ATTRIBUTE_STAGES:
        root.write_parquet(documents_key(stage, partition), docs)
        return
    text = docs.select([c for c in docs.columns if c in PROVENANCE_COLUMNS or c == "text"])
    chain = [stage]
    while chain[-1] in ATTRIBUTE_STAGES:
        chain.append(ATTRIBUTE_STAGES[chain[-1]])
    root.write_parquet(documents_key(chain[-1], partition), text)
    for level in reversed(chain[1:-1]):
        publish_attributes(root, level, partition, text, text)
    publish_attributes(root, stage, partition, text, docs)
