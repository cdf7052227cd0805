"""The contamination scan of a phase (refinery/contamination.py scans documents against the eval index).

The scan runs as tasks, one per clean table (an input file's documents), each writing a partial to
`contamination/partials/<input file>/`: every document of the table with its hit, if any. A task
scans the whole table, not one phase's rows, so a document drawn by several phases is scanned once
and every phase reuses the partial. A partial's key holds the table's sha256 and a digest of the
eval sets (`index_digest`), so a changed table or eval set never meets a stale partial; an unreadable
one is scanned again, never combined. A phase's report is the reduction of its tables' partials
(`reduce_phase`): the same report and hits a one-process scan of its documents gives. A task holds
one table and the eval index: at most 16 bytes per eval n-gram (hash, item, bitmap; the bitmap
capped at 128 MiB) and the eval items' text, and reads its table a record batch at a time. The
reduction never holds the phase's doc ids: they are streamed a final shard at a time into spill
files grouped by input file (`spilled_phase_ids`, about REDUCE_ID_BYTES a group), and it holds one
group and one partial at a time.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import polars as pl

from refinery.config import RefineryConfig
from refinery.contamination import (SCAN_BATCH_BYTES, SCAN_READ_ROWS, ContaminationError, EvalIndex, Hit, ScanReport,
                                    scan_documents, unscannable, verdict)
from refinery.curriculum import PhaseManifest, read_manifest, read_selection
from refinery.curriculum.manifests import shard_selection
from refinery.documents import CLEAN_STAGE
from refinery.layout import documents_key, manifest_key, scan_report_key
from refinery.progress import track
from refinery.storage.damaged import DamagedTableError
from refinery.stages.parquet_batches import ParquetBatchWriter, parquet_batches

if TYPE_CHECKING:
    from refinery.run_context import Run
    from refinery.storage import DataRoot

def phase_entry_ids(root: "DataRoot", manifest: PhaseManifest) -> Iterator[tuple[str, pl.Series]]:
    """(bucket, doc ids) of the entries a phase may draw, one final shard at a time, after its
    selection (a document cut into windows repeats once per window)."""
    for bucket, sl in sorted(manifest.buckets.items()):
        selection, first = read_selection(root, sl), 0
        for ref in sl.shards:
            ids = root.read_parquet(ref.prefix + ".entries.parquet", columns=["doc_id"])["doc_id"]
            if selection is not None:
                ids = ids.gather(shard_selection(selection, first, ref.entries) - first)
            first += ref.entries
            yield bucket, ids


def phase_doc_ids(root: "DataRoot", manifest: PhaseManifest) -> dict[str, set[str]]:
    """The documents a phase may draw, per bucket, as sets: for tests and small phases (the scan
    itself never holds them, `spilled_phase_ids`)."""
    out: dict[str, set[str]] = {bucket: set() for bucket in manifest.buckets}
    for bucket, ids in phase_entry_ids(root, manifest):
        out[bucket].update(ids.to_list())
    return out


def phase_partitions(root: "DataRoot", manifest: PhaseManifest) -> list[str]:
    """The input files whose clean tables hold a phase's documents (a doc_id starts with its
    file), read a final shard at a time."""
    found: set[str] = set()
    for _, ids in phase_entry_ids(root, manifest):
        found.update(ids.str.replace(r"/[^/]*$", "").unique().to_list())
    return sorted(found)


# Bytes of a phase's doc ids the reduction holds at once: they are spilled to files grouped by a
# hash of their input file, a group's file about this size (estimated at ID_ROW_BYTES an entry),
# and read back one group at a time.
REDUCE_ID_BYTES = 64 << 20
ID_ROW_BYTES = 64
SPILL_SCHEMA = {"bucket": pl.String, "doc_id": pl.String}


@contextmanager
def spilled_phase_ids(root: "DataRoot", manifest: PhaseManifest) -> Iterator[list[Path]]:
    """A phase's (bucket, doc_id) entries streamed, a final shard at a time, into temporary files,
    one per group of input files (every doc id of one file in one group): the group files' paths,
    deleted when the block ends. A group holds about REDUCE_ID_BYTES of ids."""
    entries = sum(sl.entries for sl in manifest.buckets.values())
    groups = max(1, -(-entries * ID_ROW_BYTES // REDUCE_ID_BYTES))
    with tempfile.TemporaryDirectory(prefix="refinery-scan-ids-") as work:
        paths = [Path(work) / f"group-{g:05d}.parquet" for g in range(groups)]
        with ExitStack() as stack:
            writers = [stack.enter_context(ParquetBatchWriter(path, SPILL_SCHEMA)) for path in paths]
            for bucket, ids in phase_entry_ids(root, manifest):
                frame = pl.DataFrame({"bucket": pl.Series([bucket] * len(ids), dtype=pl.String), "doc_id": ids})
                group = pl.col("doc_id").str.replace(r"/[^/]*$", "").hash(seed=0) % groups
                for (g,), rows in frame.with_columns(_group=group).partition_by("_group", as_dict=True).items():
                    writers[g].write(rows.drop("_group"))
        yield paths


def _phase_id_groups(paths: list[Path]) -> Iterator[pl.DataFrame]:
    """Each group's distinct (bucket, doc_id, partition) rows, one group at a time."""
    for path in paths:
        yield (pl.read_parquet(path).unique()
               .with_columns(partition=pl.col("doc_id").str.replace(r"/[^/]*$", "")).sort("partition", "doc_id"))


