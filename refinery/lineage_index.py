"""Building the lineage index: from a token in a shard back to its document, URL, source record and
funnel history (refinery/lineage.py answers the queries).

The `lineage_index` asset writes, in two passes whose work is per file (docs/formats.md has the layout):

- `lineage/documents/<input shard>.arrow`, one per input file: its clean documents without their
  text (`text_bytes` instead), sorted by `record_index`, as one Arrow IPC record batch: the
  provenance columns and every per-stage column (language and score, dedup cluster and size,
  quality score, PII counts, ...). A doc_id names its input shard and record (`make_doc_id`), so a
  document is found without any corpus-wide table: open its input file's part and binary-search
  the memory-mapped `record_index` column.
- `lineage/final/<bucket>/shard-NNNNN.rows`, one per final shard, built from that shard's own
  `.entries.parquet` and only the documents its entries hold, as a rows file (`write_rows`): a
  JSON line per document with its columns, stored once however many windows of it the shard holds,
  a table of their byte offsets, and per entry, in entry order, three u32 values (its document's
  line, window, n_windows) in columns; each line deflated on its own against a small dictionary.
  A final-shard query reads one entry of it with a few small reads and the standard library: with
  the shard's index read the same way (refinery/shard_header.py), a `refinery lineage` command line
  imports neither numpy nor pyarrow.
  `lineage/final/<bucket>/index.json` lists each file's entries, bytes and sha256.
- `lineage/index.json`, small: counts, the column list, and per bucket the sha256 of the final
  shards' index.json it was built against. Written last, so a build that fails part-way leaves no
  index to trust.

Each pass is a list of independent tasks (a task per input file, then a task per final shard) that
`build_lineage_index` hands to a `refinery.tasks.RunTasks`: in this process, or fanned out over
`partitions.workers` processes by the asset; the files are the same bytes either way. Memory of a
task is one input file's documents (pass 1) or one shard's entries and their documents (pass 2),
plus the mapped pages of the `OPEN_PARTS` parts its worker keeps open; never the corpus. The work
is linear in documents and entries.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import time
import zlib
from typing import TYPE_CHECKING, Any, Callable

from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE, PROVENANCE_COLUMNS, input_shards
from refinery.layout import (LINEAGE_DOCUMENTS_PREFIX, LINEAGE_INDEX_KEY, bucket_lineage_key, documents_part_key,
                             final_index_key, kept_documents_key, shard_lineage_key)
from refinery.storage import DataRoot, sha256_file
from refinery.storage.damaged import reading_table
from refinery.tasks import RunTasks, in_process

# numpy, polars and pyarrow are imported by the functions that use them (building the index, a
# tokenized shard's query), not here: a final-shard query reads only JSON and the shard's files, and
# those imports cost a `refinery lineage` command line 0.3-0.5 s (bench/RESULTS.md).
if TYPE_CHECKING:
    import numpy as np
    import polars as pl

LINEAGE_VERSION = 5
SHARD_STAGES = ("final", "tokenized")
# The entry columns a final shard's lineage file holds before its document's columns.
ENTRY_COLUMNS = ["window", "n_windows"]
# Input files' parts a build keeps open at once (memory-mapped: only touched pages are resident).
OPEN_PARTS = 256
# `make_doc_id`: `<input shard key>/<record index>`; group 1 is the key, group 2 the record.
_DOC_ID = r"^(.+)/(\d+)$"


class LineageError(ValueError):
    """A lineage query that cannot be answered: unknown shard, offset outside it, missing index."""


# --------------------------------------------------------------------------------------------------
# Building the index
# --------------------------------------------------------------------------------------------------


def _write_arrow(root: DataRoot, key: str, df: pl.DataFrame) -> dict[str, Any]:
    """`df` as an uncompressed Arrow IPC file of one record batch (so it memory-maps without a
    copy); returns its rows, bytes and sha256. Same frame, same bytes."""
    import pyarrow as pa

    table = df.rechunk().to_arrow()
    with root.writer(key) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        size = tmp.stat().st_size
        digest = sha256_file(tmp)
    return {"rows": df.height, "bytes": size, "sha256": digest}


ROWS_MAGIC = b"RFLR"
ROWS_VERSION = 3
# A document's line is deflated on its own (so one is read without the others) against a preset
# dictionary: the first DICTIONARY_BYTES of the shard's lines, stored once after the header. The
# lines repeat their file path, column keys and URL prefixes, which the dictionary holds; on the
# demo grown to 5k documents it cut the rows files 3.4x (2 KiB did as well as 8 KiB, and costs less
# per file).
DICTIONARY_BYTES = 2048
# magic, version, documents, entries, where the document offsets start
ROWS_TRAILER = struct.Struct("<4sIQQQ")
ROW_SPAN = struct.Struct("<QQ")  # a document line's first byte and the next line's
ENTRY_FIELD = struct.Struct("<I")  # one value of an entry column: document ordinal, window, n_windows


def write_rows(root: DataRoot, key: str, entries: pl.DataFrame, docs: pl.DataFrame) -> dict[str, Any]:
    """A final shard's lineage as a rows file. `entries` (doc_id, then `ENTRY_COLUMNS`) is one row
    per entry in entry order; `docs` the columns of each of their documents, one row per distinct
    doc_id in order of first appearance. Written: a header line (JSON: the document columns), a
    line per document (a JSON array of its values in column order, encoded by polars), the lines'
    byte offsets (u64, documents + 1), then three u32 columns over the entries (the entry's
    document, as its line's ordinal; its window; n_windows), and a trailer (magic, version,
    documents, entries, where the offsets start). Each line is stored raw-deflated against the
    header's preset dictionary (`DICTIONARY_BYTES`), which follows the header line. A document's
    columns are stored once however many windows of it the shard holds. `read_row` reads one entry
    back with the standard library (zlib, json), without pyarrow or numpy. Same frames, same bytes."""
    import numpy as np
    import polars as pl

    # Each value's JSON is its one-field struct's encoding less `{"<column>":` and `}`.
    values = [pl.struct(pl.col(c)).struct.json_encode().str.slice(len(json.dumps(c, ensure_ascii=False)) + 2).str.head(-1)
              for c in docs.columns]
    lines = docs.select(pl.concat_str([pl.lit("["), pl.concat_str(values, separator=","), pl.lit("]\n")]).alias("row"))["row"]
    plain = [line.encode() for line in lines.to_list()]
    dictionary = bytearray()
    for line in plain:
        if len(dictionary) >= DICTIONARY_BYTES:
            break
        dictionary += line
    dictionary = bytes(dictionary[:DICTIONARY_BYTES])
    header = json.dumps({"columns": docs.columns, "dictionary_bytes": len(dictionary)}, ensure_ascii=False).encode() + b"\n"
    if docs.height and len(json.loads(lines[0])) != docs.width:
        raise LineageError(f"{root.display(key)}: a row did not encode to its {docs.width} columns; a column name polars "
                           f"escapes differently from JSON? {docs.columns}")
    ordinals = entries.select("doc_id").join(docs.select("doc_id").with_row_index("ordinal"), on="doc_id", how="left",
                                             maintain_order="left")["ordinal"]
    if ordinals.null_count() or not entries["doc_id"].equals(docs["doc_id"].gather(ordinals.fill_null(0)), check_names=False):
        raise LineageError(f"{root.display(key)}: an entry's document is not among the shard's documents")
    deflated = []
    for line in plain:
        packer = zlib.compressobj(9, zlib.DEFLATED, -15, zdict=dictionary) if dictionary else zlib.compressobj(9, zlib.DEFLATED, -15)
        deflated.append(packer.compress(line) + packer.flush())
    body = dictionary + b"".join(deflated)
    offsets = np.zeros(docs.height + 1, dtype="<u8")
    np.cumsum(np.array([len(d) for d in deflated], dtype="<u8"), out=offsets[1:])
    offsets += len(header) + len(dictionary)
    columns = [ordinals.to_numpy(), *(entries[c].to_numpy() for c in ENTRY_COLUMNS)]
    if any(len(col) and (col.min() < 0 or col.max() > 0xFFFFFFFF) for col in columns):
        raise LineageError(f"{root.display(key)}: an entry's window or document ordinal is outside u32")
    with root.writer(key) as tmp:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(body)
            f.write(offsets.tobytes())
            for col in columns:
                f.write(col.astype("<u4").tobytes())
            f.write(ROWS_TRAILER.pack(ROWS_MAGIC, ROWS_VERSION, docs.height, entries.height, len(header) + len(body)))
        size = tmp.stat().st_size
        digest = sha256_file(tmp)
    return {"rows": entries.height, "documents": docs.height, "bytes": size, "sha256": digest}


def read_row(path: str | os.PathLike, row: int) -> dict[str, Any]:
    """Entry `row` of the rows file at `path` (`write_rows`): its `ENTRY_COLUMNS`, then its
    document's columns, by name."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < ROWS_TRAILER.size:
            raise LineageError(f"{path}: {size} bytes, too short for a lineage rows file; materialize lineage_index again")
        f.seek(size - ROWS_TRAILER.size)
        magic, version, docs, entries, at = ROWS_TRAILER.unpack(f.read(ROWS_TRAILER.size))
        columns_at = at + 8 * (docs + 1)  # past the u64 document offsets
        if (magic != ROWS_MAGIC or version != ROWS_VERSION
                or columns_at + ENTRY_FIELD.size * (1 + len(ENTRY_COLUMNS)) * entries != size - ROWS_TRAILER.size):
            raise LineageError(f"{path}: not a lineage rows file of version {ROWS_VERSION}; materialize lineage_index again")
        if not 0 <= row < entries:
            raise LineageError(f"{path}: row {row} asked of {entries}; the file and its shard disagree, materialize lineage_index again")
        fields = []
        for column in range(1 + len(ENTRY_COLUMNS)):
            f.seek(columns_at + ENTRY_FIELD.size * (column * entries + row))
            fields.append(ENTRY_FIELD.unpack(f.read(ENTRY_FIELD.size))[0])
        ordinal, *side = fields
        if ordinal >= docs:
            raise LineageError(f"{path}: entry {row} names document {ordinal} of {docs}; materialize lineage_index again")
        f.seek(at + 8 * ordinal)
        start, end = ROW_SPAN.unpack(f.read(ROW_SPAN.size))
        f.seek(0)
        header = json.loads(f.readline())
        dictionary = f.read(header["dictionary_bytes"])
        f.seek(start)
        unpacker = zlib.decompressobj(-15, zdict=dictionary) if dictionary else zlib.decompressobj(-15)
        try:
            values = json.loads(unpacker.decompress(f.read(end - start)))
        except (zlib.error, ValueError) as err:
            raise LineageError(f"{path}: document {ordinal}'s line does not decode ({err}); materialize lineage_index again") from None
        names = header["columns"]
    return {**dict(zip(ENTRY_COLUMNS, side)), **dict(zip(names, values))}


