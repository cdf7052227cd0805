"""From a token in a shard back to its document, URL, source record and funnel history.

The `lineage_index` asset writes two files (docs/formats.md has the layout):

- `lineage/documents.arrow`: every clean document without its text, sorted by doc_id, as an Arrow
  IPC file of record batches of `ROW_GROUP_ROWS` rows: the provenance columns and every per-stage
  column (language and score, dedup cluster and size, quality score, PII counts, ...). Arrow IPC
  rather than Parquet because its footer is a short list of batch offsets, so opening it
  memory-mapped and reading one batch costs well under a millisecond.
- `lineage/index.json`: the first doc_id of each batch, the column list, and the shard indexes
  (by sha256) of every bucket it was built against.

A query never scans the corpus: the token offset is found by binary search over the shard's `.idx`
offsets, the entry's doc_id is one row of the shard's sidecar, and the document is one record batch of
`lineage/documents.arrow`, found by binary search over the batches' first doc_ids.

`resolve_token(root, cfg, shard, offset)` is the API; `refinery lineage` prints it.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import re
import time
from typing import Any, Callable

import numpy as np
import polars as pl

from refinery.config import RefineryConfig
from refinery.documents import CLEAN_STAGE, PROVENANCE_COLUMNS, input_shards
from refinery.layout import (LINEAGE_DOCUMENTS_KEY, LINEAGE_INDEX_KEY, LINEAGE_SHARD_MAPS_PREFIX, bucket_shards_prefix,
                             documents_key, final_index_key, shard_index_key, shard_map_key)
from refinery.progress import track
from refinery.shard_format import ShardFormatError, ShardReader, read_index
from refinery.storage import DataRoot, sha256_file

LINEAGE_VERSION = 1
ROW_GROUP_ROWS = 1024
# One row per entry of a final shard: where its document sits in lineage/documents.arrow.
SHARD_MAP_DTYPE = np.dtype([("doc_row", "<i8"), ("window", "<i4"), ("n_windows", "<i4")])
SHARD_STAGES = ("final", "tokenized")
# Tokens of decoded text shown on each side of the traced token (never across its entry's edges).
CONTEXT_TOKENS = 16

# Which funnel stage recorded which document column; columns not listed show under "other".
FUNNEL_STAGES: list[tuple[str, str | None, list[str]]] = [
    # (asset, the source `skip` name that bypasses it, the columns it adds)
    ("raw_documents", None, []),
    ("extracted_text", None, []),
    ("language_filtered", "language", ["language", "language_score"]),
    ("heuristic_filtered", "heuristic", []),
    ("exact_deduped", None, []),
    ("near_deduped", "near_dedup", ["dup_cluster", "dup_cluster_size"]),
    ("quality_scored", "quality", ["quality_score"]),
    (CLEAN_STAGE, None, ["pii_counts"]),
]


class LineageError(ValueError):
    """A lineage query that cannot be answered: unknown shard, offset outside it, missing index."""


# --------------------------------------------------------------------------------------------------
# Building the index
# --------------------------------------------------------------------------------------------------


def _write_shard_maps(root: DataRoot, buckets: list[str], docs: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """For each final shard, its entries' rows in the (sorted) documents table; returns what was
    indexed per bucket, with the sha256 of the bucket index.json it was built from."""
    rows = docs.select("doc_id").with_row_index("doc_row")
    out: dict[str, dict[str, Any]] = {}
    written: set[str] = set()
    for bucket in buckets:
        key = final_index_key(bucket)
        if not root.exists(key):
            continue
        raw = root.read_bytes(key)
        bucket_index = json.loads(raw)
        for ref in bucket_index["shards"]:
            side = pl.read_parquet(root.local_path(ref["prefix"] + ".entries.parquet")).with_row_index("entry")
            joined = side.join(rows, on="doc_id", how="left").sort("entry")
            missing = joined.filter(pl.col("doc_row").is_null())
            if missing.height:
                raise LineageError(
                    f"{root.display(ref['prefix'])}: entry {missing['entry'][0]} holds doc_id {missing['doc_id'][0]!r}, "
                    f"which no clean table has; the shards and the clean documents come from different runs: "
                    f"materialize tokenized_shards, shuffled_shards and then lineage_index again"
                )
            table = np.empty(joined.height, dtype=SHARD_MAP_DTYPE)
            for column in SHARD_MAP_DTYPE.names:
                table[column] = joined[column].to_numpy()
            buf = io.BytesIO()
            np.save(buf, table, allow_pickle=False)
            written.add(shard_map_key(ref["prefix"]))
            root.write_bytes(shard_map_key(ref["prefix"]), buf.getvalue())
        out[bucket] = {"index_sha256": hashlib.sha256(raw).hexdigest(), "tokens": bucket_index["tokens"],
                       "entries": bucket_index["entries"], "shards": len(bucket_index["shards"])}
    for stale in root.list(LINEAGE_SHARD_MAPS_PREFIX):
        if stale not in written:
            root.delete(stale)
    return out


def verify_final_shards(root: DataRoot, cfg: RefineryConfig, log: Callable[[str], None] | None = None) -> int:
    """Check every final shard's files against its bucket's index.json; return the shard count."""
    refs = [ref for bucket in cfg.buckets if root.exists(final_index_key(bucket))
            for ref in root.read_json(final_index_key(bucket))["shards"]]
    for ref in track(refs, desc="lineage: verify final shards", unit="shard", log=log):
        local = str(root.local_path(ref["prefix"] + ".idx"))[: -len(".idx")]
        ShardReader(local).verify(ref["sha256"])
    return len(refs)


def clean_documents_without_text(root: DataRoot, cfg: RefineryConfig, stage: str = CLEAN_STAGE,
                                 log: Callable[[str], None] | None = None) -> pl.DataFrame:
    """Every clean document's columns except its text (replaced by `text_bytes`)."""
    import pyarrow.parquet as pq

    parts = []
    for shard in track(input_shards(cfg), desc="lineage: read clean documents", unit="file", log=log):
        path = root.local_path(documents_key(stage, shard.key))
        names = pq.read_schema(path).names
        parts.append(
            pl.scan_parquet(path)
            .select([c for c in names if c != "text"] + [pl.col("text").str.len_bytes().alias("text_bytes")])
            .collect()
        )
    if not parts:
        return pl.DataFrame(schema={c: pl.String for c in PROVENANCE_COLUMNS})
    return pl.concat(parts, how="diagonal_relaxed")