def count_phase_docs(paths: list[Path]) -> int:
    """How many documents (distinct per bucket) the spilled phase ids name."""
    return sum(group.height for group in _phase_id_groups(paths))


# ---- the scan as tasks: one per clean table, shared by every phase, then a reduction per phase ----

# Bump when what a partial holds, or how a table's documents are scanned, changes: every stored
# partial then misses its key and is scanned again.
PARTIAL_FORMAT = 1
PARTIALS_PREFIX = "contamination/partials"
PARTIAL_SCHEMA = {"doc_id": pl.String, "url": pl.String, "eval_set": pl.String, "eval_id": pl.String,
                  "ngram": pl.String, "matched_ngrams": pl.Int64}


class DamagedPartial(ContaminationError):
    """A stored scan partial that cannot be read as one (truncated, or of another schema)."""


def index_digest(index: EvalIndex) -> str:
    """What a table's hits depend on besides the table: the n-gram, each eval set's name and bytes,
    the Polars version (its seeded word hash) and the partial format."""
    digest = {"format": PARTIAL_FORMAT, "ngram": index.n, "eval_sets": dict(sorted(index.sha256.items())),
              "polars": pl.__version__}
    return hashlib.sha256(json.dumps(digest, sort_keys=True).encode()).hexdigest()


def partials_prefix(partition: str) -> str:
    return f"{PARTIALS_PREFIX}/{partition}"


@dataclass(frozen=True)
class ScanTask:
    """One clean table (an input file's documents) scanned against one eval index. Its partial's key
    carries both content hashes, so a changed table or eval set never finds a stale partial."""

    partition: str
    table_sha256: str
    index_digest: str

    @property
    def key(self) -> str:
        return f"{partials_prefix(self.partition)}/{self.index_digest[:16]}-{self.table_sha256[:16]}.parquet"


@dataclass(frozen=True)
class PartialRun:
    """What one task did: its partial's key, whether it scanned the table now (False: a stored
    partial of the same key was reused), and why a stored one was refused, if it was."""

    partition: str
    key: str
    scanned: bool
    damaged: str | None = None


def scan_task(root: "DataRoot", index: EvalIndex, partition: str, digest: str | None = None) -> ScanTask:
    key = documents_key(CLEAN_STAGE, partition)
    if not root.exists(key):
        raise ContaminationError(f"{root.display(key)}: the clean table of {partition} is missing; phase documents "
                                 f"come from it, rebuild the funnel for that input or phase_manifests")
    return ScanTask(partition, root.sha256(key), digest or index_digest(index))