def _read_arrow(root: DataRoot, key: str):
    """The Arrow table in `key`, memory-mapped (zero-copy: only the pages a caller touches are read)."""
    import pyarrow as pa

    path = str(root.local_path(key))
    with reading_table(path):
        return pa.ipc.open_file(pa.memory_map(path)).read_all()


def write_documents_part(root: DataRoot, input_key: str, stage: str = CLEAN_STAGE) -> dict[str, Any]:
    """Pass 1, per input file: its clean documents without text, sorted by record_index, to
    `documents_part_key`. Checks that every doc_id is `<input_key>/<record_index>` (`make_doc_id`),
    which is how a shard entry finds its document here (through the attribute tables for a stage
    that stores none of its own text). Returns rows, bytes, sha256 and the schema."""
    import polars as pl

    from refinery.stages.attributes import READ_BYTES, READ_ROWS, stage_batches, stage_columns

    names = stage_columns(root, stage, input_key)
    # A record batch of the text at a time; what is held is the file's rows without their text.
    docs = pl.concat([
        batch.select([c for c in names if c != "text"] + [pl.col("text").str.len_bytes().alias("text_bytes")])
        for batch in stage_batches(root, stage, input_key, READ_ROWS, max_bytes=READ_BYTES)
    ]).sort("record_index")
    origin = docs.select(pl.col("doc_id").str.extract(_DOC_ID, 1).alias("key"),
                         pl.col("doc_id").str.extract(_DOC_ID, 2).cast(pl.Int64, strict=False).alias("record"))
    wrong = ((origin["key"] != input_key) | (origin["record"] != docs["record_index"])).fill_null(True)
    if wrong.any():
        row = docs.filter(wrong).row(0, named=True)
        raise LineageError(f"{root.display(kept_documents_key(stage, input_key))}: doc_id {row['doc_id']!r} with record_index "
                           f"{row['record_index']} is not {input_key!r}/<record_index>; rebuild the documents")
    repeated = docs["record_index"].is_duplicated()
    if repeated.any():
        raise LineageError(f"doc_id repeats in the clean table of {input_key!r}, e.g. {docs.filter(repeated)['doc_id'][0]!r}")
    written = _write_arrow(root, documents_part_key(input_key), docs)
    return {**written, "key": documents_part_key(input_key), "schema": docs.schema}