def write_lineage_index(root: DataRoot, docs: pl.DataFrame, buckets: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    """Sort `docs` by doc_id, write lineage/documents.arrow in record batches, a map per final shard
    of `buckets`, then lineage/index.json."""
    import pyarrow as pa

    docs = docs.sort("doc_id")
    dupes = docs["doc_id"].is_duplicated()
    if dupes.any():
        raise LineageError(f"doc_id repeats across the clean tables, e.g. {docs.filter(dupes)['doc_id'][0]!r}")
    table = docs.to_arrow()
    with root.writer(LINEAGE_DOCUMENTS_KEY) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=ROW_GROUP_ROWS)
    index = {
        "version": LINEAGE_VERSION,
        "documents": docs.height,
        "row_group_rows": ROW_GROUP_ROWS,
        "row_group_first_doc_ids": docs["doc_id"].gather_every(ROW_GROUP_ROWS).to_list(),
        "columns": docs.columns,
        "documents_sha256": root.sha256(LINEAGE_DOCUMENTS_KEY),
        "buckets": _write_shard_maps(root, buckets, docs),
        **extra,
    }
    root.write_json(LINEAGE_INDEX_KEY, index)
    return index


def build_lineage_index(root: DataRoot, cfg: RefineryConfig, stage: str = CLEAN_STAGE,
                        log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Verify the final shards, then index the clean documents of every input shard. `log` gets a
    progress line every 10% (an asset passes its context's logger)."""
    t0 = time.perf_counter()
    shards_checked = verify_final_shards(root, cfg, log)
    index = write_lineage_index(
        root,
        clean_documents_without_text(root, cfg, stage, log),
        list(cfg.buckets),
        {"final_shards_verified": shards_checked},
    )
    index["wall_s"] = time.perf_counter() - t0
    return index


# --------------------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------------------

_SHARD_NAME = re.compile(r"^(?:shards/(?P<stage>[a-z]+)/)?(?P<bucket>[A-Za-z0-9_.-]+)/(?P<shard>shard-\d{5})(?:\.\w+)*$")


def parse_shard(shard: str) -> tuple[str, str, str]:
    """(stage, bucket, key prefix) from `web/shard-00003`, `shards/final/web/shard-00003` or a file of it."""
    m = _SHARD_NAME.match(shard.strip().removesuffix(".entries.parquet"))
    if not m:
        raise LineageError(
            f"shard {shard!r} is not a shard name; give <bucket>/shard-NNNNN (a final shard) or "
            f"shards/<stage>/<bucket>/shard-NNNNN"
        )
    stage = m["stage"] or "final"
    if stage not in SHARD_STAGES:
        raise LineageError(f"shard {shard!r}: unknown shard stage {stage!r}; use one of {list(SHARD_STAGES)}")
    return stage, m["bucket"], f"{bucket_shards_prefix(stage, m['bucket'])}/{m['shard']}"


def _find_shard(root: DataRoot, cfg: RefineryConfig, shard: str) -> tuple[str, str, int, dict[str, Any], int, str]:
    """(stage, bucket, number, shard ref, entries before it in the bucket, sha256 of the bucket index)."""
    stage, bucket, prefix = parse_shard(shard)
    if bucket not in cfg.buckets:
        raise LineageError(f"shard {shard!r}: unknown bucket {bucket!r}; the config has {cfg.buckets}")
    key = shard_index_key(stage, bucket)
    try:
        raw = root.read_bytes(key)
    except FileNotFoundError:
        raise LineageError(f"{root.display(key)}: no {stage} shards for bucket {bucket!r}; materialize them first") from None
    refs = json.loads(raw)["shards"]
    before = 0
    for number, ref in enumerate(refs):
        if ref["prefix"] == prefix:
            return stage, bucket, number, ref, before, hashlib.sha256(raw).hexdigest()
        before += ref["entries"]
    names = [r["prefix"].rsplit("/", 1)[-1] for r in refs]
    raise LineageError(
        f"shard {shard!r}: unknown shard; bucket {bucket!r} has {len(refs)} {stage} shards"
        + (f" ({names[0]} .. {names[-1]})" if names else "")
    )


def _read_json(root: DataRoot, key: str, missing: str) -> Any:
    try:
        return root.read_json(key)
    except FileNotFoundError:
        raise LineageError(f"{root.display(key)}: {missing}") from None


def _check_hash(path: str, want: str) -> str:
    if sha256_file(path) != want:
        raise ShardFormatError(
            f"{path}: content hash does not match the bucket's index.json; the shard changed after it "
            f"was written; rebuild it (materialize the shard asset again)"
        )
    return path


class LineageIndex:
    """The on-disk lineage index of one data root. Holds nothing but the small index.json."""

    def __init__(self, root: DataRoot, cfg: RefineryConfig):
        self.root, self.cfg = root, cfg
        self._tokenizer: Any = None
        self.index = _read_json(root, LINEAGE_INDEX_KEY, "no lineage index; materialize the `lineage_index` asset first")
        if self.index.get("version") != LINEAGE_VERSION:
            raise LineageError(f"{root.display(LINEAGE_INDEX_KEY)}: version {self.index.get('version')}, expected {LINEAGE_VERSION}; rebuild it")

    def _batch(self, number: int):
        import pyarrow as pa

        with pa.memory_map(str(self.root.local_path(LINEAGE_DOCUMENTS_KEY))) as source:
            return pa.ipc.open_file(source).get_batch(number)

    def document_at(self, row: int) -> dict[str, Any]:
        """Row `row` of lineage/documents.arrow."""
        return self._batch(row // ROW_GROUP_ROWS).slice(row % ROW_GROUP_ROWS, 1).to_pylist()[0]

    def document(self, doc_id: str) -> dict[str, Any]:
        """The lineage row of `doc_id`, read from the one record batch that can hold it (memory-mapped)."""
        firsts = self.index["row_group_first_doc_ids"]
        group = bisect.bisect_right(firsts, doc_id) - 1
        if group >= 0:
            batch = self._batch(group)
            ids = batch.column("doc_id").to_pylist()
            row = bisect.bisect_left(ids, doc_id)
            if row < len(ids) and ids[row] == doc_id:
                return batch.slice(row, 1).to_pylist()[0]
        raise LineageError(
            f"doc_id {doc_id!r} is in the shards but not in the lineage index; rebuild lineage_index "
            f"after the shards (materialize lineage_index)"
        )

    def _final_entry(self, bucket: str, bucket_sha: str, prefix: str, entry: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(document row, entry's window info) of a final shard's entry, through its shard map."""
        built = self.index["buckets"].get(bucket, {}).get("index_sha256")
        if built != bucket_sha:
            raise LineageError(
                f"the lineage index was built from other {bucket!r} shards than the current ones "
                f"(shards/final/{bucket}/index.json changed); materialize lineage_index again"
            )
        row = np.load(self.root.local_path(shard_map_key(prefix)), mmap_mode="r")[entry]
        side = {"window": int(row["window"]), "n_windows": int(row["n_windows"])}
        return self.document_at(int(row["doc_row"])), side

    def decoded_window(self, tokens: np.ndarray, pos: int) -> dict[str, Any]:
        """`tokens` decoded with the tokenizer the shards were made with (the data root's), split
        around `tokens[pos]`; `error` says why there is no text when that tokenizer is unreadable."""
        from refinery.stages.tokenize import TokenizeError, read_tokenizer

        if self._tokenizer is None:
            try:
                self._tokenizer = read_tokenizer(self.root, self.cfg.tokenizer.eod_token)
            except TokenizeError as err:
                return {"before": None, "token": None, "after": None, "error": str(err)}
        ids = [int(t) for t in tokens]
        decode = lambda part: self._tokenizer.decode(part, skip_special_tokens=False)  # noqa: E731
        return {"before": decode(ids[:pos]), "token": decode(ids[pos:pos + 1]), "after": decode(ids[pos + 1:])}

    def resolve(self, shard: str, offset: int, context: int = CONTEXT_TOKENS) -> dict[str, Any]:
        import pyarrow.parquet as pq

        stage, bucket, number, ref, before, bucket_sha = _find_shard(self.root, self.cfg, shard)
        prefix = ref["prefix"]
        try:
            local = str(self.root.local_path(prefix + ".idx"))[: -len(".idx")]  # the shard's files sit together
        except FileNotFoundError as err:
            raise ShardFormatError(f"{err}; the shard's bucket index names it, so rebuild the bucket's shards") from None
        index = read_index(_check_hash(local + ".idx", ref["sha256"][".idx"]))
        if not 0 <= offset < index.num_tokens:
            raise LineageError(
                f"offset {offset} is outside shard {prefix} ({index.num_tokens} tokens: 0..{index.num_tokens - 1})"
            )
        entry = int(np.searchsorted(index.offsets, offset, side="right") - 1)
        start, end = int(index.offsets[entry]), int(index.offsets[entry + 1])
        if stage == "final":
            doc, side = self._final_entry(bucket, bucket_sha, ref["prefix"], entry)
        else:
            entries_path = _check_hash(local + ".entries.parquet", ref["sha256"][".entries.parquet"])
            sidecar = pq.ParquetFile(entries_path, memory_map=True).read_row_group(0, columns=["doc_id", "window", "n_windows"])
            side = sidecar.slice(entry, 1).to_pylist()[0]
            doc = self.document(side["doc_id"])
        lo, hi = max(start, offset - context), min(end, offset + context + 1)
        window = np.memmap(local + ".bin", dtype=index.dtype, mode="r", offset=lo * index.dtype.itemsize, shape=(hi - lo,))
        token = int(window[offset - lo])
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
            "in_overlap_prefix": offset - start < int(index.overlaps[entry]),
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


def resolve_token(root: DataRoot, cfg: RefineryConfig, shard: str, offset: int,
                  context: int = CONTEXT_TOKENS) -> dict[str, Any]:
    """Lineage of token `offset` of `shard` (`<bucket>/shard-NNNNN` for a final shard, or a key
    prefix `shards/<stage>/<bucket>/shard-NNNNN`), with `context` tokens of decoded text on each
    side. Raises LineageError or ShardFormatError."""
    return LineageIndex(root, cfg).resolve(shard, offset, context)


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
