"""From a token in a shard back to its document, URL, source record and funnel history.

The `lineage_index` asset writes two files (docs/formats.md has the layout):

- `lineage/documents.parquet`: every clean document without its text, sorted by doc_id, in row
  groups of `ROW_GROUP_ROWS`: the provenance columns and every per-stage column (language and
  score, dedup cluster and size, quality score, PII counts, ...).
- `lineage/index.json`: the first doc_id of each row group, the column list, and the shard indexes
  (by sha256) of every bucket it was built against.

A query never scans the corpus: the token offset is found by binary search over the shard's `.idx`
offsets, the entry's doc_id is one row of the shard's sidecar, and the document is one row group of
`lineage/documents.parquet`, found by binary search over the row groups' first doc_ids.

`resolve_token(root, cfg, shard, offset)` is the API; `refinery lineage` prints it.
"""

from __future__ import annotations

import argparse
import bisect
import re
import sys
import time
from typing import Any

import numpy as np
import polars as pl

from refinery.config import RefineryConfig, load_config
from refinery.documents import CLEAN_STAGE, PROVENANCE_COLUMNS, documents_key, input_shards
from refinery.shard_format import ShardFormatError, ShardReader, read_index
from refinery.storage import DataRoot, dumps_json, open_data_root, sha256_file

DOCUMENTS_KEY = "lineage/documents.parquet"
INDEX_KEY = "lineage/index.json"
LINEAGE_VERSION = 1
ROW_GROUP_ROWS = 1024
SHARD_STAGES = ("final", "tokenized")

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


def _bucket_indexes(root: DataRoot, cfg: RefineryConfig) -> dict[str, dict[str, Any]]:
    out = {}
    for bucket in cfg.buckets:
        key = f"shards/final/{bucket}/index.json"
        if root.exists(key):
            out[bucket] = {"index_sha256": root.sha256(key), **{k: root.read_json(key)[k] for k in ("tokens", "entries")}}
    return out


def verify_final_shards(root: DataRoot, cfg: RefineryConfig) -> int:
    """Check every final shard's files against its bucket's index.json; return the shard count."""
    count = 0
    for bucket in cfg.buckets:
        key = f"shards/final/{bucket}/index.json"
        if not root.exists(key):
            continue
        for ref in root.read_json(key)["shards"]:
            local = str(root.local_path(ref["prefix"] + ".idx"))[: -len(".idx")]
            ShardReader(local).verify(ref["sha256"])
            count += 1
    return count


def clean_documents_without_text(root: DataRoot, cfg: RefineryConfig, stage: str = CLEAN_STAGE) -> pl.DataFrame:
    """Every clean document's columns except its text (replaced by `text_bytes`)."""
    import pyarrow.parquet as pq

    parts = []
    for shard in input_shards(cfg):
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


def write_lineage_index(root: DataRoot, docs: pl.DataFrame, extra: dict[str, Any]) -> dict[str, Any]:
    """Sort `docs` by doc_id, write lineage/documents.parquet in row groups, then lineage/index.json."""
    import pyarrow.parquet as pq

    docs = docs.sort("doc_id")
    dupes = docs["doc_id"].is_duplicated()
    if dupes.any():
        raise LineageError(f"doc_id repeats across the clean tables, e.g. {docs.filter(dupes)['doc_id'][0]!r}")
    with root.writer(DOCUMENTS_KEY) as tmp:
        pq.write_table(docs.to_arrow(), tmp, row_group_size=ROW_GROUP_ROWS, compression="zstd", write_statistics=True)
    index = {
        "version": LINEAGE_VERSION,
        "documents": docs.height,
        "row_group_rows": ROW_GROUP_ROWS,
        "row_group_first_doc_ids": docs["doc_id"].gather_every(ROW_GROUP_ROWS).to_list(),
        "columns": docs.columns,
        "documents_sha256": root.sha256(DOCUMENTS_KEY),
        **extra,
    }
    root.write_json(INDEX_KEY, index)
    return index