def open_documents_part(root: DataRoot, input_key: str) -> tuple[Any, np.ndarray] | None:
    """(memory-mapped Arrow table, its record_index column as a zero-copy array) of an input
    file's part, or None when there is none."""
    key = documents_part_key(input_key)
    if not root.exists(key):
        return None
    table = _read_arrow(root, key)
    return table, table.column("record_index").to_numpy()


def documents_by_id(doc_ids: pl.Series, open_part: Callable[[str], tuple[Any, np.ndarray] | None]) -> pl.DataFrame:
    """The lineage rows of `doc_ids`, in their order (repeats allowed), each found in its input
    file's part (`open_part(input_key)`, see `open_documents_part`) by binary search over the
    record_index column: the work and memory are those of the rows asked for."""
    import numpy as np
    import polars as pl
    import pyarrow as pa

    origin = pl.DataFrame({"doc_id": doc_ids}).with_row_index("at").with_columns(
        pl.col("doc_id").str.extract(_DOC_ID, 1).alias("key"),
        pl.col("doc_id").str.extract(_DOC_ID, 2).cast(pl.Int64, strict=False).fill_null(-1).alias("record"),
    )
    taken, order = [], []
    for key, ats, records in origin.group_by("key", maintain_order=True).agg("at", "record").iter_rows():
        part = open_part(key) if key is not None else None
        numbers = part[1] if part is not None else np.zeros(0, dtype=np.int64)
        records = np.asarray(records, dtype=np.int64)
        rows = np.minimum(np.searchsorted(numbers, records), max(len(numbers) - 1, 0))
        missing = numbers[rows] != records if len(numbers) else np.ones(len(records), dtype=bool)
        if missing.any():
            raise _not_in_clean_tables(origin.filter(pl.col("key").eq_missing(key))["doc_id"][int(np.argmax(missing))])
        taken.append(part[0].take(rows))
        order.append(np.asarray(ats))
    if not taken:
        return pl.DataFrame({"doc_id": doc_ids})
    found = pl.from_arrow(pa.concat_tables(taken, promote_options="permissive"))[np.argsort(np.concatenate(order), kind="stable")]
    wrong = found["doc_id"] != doc_ids
    if wrong.any():  # same input file and record number, but another spelling of the doc_id
        raise _not_in_clean_tables(doc_ids.filter(wrong)[0])
    return found