def scan_table(root: "DataRoot", index: EvalIndex, partition: str) -> pl.DataFrame:
    """Every document of `partition`'s clean table, in doc_id order, with its hit (eval item,
    matched n-gram, distinct matches; null when clean): a partial. The table is read a record batch
    at a time (SCAN_READ_ROWS rows, SCAN_BATCH_BYTES of text); memory is one batch, the index and
    the partial, whose rows hold no text."""
    parts = []
    for batch in parquet_batches(root.local_path(documents_key(CLEAN_STAGE, partition)), SCAN_READ_ROWS,
                                 ["doc_id", "url", "text"], SCAN_BATCH_BYTES):
        hits = {h.doc_id: h for h in scan_documents(index, ((d, u, "", t) for d, u, t in batch.iter_rows()))}
        found = [hits.get(doc_id) for doc_id in batch["doc_id"].to_list()]
        parts.append(pl.DataFrame({
            "doc_id": batch["doc_id"], "url": batch["url"],
            "eval_set": [h.eval_set if h else None for h in found], "eval_id": [h.eval_id if h else None for h in found],
            "ngram": [h.ngram if h else None for h in found],
            "matched_ngrams": [h.matched_ngrams if h else None for h in found],
        }, schema=PARTIAL_SCHEMA))
    return pl.concat(parts).sort("doc_id")


def read_partial(root: "DataRoot", task: ScanTask) -> pl.DataFrame:
    """The stored partial of `task`; DamagedPartial, naming it, when it cannot be read as one."""
    try:
        frame = root.read_parquet(task.key)
    except DamagedTableError as err:  # the data root's reader: "<file>: not a readable table (...)..."
        found = str(err).split(": ", 1)[-1]
        raise DamagedPartial(f"{root.display(task.key)}: damaged scan partial ({found})") from None
    except (pl.exceptions.PolarsError, OSError) as err:
        raise DamagedPartial(f"{root.display(task.key)}: damaged scan partial ({type(err).__name__}: {err})") from None
    if dict(frame.schema) != PARTIAL_SCHEMA:
        raise DamagedPartial(f"{root.display(task.key)}: damaged scan partial (columns {dict(frame.schema)}, "
                             f"expected {PARTIAL_SCHEMA})")
    return frame


def stored_partial(root: "DataRoot", task: ScanTask) -> tuple[pl.DataFrame | None, str | None]:
    """(the stored partial of `task` or None, why a stored one was refused or None)."""
    if not root.exists(task.key):
        return None, None
    try:
        return read_partial(root, task), None
    except DamagedPartial as err:
        return None, f"{err}; scanning {task.partition} again"


def ensure_partial(root: "DataRoot", index: EvalIndex, partition: str, digest: str | None = None) -> PartialRun:
    """One task: store `partition`'s partial for `index` unless a readable one of the same key is
    stored, and delete the partition's partials of other keys (older tables or eval sets)."""
    task = scan_task(root, index, partition, digest)
    stored, damaged = stored_partial(root, task)
    if stored is not None:
        return PartialRun(partition, task.key, scanned=False)
    root.write_parquet(task.key, scan_table(root, index, partition))
    for stale in root.list(partials_prefix(partition)):
        if stale != task.key:
            root.delete(stale)
    return PartialRun(partition, task.key, scanned=True, damaged=damaged)


def reduce_phase(phase: str, id_groups: list[Path], tasks: dict[str, ScanTask],
                 partial: Callable[[ScanTask], pl.DataFrame], log: Callable[[str], None] | None = None) -> tuple[list[Hit], int]:
    """The hits of a phase's documents, in doc_id order, and how many documents it holds (distinct
    per bucket), from its tables' partials: each table's rows of the phase, every one of which must
    be in the partial. Reads the spilled ids (`spilled_phase_ids`) a group at a time and holds one
    group and one partial at a time."""
    hits: list[Hit] = []
    docs = [0]

    def tables() -> Iterator[tuple[str, pl.DataFrame]]:
        for group in _phase_id_groups(id_groups):
            docs[0] += group.height
            for (partition,), wanted in group.partition_by("partition", as_dict=True, maintain_order=True).items():
                yield partition, wanted

    for partition, wanted in track(tables(), total=len(tasks), desc=f"scan {phase}", unit="table", log=log):
        rows = partial(tasks[partition]).join(wanted.select("doc_id", "bucket"), on="doc_id", how="inner")
        if rows.height != wanted.height:
            missing = sorted(set(wanted["doc_id"].to_list()) - set(rows["doc_id"].to_list()))[:3]
            raise ContaminationError(
                f"{documents_key(CLEAN_STAGE, partition)}: documents {missing} named by the {phase!r} manifest "
                f"are missing; the clean tables changed after the manifest was built, rebuild phase_manifests"
            )
        found = rows.filter(pl.col("eval_set").is_not_null())
        for doc_id, url, bucket, eval_set, eval_id, ngram, matched in found.select(
                "doc_id", "url", "bucket", "eval_set", "eval_id", "ngram", "matched_ngrams").iter_rows():
            hits.append(Hit(doc_id, url, bucket, eval_set, eval_id, ngram, matched))
    hits.sort(key=lambda h: h.doc_id)
    return hits, docs[0]