def build_lineage_index(root: DataRoot, cfg: RefineryConfig, stage: str = CLEAN_STAGE) -> dict[str, Any]:
    """Verify the final shards, then index the clean documents of every input shard."""
    t0 = time.perf_counter()
    shards_checked = verify_final_shards(root, cfg)
    index = write_lineage_index(
        root,
        clean_documents_without_text(root, cfg, stage),
        {"buckets": _bucket_indexes(root, cfg), "final_shards_verified": shards_checked},
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
    return stage, m["bucket"], f"shards/{stage}/{m['bucket']}/{m['shard']}"


def _find_shard(root: DataRoot, cfg: RefineryConfig, shard: str) -> tuple[str, str, int, dict[str, Any], int]:
    """(stage, bucket, number, shard ref, entries before it in the bucket)."""
    stage, bucket, prefix = parse_shard(shard)
    if bucket not in cfg.buckets:
        raise LineageError(f"shard {shard!r}: unknown bucket {bucket!r}; the config has {cfg.buckets}")
    key = f"shards/{stage}/{bucket}/index.json"
    if not root.exists(key):
        raise LineageError(f"{root.display(key)}: no {stage} shards for bucket {bucket!r}; materialize them first")
    refs = root.read_json(key)["shards"]
    before = 0
    for number, ref in enumerate(refs):
        if ref["prefix"] == prefix:
            return stage, bucket, number, ref, before
        before += ref["entries"]
    names = [r["prefix"].rsplit("/", 1)[-1] for r in refs]
    raise LineageError(
        f"shard {shard!r}: unknown shard; bucket {bucket!r} has {len(refs)} {stage} shards"
        + (f" ({names[0]} .. {names[-1]})" if names else "")
    )


def _check_hash(root: DataRoot, key: str, want: str) -> str:
    path = root.local_path(key)
    if sha256_file(path) != want:
        raise ShardFormatError(
            f"{root.display(key)}: content hash does not match the bucket's index.json; the shard changed after it "
            f"was written; rebuild it (materialize the shard asset again)"
        )
    return str(path)


class LineageIndex:
    """The on-disk lineage index of one data root. Holds nothing but the small index.json."""

    def __init__(self, root: DataRoot, cfg: RefineryConfig):
        self.root, self.cfg = root, cfg
        if not root.exists(INDEX_KEY):
            raise LineageError(f"{root.display(INDEX_KEY)}: no lineage index; materialize the `lineage_index` asset first")
        self.index = root.read_json(INDEX_KEY)
        if self.index.get("version") != LINEAGE_VERSION:
            raise LineageError(f"{root.display(INDEX_KEY)}: version {self.index.get('version')}, expected {LINEAGE_VERSION}; rebuild it")

    def document(self, doc_id: str) -> dict[str, Any]:
        """The lineage row of `doc_id`, read from the one row group that can hold it."""
        import pyarrow.parquet as pq

        firsts = self.index["row_group_first_doc_ids"]
        group = bisect.bisect_right(firsts, doc_id) - 1
        if group >= 0:
            table = pq.ParquetFile(self.root.local_path(DOCUMENTS_KEY)).read_row_group(group)
            ids = table.column("doc_id").to_numpy(zero_copy_only=False)
            row = int(np.searchsorted(ids, doc_id))
            if row < len(ids) and ids[row] == doc_id:
                return table.slice(row, 1).to_pylist()[0]
        raise LineageError(
            f"doc_id {doc_id!r} is in the shards but not in the lineage index; rebuild lineage_index "
            f"after the shards (materialize lineage_index)"
        )

    def resolve(self, shard: str, offset: int) -> dict[str, Any]:
        stage, bucket, number, ref, before = _find_shard(self.root, self.cfg, shard)
        prefix = ref["prefix"]
        idx_path = _check_hash(self.root, prefix + ".idx", ref["sha256"][".idx"])
        entries_path = _check_hash(self.root, prefix + ".entries.parquet", ref["sha256"][".entries.parquet"])
        index = read_index(idx_path)
        if not 0 <= offset < index.num_tokens:
            raise LineageError(
                f"offset {offset} is outside shard {prefix} ({index.num_tokens} tokens: 0..{index.num_tokens - 1})"
            )
        entry = int(np.searchsorted(index.offsets, offset, side="right") - 1)
        start, end = int(index.offsets[entry]), int(index.offsets[entry + 1])
        side = pl.read_parquet(entries_path).row(entry, named=True)
        bin_path = idx_path[: -len(".idx")] + ".bin"
        token = int(np.memmap(bin_path, dtype=index.dtype, mode="r", offset=offset * index.dtype.itemsize, shape=(1,))[0])
        doc = self.document(side["doc_id"])
        return {
            "shard": prefix,
            "stage": stage,
            "bucket": bucket,
            "shard_number": number,
            "offset": offset,
            "token_id": token,
            "entry": entry,
            "bucket_entry": before + entry,
            "entry_start": start,
            "entry_end": end,
            "position_in_entry": offset - start,
            "in_overlap_prefix": offset - start < int(index.overlaps[entry]),
            "window": side["window"],
            "n_windows": side["n_windows"],
            "doc_id": side["doc_id"],
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


def resolve_token(root: DataRoot, cfg: RefineryConfig, shard: str, offset: int) -> dict[str, Any]:
    """Lineage of token `offset` of `shard` (`<bucket>/shard-NNNNN` for a final shard, or a key
    prefix `shards/<stage>/<bucket>/shard-NNNNN`). Raises LineageError or ShardFormatError."""
    return LineageIndex(root, cfg).resolve(shard, offset)


# --------------------------------------------------------------------------------------------------
# `refinery lineage`
# --------------------------------------------------------------------------------------------------


def format_lineage(r: dict[str, Any]) -> str:
    overlap = " (in the overlap prefix, masked from the loss)" if r["in_overlap_prefix"] else ""
    lines = [
        f"token     {r['shard']} @ {r['offset']}: id {r['token_id']}{overlap}",
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


def run_lineage(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    if args.offset is None:
        print("refinery lineage: --shard needs --offset N (a token offset inside the shard)", file=sys.stderr)
        return 2
    try:
        result = resolve_token(root, cfg, args.shard, args.offset)
    except (LineageError, ShardFormatError) as err:
        print(f"refinery lineage: {err}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(dumps_json(result).decode())
    else:
        print(format_lineage(result))
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `refinery lineage`. The query flags form a mutually exclusive group (`parser.query`),
    so another way to name a token (e.g. a trainer's run/step/rank/row/pos) adds to it."""
    p = subparsers.add_parser("lineage", help="trace a token in a shard back to its document, URL and funnel history")
    p.add_argument("--config", required=True)
    query = p.add_mutually_exclusive_group(required=True)
    query.add_argument("--shard", help="a final shard, <bucket>/shard-NNNNN, or shards/<stage>/<bucket>/shard-NNNNN")
    p.add_argument("--offset", type=int, help="token offset inside --shard")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_lineage)
    p.query = query  # type: ignore[attr-defined]
    return p
