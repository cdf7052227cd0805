"""From a token in a shard back to its document, URL, source record and funnel history.

The `lineage_index` asset writes, in two passes whose work is per file (docs/formats.md has the layout):

- `lineage/documents/<input shard>.arrow`, one per input file: its clean documents without their
  text (`text_bytes` instead), sorted by `record_index`, as one Arrow IPC record batch: the
  provenance columns and every per-stage column (language and score, dedup cluster and size,
  quality score, PII counts, ...). A doc_id names its input shard and record (`make_doc_id`), so a
  document is found without any corpus-wide table: open its input file's part and binary-search
  the memory-mapped `record_index` column.
- `lineage/final/<bucket>/shard-NNNNN.rows`, one per final shard, built from that shard's own
  `.entries.parquet` and only the documents its entries hold: one row per entry, in entry order,
  with the entry's window and n_windows and its document's columns, as a rows file (`write_rows`: a
  JSON line per row and a table of their byte offsets). A final-shard query reads one row of it
  with three small reads and the standard library: with the shard's index read the same way
  (refinery/shard_header.py), a `refinery lineage` command line imports neither numpy nor pyarrow.
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

`resolve_token(root, cfg, shard, offset)` is the API; `refinery lineage` prints it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE, PROVENANCE_COLUMNS, input_shards
from refinery.layout import (LINEAGE_DOCUMENTS_PREFIX, LINEAGE_INDEX_KEY, TOKENIZER_KEY, bucket_lineage_key,
                             bucket_shards_prefix, documents_part_key, final_index_key, kept_documents_key,
                             shard_index_key, shard_lineage_key)
from refinery.shard_header import ShardFormatError, locate_token, read_tokens
from refinery.stages import registry
from refinery.storage import DataRoot, sha256_file
from refinery.storage.damaged import reading_table
from refinery.tasks import RunTasks, in_process
from refinery.tokenizer_file import TokenizeError, read_decoder

# numpy, polars and pyarrow are imported by the functions that use them (building the index, a
# tokenized shard's query), not here: a final-shard query reads only JSON and the shard's files, and
# those imports cost a `refinery lineage` command line 0.3-0.5 s (bench/RESULTS.md).
if TYPE_CHECKING:
    import numpy as np
    import polars as pl

LINEAGE_VERSION = 3
SHARD_STAGES = ("final", "tokenized")
# The entry columns a final shard's lineage file holds before its document's columns.
ENTRY_COLUMNS = ["window", "n_windows"]
# Input files' parts a build keeps open at once (memory-mapped: only touched pages are resident).
OPEN_PARTS = 256
# Tokens of decoded text shown on each side of the traced token (never across its entry's edges).
CONTEXT_TOKENS = 16

# Which funnel stage recorded which document column; columns not listed show under "other".
# (verdict, the source `skip` name that bypasses it, the columns it adds), refinery/stages/registry.py.
FUNNEL_STAGES: list[tuple[str, str | None, list[str]]] = [(v.name, v.skip, list(v.adds)) for v in registry.verdicts()]
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
ROWS_VERSION = 1
ROWS_TRAILER = struct.Struct("<4sIQ")  # magic, version, where the row offsets start
ROW_SPAN = struct.Struct("<QQ")  # a row's first byte and the next row's


def write_rows(root: DataRoot, key: str, df: pl.DataFrame) -> dict[str, Any]:
    """`df` as a rows file: a header line (JSON: the columns), one line per row (a JSON array of its
    values in column order, encoded by polars), the rows' byte offsets (u64, rows + 1), and a
    trailer (magic, version, where the offsets start). `read_row` reads one row back without
    pyarrow or numpy. About the size of the same frame as Arrow IPC. Same frame, same bytes."""
    import numpy as np
    import polars as pl

    # Each value's JSON is its one-field struct's encoding less `{"<column>":` and `}`.
    values = [pl.struct(pl.col(c)).struct.json_encode().str.slice(len(json.dumps(c, ensure_ascii=False)) + 2).str.head(-1)
              for c in df.columns]
    lines = df.select(pl.concat_str([pl.lit("["), pl.concat_str(values, separator=","), pl.lit("]\n")]).alias("row"))["row"]
    header = json.dumps({"columns": df.columns}, ensure_ascii=False).encode() + b"\n"
    if df.height and len(json.loads(lines[0])) != df.width:
        raise LineageError(f"{root.display(key)}: a row did not encode to its {df.width} columns; a column name polars "
                           f"escapes differently from JSON? {df.columns}")
    body = "".join(lines.to_list()).encode()
    offsets = np.zeros(df.height + 1, dtype="<u8")
    np.cumsum(lines.str.len_bytes().to_numpy(), out=offsets[1:])
    offsets += len(header)
    with root.writer(key) as tmp:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(body)
            f.write(offsets.tobytes())
            f.write(ROWS_TRAILER.pack(ROWS_MAGIC, ROWS_VERSION, len(header) + len(body)))
        size = tmp.stat().st_size
        digest = sha256_file(tmp)
    return {"rows": df.height, "bytes": size, "sha256": digest}


def read_row(path: str | os.PathLike, row: int) -> dict[str, Any]:
    """Row `row` of the rows file at `path` (`write_rows`), by column name."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < ROWS_TRAILER.size:
            raise LineageError(f"{path}: {size} bytes, too short for a lineage rows file; materialize lineage_index again")
        f.seek(size - ROWS_TRAILER.size)
        magic, version, at = ROWS_TRAILER.unpack(f.read(ROWS_TRAILER.size))
        rows = (size - ROWS_TRAILER.size - at) // 8 - 1
        if magic != ROWS_MAGIC or version != ROWS_VERSION or rows < 0:
            raise LineageError(f"{path}: not a lineage rows file of version {ROWS_VERSION}; materialize lineage_index again")
        if not 0 <= row < rows:
            raise LineageError(f"{path}: row {row} asked of {rows}; the file and its shard disagree, materialize lineage_index again")
        f.seek(at + 8 * row)
        start, end = ROW_SPAN.unpack(f.read(ROW_SPAN.size))
        f.seek(0)
        columns = json.loads(f.readline())["columns"]
        f.seek(start)
        values = json.loads(f.read(end - start))
    return dict(zip(columns, values))


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
    docs = pl.concat([columns, documents_by_id(entries["doc_id"], open_part)], how="diagonal_relaxed")
    written = write_rows(root, shard_lineage_key(ref["prefix"]), pl.concat([entries.drop("doc_id"), docs], how="horizontal"))
    return {"shard": ref["prefix"], "key": shard_lineage_key(ref["prefix"]), "entries": written["rows"],
            "bytes": written["bytes"], "sha256": written["sha256"]}


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


