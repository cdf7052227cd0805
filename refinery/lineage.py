"""Answering lineage queries: from a token in a shard back to its document, URL, source record and
funnel history, read from the index refinery/lineage_index.py builds (which describes its files).
A final-shard query reads one row of the shard's rows file with three small reads and the standard
library: a `refinery lineage` command line imports neither numpy nor pyarrow.

`resolve_token(root, cfg, shard, offset)` is the API; `refinery lineage` prints it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from refinery.config import RefineryConfig
from refinery.documents import PROVENANCE_COLUMNS, input_shards
from refinery.dropped import series_refusal
from refinery.documents.tables import record_position
from refinery.layout import (LINEAGE_DOCUMENTS_PREFIX, LINEAGE_INDEX_KEY, TOKENIZER_KEY, bucket_lineage_key,
                             bucket_shards_prefix, documents_part_key, shard_index_key, shard_lineage_key)
from refinery.lineage_index import (ENTRY_COLUMNS, LINEAGE_VERSION, SHARD_STAGES, LineageError, documents_by_id,
                                    open_documents_part, read_row)
from refinery.shard_header import ShardFormatError, locate_token, read_tokens
from refinery.stages import registry
from refinery.storage import DataRoot, sha256_file
from refinery.tokenizer_file import TokenizeError, read_decoder

# numpy is imported by the functions that use it (a tokenized shard's query), not here: a
# final-shard query reads only JSON and the shard's files (bench/RESULTS.md).
if TYPE_CHECKING:
    import numpy as np

# Tokens of decoded text shown on each side of the traced token (never across its entry's edges).
CONTEXT_TOKENS = 16

# Which funnel stage recorded which document column; columns not listed show under "other".
# (verdict, the source `skip` name that bypasses it, the columns it adds), refinery/stages/registry.py.
FUNNEL_STAGES: list[tuple[str, str | None, list[str]]] = [(v.name, v.skip, list(v.adds)) for v in registry.verdicts()]

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
        gone = series_refusal(self.root, bucket, part, f"lineage of shard {shard!r}") if part is not None else None
        if gone:
            raise LineageError(gone)
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
        f"source    {r['source']}: {r['file']} {record_position(r['file'], r['record_index'], r['record_offset'])}",
        f"fetched   {r['fetch_time'] or '-'} ({r['content_type'] or '-'}, {r['text_bytes']} bytes of clean text)",
        "funnel:",
    ]
    for stage, record in r["funnel"].items():
        details = ", ".join(f"{k}={v}" for k, v in record.items() if k != "outcome")
        lines.append(f"  {stage:<20} {record.get('outcome', '')}" + (f"  {details}" if details else ""))
    return "\n".join(lines)