def _not_in_clean_tables(doc_id: str) -> LineageError:
    return LineageError(
        f"doc_id {doc_id!r} is in the shards but no clean table has it; the shards and the clean documents "
        f"come from different runs: materialize tokenized_shards, shuffled_shards and then lineage_index again"
    )


def write_shard_lineage(root: DataRoot, ref: dict[str, Any], columns: pl.DataFrame,
                        open_part: Callable[[str], tuple[Any, np.ndarray] | None]) -> dict[str, Any]:
    """Pass 2, per final shard: verify its files, then write `shard_lineage_key`: one row per entry
    of the shard's own `.entries.parquet`, its window and n_windows and its document's columns
    (`columns`: an empty frame of the corpus-wide document schema, so every file has every column)."""
    import polars as pl

    from refinery.shard_format import ShardReader

    local = str(root.local_path(ref["prefix"] + ".idx"))[: -len(".idx")]
    ShardReader(local).verify(ref["sha256"])
    entries = pl.read_parquet(local + ".entries.parquet", columns=["doc_id", *ENTRY_COLUMNS])
    docs = pl.concat([columns, documents_by_id(entries["doc_id"].unique(maintain_order=True), open_part)],
                     how="diagonal_relaxed")
    written = write_rows(root, shard_lineage_key(ref["prefix"]), entries, docs)
    return {"shard": ref["prefix"], "key": shard_lineage_key(ref["prefix"]), "entries": written["rows"],
            "documents": written["documents"], "bytes": written["bytes"], "sha256": written["sha256"]}


def documents_part_task(root: DataRoot, item: tuple[str, str], cache: dict) -> dict[str, Any]:
    """Pass 1 as a task (`refinery.tasks`): `write_documents_part` of (input key, stage)."""
    return write_documents_part(root, *item)