# --------------------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------------------

_SHARD_NAME = re.compile(r"^(?:shards/(?P<stage>[a-z]+)/)?(?P<bucket>[A-Za-z0-9_.-]+)/(?:(?P<part>[A-Za-z0-9_.~-]+)/)?"
                         r"(?P<shard>shard-\d{5})(?:\.\w+)*$")
_SHARD_NAMES = ("give <bucket>/shard-NNNNN or shards/final/<bucket>/shard-NNNNN (a final shard), or "
                "shards/tokenized/<bucket>/<file>/shard-NNNNN (one input file's tokenized shard)")


def parse_shard(shard: str) -> tuple[str, str, str | None, str]:
    """(stage, bucket, part, key prefix) from `web/shard-00003`, `shards/final/web/shard-00003`,
    `shards/tokenized/web/<file>/shard-00003` or a file of one; `part` is the input file's key of a
    tokenized shard (None for a final one)."""
    m = _SHARD_NAME.match(shard.strip().removesuffix(".entries.parquet"))
    if not m:
        raise LineageError(f"shard {shard!r} is not a shard name; {_SHARD_NAMES}")
    stage = m["stage"] or "final"
    if stage not in SHARD_STAGES:
        raise LineageError(f"shard {shard!r}: unknown shard stage {stage!r}; use one of {list(SHARD_STAGES)}")
    if (m["part"] is None) != (stage == "final"):
        raise LineageError(f"shard {shard!r}: {_SHARD_NAMES}")
    return stage, m["bucket"], m["part"], f"{bucket_shards_prefix(stage, m['bucket'], m['part'])}/{m['shard']}"