def current_fingerprint(root: "DataRoot", phase: str, index: EvalIndex) -> dict[str, str]:
    """What a scan of `phase` depends on: the manifest's bytes and each eval set's bytes."""
    return {"manifest": root.sha256(manifest_key(phase)), **{f"eval_set/{k}": v for k, v in sorted(index.sha256.items())}}


def scan_phase(cfg: RefineryConfig, root: "DataRoot", phase: str, index: EvalIndex | None = None,
               log: Callable[[str], None] | None = None) -> ScanReport:
    """Scan the documents of `phase`'s manifest against the configured eval sets (read-only): the
    reduction of its tables' partials, each the stored one when its key matches (the asset stores
    them, `ensure_partial`) and scanned here, in memory, when none is stored or it is damaged (said
    to `log`). Shows a bar on a terminal; `log` gets a progress line every 10%. With nothing to scan
    for (`unscannable`) no document is read and the report says why."""
    start = time.perf_counter()
    index = index or EvalIndex.build(cfg)
    manifest = read_manifest(root, phase)
    fingerprint = current_fingerprint(root, phase, index)
    why = unscannable(cfg.contamination, index)
    with spilled_phase_ids(root, manifest) as id_groups:
        if why is not None:
            return ScanReport(phase, index.n, docs_scanned=0, contaminated_docs=0,
                              max_contaminated_docs=cfg.contamination.max_contaminated_docs, fingerprint=fingerprint,
                              not_scanned=why, docs_unscanned=count_phase_docs(id_groups))
        digest = index_digest(index)
        partitions = sorted({p for group in _phase_id_groups(id_groups) for p in group["partition"].unique().to_list()})
        tasks = {p: scan_task(root, index, p, digest) for p in partitions}

        def partial(task: ScanTask) -> pl.DataFrame:
            stored, damaged = stored_partial(root, task)
            if damaged and log:
                log(damaged)
            return stored if stored is not None else scan_table(root, index, task.partition)

        hits, total = reduce_phase(phase, id_groups, tasks, partial, log)
    return ScanReport(phase=phase, ngram=index.n, docs_scanned=total, contaminated_docs=len(hits),
                      max_contaminated_docs=cfg.contamination.max_contaminated_docs, hits=hits,
                      wall_s=time.perf_counter() - start, fingerprint=fingerprint)


def scan_is_current(cfg: RefineryConfig, root: "DataRoot", phase: str) -> tuple[bool, str]:
    """Whether the latest stored scan of `phase` covers today's manifest and eval sets, and why not."""
    key = scan_report_key(phase)
    if not root.exists(key):
        return False, f"phase {phase!r} was never scanned; materialize contamination_scan[{phase}]"
    stored = root.read_json(key)
    now = current_fingerprint(root, phase, EvalIndex.build(cfg))
    changed = sorted(k for k in set(now) | set(stored.get("fingerprint", {})) if now.get(k) != stored["fingerprint"].get(k))
    if changed:
        return False, (
            f"the latest scan of phase {phase!r} is older than a change to {', '.join(changed)}; "
            f"re-materialize contamination_scan[{phase}]"
        )
    if stored.get("not_scanned"):  # a warning, as the asset check says: nothing could be checked
        return True, verdict(stored)
    if not stored.get("passed", False):
        return False, f"the latest scan of phase {phase!r} found {stored['contaminated_docs']} contaminated documents over the limit"
    return True, "current"


def scan_table_task(refinery: "Run", partition: str, cache: dict) -> PartialRun:
    """One task: the partial of one clean table (the eval index built once per worker)."""
    if "index" not in cache:
        cache["index"] = EvalIndex.build(refinery.config)
        cache["digest"] = index_digest(cache["index"])
    return ensure_partial(refinery.root, cache["index"], partition, cache["digest"])