def shard_lineage_task(root: DataRoot, item: tuple[dict[str, Any], pl.DataFrame], cache: dict) -> dict[str, Any]:
    """Pass 2 as a task: `write_shard_lineage` of (final shard's ref, the document columns). The
    input files' parts stay open in the worker's cache across its shards, the most recently used
    `OPEN_PARTS`: a shard's entries come from all over the corpus, and reopening a part costs more
    than looking rows up in it."""
    open_part = cache.setdefault("lineage_open_part",
                                 functools.lru_cache(maxsize=OPEN_PARTS)(functools.partial(open_documents_part, root)))
    return write_shard_lineage(root, item[0], item[1], open_part)


def build_lineage_index(root: DataRoot, cfg: RefineryConfig, stage: str = CLEAN_STAGE,
                        log: Callable[[str], None] | None = None, run_tasks: RunTasks | None = None) -> dict[str, Any]:
    """Pass 1, a task per input file, then pass 2, a task per final shard of every bucket (each
    bucket's index.json read first, each shard verified against it by its task), both run by
    `run_tasks` (default: in this process; the bytes are the same whatever runs them), then the
    listings and the top-level index, written here. `log` gets a line per pass (an asset passes
    its context's logger). Returns the index, with `sha256` (of index.json, which names the sha256
    of every listing and so of every file), `wall_s` and `tasks` (how many tasks both passes ran)."""
    import polars as pl

    t0 = time.perf_counter()
    run_tasks = run_tasks or in_process(root)
    log = log or (lambda line: None)
    if root.exists(LINEAGE_INDEX_KEY):
        root.delete(LINEAGE_INDEX_KEY)  # a build that fails part-way must not leave a stale index behind
    keys = [shard.key for shard in input_shards(cfg)]
    log(f"lineage: documents of {len(keys)} input files")
    parts = dict(zip(keys, run_tasks(documents_part_task, [(key, stage) for key in keys])))
    schemas = [pl.DataFrame(schema=part.pop("schema")) for part in parts.values()]
    columns = pl.concat(schemas, how="diagonal_relaxed") if schemas else pl.DataFrame(schema=dict.fromkeys(PROVENANCE_COLUMNS, pl.String))
    documents_listing = root.write_json(f"{LINEAGE_DOCUMENTS_PREFIX}/index.json", parts)
    written = {f"{LINEAGE_DOCUMENTS_PREFIX}/index.json", *(p["key"] for p in parts.values())}
    indexes: dict[str, tuple[dict[str, Any], str]] = {}
    for bucket in cfg.buckets:
        if root.exists(final_index_key(bucket)):
            raw = root.read_bytes(final_index_key(bucket))
            indexes[bucket] = json.loads(raw), hashlib.sha256(raw).hexdigest()
    refs = [ref for bucket_index, _ in indexes.values() for ref in bucket_index["shards"]]
    log(f"lineage: {len(refs)} final shards of {len(indexes)} buckets")
    done = iter(run_tasks(shard_lineage_task, [(ref, columns) for ref in refs]))
    buckets: dict[str, dict[str, Any]] = {}
    for bucket, (bucket_index, bucket_sha) in indexes.items():
        shards = [next(done) for _ in bucket_index["shards"]]
        listing = root.write_json(bucket_lineage_key(bucket), {"index_sha256": bucket_sha, "shards": shards})
        written |= {bucket_lineage_key(bucket), *(s["key"] for s in shards)}
        buckets[bucket] = {"index_sha256": bucket_sha, "tokens": bucket_index["tokens"],
                           "entries": bucket_index["entries"], "shards": len(shards),
                           "lineage_bytes": sum(s["bytes"] for s in shards), "listing_sha256": listing}
    for stale in root.list("lineage"):
        if stale not in written:
            root.delete(stale)  # earlier layouts, removed inputs, shards of a larger earlier run
    index = {
        "version": LINEAGE_VERSION,
        "documents": sum(p["rows"] for p in parts.values()),
        "documents_parts": len(parts),
        "documents_bytes": sum(p["bytes"] for p in parts.values()),
        "documents_listing_sha256": documents_listing,
        "columns": columns.columns,
        "buckets": buckets,
        "final_shards_verified": sum(b["shards"] for b in buckets.values()),
    }
    sha = root.write_json(LINEAGE_INDEX_KEY, index)
    return {**index, "sha256": sha, "wall_s": time.perf_counter() - t0, "tasks": len(keys) + len(refs)}