@dataclass(frozen=True)
class ShardDirectory:
    """One series' shards (a bucket's final shards, or one input file's tokenized shards), from its
    index.json: by prefix, (number, ref, entries before it in the series); the series' entries; and
    the index's sha256."""

    shards: dict[str, tuple[int, dict[str, Any], int]]
    names: list[str]
    entries: int
    sha256: str


def read_shard_directory(root: DataRoot, stage: str, bucket: str, part: str | None = None) -> ShardDirectory:
    key = shard_index_key(stage, bucket, part)
    try:
        raw = root.read_bytes(key)
    except FileNotFoundError:
        of = f"bucket {bucket!r}" + (f" and input file {part!r}" if part is not None else "")
        raise LineageError(f"{root.display(key)}: no {stage} shards for {of}; materialize them first") from None
    shards, before = {}, 0
    refs = json.loads(raw)["shards"]
    for number, ref in enumerate(refs):
        shards[ref["prefix"]] = (number, ref, before)
        before += ref["entries"]
    return ShardDirectory(shards, [r["prefix"].rsplit("/", 1)[-1] for r in refs], before, hashlib.sha256(raw).hexdigest())


def _read_json(root: DataRoot, key: str, missing: str) -> Any:
    try:
        return root.read_json(key)
    except FileNotFoundError:
        raise LineageError(f"{root.display(key)}: {missing}") from None


# Files whose content hash matched the one the index records, by (path, size, mtime_ns, hash): a
# query hashes each file it reads once per version of it in a process (a shard's three files and its
# lineage rows: a few hundred KB), and later queries of that file only stat it. Bounded: cleared
# when full, so a long-lived process hashes again rather than growing.
_VERIFIED: set[tuple[str, int, int, str]] = set()
MAX_VERIFIED = 100_000


def check_hash(path: str, want: str, recorded_in: str = "the bucket's index.json",
                fix: str = "rebuild it (materialize the shard asset again)",
                error: type[ValueError] = ShardFormatError) -> str:
    """`path`, once its sha256 is `want` (the hash `recorded_in` records); else `error` naming the
    file, in one line."""
    st = os.stat(path)
    seen = (str(path), st.st_size, st.st_mtime_ns, want)
    if seen not in _VERIFIED:
        if sha256_file(path) != want:
            raise error(f"{path}: content hash does not match {recorded_in}; the file changed after it was "
                        f"written; {fix}")
        if len(_VERIFIED) >= MAX_VERIFIED:
            _VERIFIED.clear()
        _VERIFIED.add(seen)
    return str(path)


def _lineage_file(path: str, want: str, listing: str) -> str:
    return check_hash(path, want, listing, "materialize lineage_index again", LineageError)


class LineageIndex:
    """The on-disk lineage index of one data root: the small index.json, and what queries reuse (the
    tokenizer, each bucket's shard directory, re-read when its file changes)."""

    def __init__(self, root: DataRoot, cfg: RefineryConfig):
        self.root, self.cfg = root, cfg
        self._decode: Callable[[list[int]], str] | None = None
        self._directories: dict[str, tuple[tuple[int, int] | None, ShardDirectory]] = {}
        self._listings: dict[str, tuple[tuple[int, int], dict[str, str]]] = {}
        self.index = _read_json(root, LINEAGE_INDEX_KEY, "no lineage index; materialize the `lineage_index` asset first")
        if self.index.get("version") != LINEAGE_VERSION:
            raise LineageError(f"{root.display(LINEAGE_INDEX_KEY)}: version {self.index.get('version')}, expected {LINEAGE_VERSION}; rebuild it")

    def directory(self, stage: str, bucket: str, part: str | None = None) -> ShardDirectory:
        """A series' shard directory, its index.json parsed once per version of the file."""
        key = shard_index_key(stage, bucket, part)
        version = file_version(self.root, key) if self.root.exists(key) else None
        cached = self._directories.get(key)
        if cached is None or cached[0] != version:
            cached = (version, read_shard_directory(self.root, stage, bucket, part))
            self._directories[key] = cached
        return cached[1]

    def listing(self, key: str, want: str | None, item: str) -> dict[str, str]:
        """A listing of lineage files (`key`: a bucket's lineage index.json, or the documents
        parts' index.json) as {name: sha256}, checked against `want` (its sha256 in
        lineage/index.json) and parsed once per version of the file; `item` names the field that
        says which file an entry lists."""
        version = file_version(self.root, key) if self.root.exists(key) else None
        if version is None:
            raise LineageError(f"{self.root.display(key)}: missing, and lineage/index.json lists it; materialize "
                               f"lineage_index again")
        cached = self._listings.get(key)
        if cached is None or cached[0] != version:
            path = _lineage_file(str(self.root.local_path(key)), want or "", self.root.display(LINEAGE_INDEX_KEY))
            with open(path, "rb") as f:
                entries = json.load(f)
            entries = entries["shards"] if "shards" in entries else list(entries.values())
            cached = (version, {e[item]: e["sha256"] for e in entries})
            self._listings[key] = cached
        return cached[1]

    def _open_part(self, input_key: str) -> tuple[Any, np.ndarray] | None:
        """`open_documents_part`, once the part's hash matches the documents listing."""
        listing_key = f"{LINEAGE_DOCUMENTS_PREFIX}/index.json"
        hashes = self.listing(listing_key, self.index.get("documents_listing_sha256"), "key")
        key = documents_part_key(input_key)
        if key in hashes and self.root.exists(key):
            _lineage_file(str(self.root.local_path(key)), hashes[key], self.root.display(listing_key))
        return open_documents_part(self.root, input_key)

    def entries_of_earlier_files(self, bucket: str, part: str) -> int:
        """Entries of the tokenized series of the bucket's input files before `part`: a bucket's entries
        are numbered across its files' series in input order (docs/formats.md, the shuffle)."""
        parts = [s.key for s in input_shards(self.cfg) if s.bucket == bucket]
        if part not in parts:
            raise LineageError(f"input file {part!r} is not one of bucket {bucket!r}'s {len(parts)} input files "
                               f"under the config's sources")
        return sum(self.directory("tokenized", bucket, p).entries for p in parts[:parts.index(part)])

    def find_shard(self, shard: str) -> tuple[str, str, int, dict[str, Any], int, str]:
        """(stage, bucket, number, shard ref, entries before it in the bucket, sha256 of its series'
        index.json)."""
        stage, bucket, part, prefix = parse_shard(shard)
        if bucket not in self.cfg.buckets:
            raise LineageError(f"shard {shard!r}: unknown bucket {bucket!r}; the config has {self.cfg.buckets}")
        directory = self.directory(stage, bucket, part)
        if prefix not in directory.shards:
            names = directory.names
            of = f"bucket {bucket!r}" + (f" input file {part!r}" if part is not None else "")
            raise LineageError(
                f"shard {shard!r}: unknown shard; {of} has {len(names)} {stage} shards"
                + (f" ({names[0]} .. {names[-1]})" if names else "")
            )
        number, ref, before = directory.shards[prefix]
        if part is not None:
            before += self.entries_of_earlier_files(bucket, part)
        return stage, bucket, number, ref, before, directory.sha256

    def document(self, doc_id: str) -> dict[str, Any]:
        """The lineage row of `doc_id`, read from its input file's part (memory-mapped), with every
        column of the index (None where that part has no such column)."""
        import polars as pl

        row = documents_by_id(pl.Series([doc_id], dtype=pl.String), self._open_part).row(0, named=True)
        return {c: row.get(c) for c in self.index["columns"]}

    def _final_entry(self, bucket: str, bucket_sha: str, prefix: str, entry: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(document row, entry's window info) of a final shard's entry: one row of the shard's lineage file."""
        built = self.index["buckets"].get(bucket, {}).get("index_sha256")
        if built != bucket_sha:
            raise LineageError(
                f"the lineage index was built from other {bucket!r} shards than the current ones "
                f"(shards/final/{bucket}/index.json changed); materialize lineage_index again"
            )
        listing_key = bucket_lineage_key(bucket)
        hashes = self.listing(listing_key, self.index["buckets"][bucket].get("listing_sha256"), "shard")
        path = str(self.root.local_path(shard_lineage_key(prefix)))
        row = read_row(_lineage_file(path, hashes.get(prefix, ""), self.root.display(listing_key)), entry)
        side = {c: row.pop(c) for c in ENTRY_COLUMNS}
        return row, side

    def decoded_window(self, ids: list[int], pos: int) -> dict[str, Any]:
        """Token `ids` decoded with the tokenizer the shards were made with (the data root's), split
        around `ids[pos]`; `error` says why there is no text when that tokenizer is unreadable."""
        if self._decode is None:
            try:
                self._decode = read_decoder(self.root, self.cfg.tokenizer.eod_token)
            except TokenizeError as err:
                return {"before": None, "token": None, "after": None, "error": str(err)}
        decode = self._decode
        return {"before": decode(ids[:pos]), "token": decode(ids[pos:pos + 1]), "after": decode(ids[pos + 1:])}

    def resolve(self, shard: str, offset: int, context: int = CONTEXT_TOKENS) -> dict[str, Any]:
        stage, bucket, number, ref, before, bucket_sha = self.find_shard(shard)
        prefix = ref["prefix"]
        try:
            local = str(self.root.local_path(prefix + ".idx"))[: -len(".idx")]  # the shard's files sit together
        except FileNotFoundError as err:
            raise ShardFormatError(f"{err}; the shard's bucket index names it, so rebuild the bucket's shards") from None
        num_tokens, span = locate_token(check_hash(local + ".idx", ref["sha256"][".idx"]), offset)
        if span is None:
            raise LineageError(f"offset {offset} is outside shard {prefix} ({num_tokens} tokens: 0..{num_tokens - 1})")
        entry, start, end = span.entry, span.start, span.end
        if stage == "final":
            doc, side = self._final_entry(bucket, bucket_sha, ref["prefix"], entry)
        else:
            import pyarrow.parquet as pq  # only a tokenized shard's entries are read from Parquet

            entries_path = check_hash(local + ".entries.parquet", ref["sha256"][".entries.parquet"])
            sidecar = pq.ParquetFile(entries_path, memory_map=True).read_row_group(0, columns=["doc_id", "window", "n_windows"])
            side = sidecar.slice(entry, 1).to_pylist()[0]
            doc = self.document(side["doc_id"])
        lo, hi = max(start, offset - context), min(end, offset + context + 1)
        window = read_tokens(check_hash(local + ".bin", ref["sha256"][".bin"]), span.code, lo, hi)
        token = window[offset - lo]
        return {
            "shard": prefix,
            "stage": stage,
            "bucket": bucket,
            "shard_number": number,
            "offset": offset,
            "token_id": token,
            "text": {"start": lo, "end": hi, **self.decoded_window(window, offset - lo)},
            "entry": entry,
            "bucket_entry": before + entry,
            "entry_start": start,
            "entry_end": end,
            "position_in_entry": offset - start,
            "in_overlap_prefix": offset - start < span.overlap,
            "window": side["window"],
            "n_windows": side["n_windows"],
            "doc_id": doc["doc_id"],
            "url": doc.get("url"),
            "source": doc.get("source"),
            "file": doc.get("file"),
            "record_index": doc.get("record_index"),
            "record_offset": doc.get("record_offset"),
            "fetch_time": doc.get("fetch_time"),
            "content_type": doc.get("content_type"),
            "text_bytes": doc.get("text_bytes"),
            "funnel": funnel_history(self.cfg, doc),
        }


def funnel_history(cfg: RefineryConfig, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each funnel stage recorded about a surviving document, in funnel order."""
    try:
        skipped = set(cfg.source(doc.get("source") or "").skip)
    except KeyError:
        skipped = set()
    claimed = set(PROVENANCE_COLUMNS) | {"text_bytes"}
    out: dict[str, dict[str, Any]] = {}
    for asset, skip_name, columns in FUNNEL_STAGES:
        record: dict[str, Any] = {"outcome": "skipped by source" if skip_name in skipped else "kept"}
        record.update({c: doc[c] for c in columns if c in doc})
        claimed.update(columns)
        out[asset] = record
    other = {k: v for k, v in doc.items() if k not in claimed}
    if other:
        out["other"] = other
    return out


# Open indexes by (data root, index file version): a query after the first reuses the parsed
# index.json and tokenizer (parsing the tokenizer's JSON alone costs ~10 ms).
_OPEN: dict[tuple[str, str, tuple[int, int]], LineageIndex] = {}
MAX_OPEN_INDEXES = 8


def file_version(root: DataRoot, key: str) -> tuple[int, int]:
    """(size, mtime_ns) of the local copy of `key`: a rebuilt file is another version."""
    st = os.stat(root.local_path(key))
    return st.st_size, st.st_mtime_ns


def open_index(root: DataRoot, cfg: RefineryConfig) -> LineageIndex:
    """The data root's lineage index, reused while neither it nor the tokenizer changed."""
    versions = (file_version(root, LINEAGE_INDEX_KEY) if root.exists(LINEAGE_INDEX_KEY) else (0, 0),
                file_version(root, TOKENIZER_KEY) if root.exists(TOKENIZER_KEY) else (0, 0))
    key = (root.display(LINEAGE_INDEX_KEY), cfg.tokenizer.eod_token, versions)
    index = _OPEN.get(key)
    if index is None:
        index = LineageIndex(root, cfg)
        if len(_OPEN) >= MAX_OPEN_INDEXES:
            _OPEN.pop(next(iter(_OPEN)))
        _OPEN[key] = index
    return index


def resolve_token(root: DataRoot, cfg: RefineryConfig, shard: str, offset: int,
                  context: int = CONTEXT_TOKENS) -> dict[str, Any]:
    """Lineage of token `offset` of `shard` (`<bucket>/shard-NNNNN` for a final shard, or a key
    prefix `shards/<stage>/<bucket>/shard-NNNNN`), with `context` tokens of decoded text on each
    side. Raises LineageError or ShardFormatError."""
    return open_index(root, cfg).resolve(shard, offset, context)


# --------------------------------------------------------------------------------------------------
# `refinery lineage`
# --------------------------------------------------------------------------------------------------


def format_text_window(t: dict[str, Any]) -> str:
    """The decoded window on one line, the traced token in [[ ]], newlines and tabs escaped."""
    if t.get("error"):
        return f"text      unavailable: {t['error']}"
    show = lambda s: s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")  # noqa: E731
    return f"text      tokens {t['start']}..{t['end'] - 1}: ...{show(t['before'])}[[{show(t['token'])}]]{show(t['after'])}..."


def format_lineage(r: dict[str, Any]) -> str:
    overlap = " (in the overlap prefix, masked from the loss)" if r["in_overlap_prefix"] else ""
    lines = [
        f"token     {r['shard']} @ {r['offset']}: id {r['token_id']}{overlap}",
        format_text_window(r["text"]),
        f"entry     {r['entry']} of the shard ({r['bucket_entry']} of bucket {r['bucket']}), tokens "
        f"{r['entry_start']}..{r['entry_end'] - 1}, window {r['window'] + 1} of {r['n_windows']}",
        f"document  {r['doc_id']}",
        f"url       {r['url'] or '-'}",
        f"source    {r['source']}: {r['file']} record {r['record_index']} at byte {r['record_offset']}",
        f"fetched   {r['fetch_time'] or '-'} ({r['content_type'] or '-'}, {r['text_bytes']} bytes of clean text)",
        "funnel:",
    ]
    for stage, record in r["funnel"].items():
        details = ", ".join(f"{k}={v}" for k, v in record.items() if k != "outcome")
        lines.append(f"  {stage:<20} {record.get('outcome', '')}" + (f"  {details}" if details else ""))
    return "\n".join(lines)
