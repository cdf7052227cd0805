"""Difficulty bands: how a phase with an `order` (refinery/config/curriculum.py: OrderConfig) cuts
the entries it serves of a bucket into equal-count bands by the final shards' `difficulty` column,
and the band file the phase manifest pins.

The entries served are the bucket's (or the phase's selection: a quality cutoff, less excluded
documents). Their difficulty is streamed from the bucket's entry table in batches of
`ENTRY_BATCH_ROWS`, as quality cutoffs are (quality_cut.py): one pass histograms the leading 16 bits
of each score's order-preserving 64-bit key, a second pass the next 16 bits of the bins holding a
cutoff, so each cutoff is the 32-bit key prefix of the entry at its rank. Entries whose keys share
those 32 bits (sign, exponent and 20 mantissa bits: scores within about one part in a million) fall
in one band, as do all windows of a document (they share its score): bands hold equal counts up
to such ties. A third pass counts each band's entries, tokens and difficulty sum, and a fourth
writes the band file. Memory: one batch, plus 512 KiB of histogram per cutoff.

Each pass runs as tasks (`refinery.tasks`), as the quality cutoff's do (inventory.py): the
histogram passes and the band file's pass a task per final shard, whose results the step adds up or
writes at each band's offset in shard order; the counting pass a task per `ENTRY_BATCH_ROWS` rows of
the table, so each band's difficulty sum is added batch by batch in the one order a single reader
of the table adds it (floating-point sums depend on it), and the manifest's bytes do not depend on
how the work was split.

Band file (`manifests/<phase>/<bucket>-bands.npy`): the served global entry ids grouped band by
band in serving order (band 0 is the easiest under `easy_first`, the hardest under `hard_first`),
ascending within each band; uint32 when every id of the bucket fits, else uint64; the bytes
`np.save` writes, published atomically and pinned by sha256. Entries without a score (null
difficulty) form one more band after the scored ones: served last, whatever the direction.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from refinery.curriculum.inventory import (ENTRY_BATCH_ROWS, EntryBatch, TableSlice, batch_languages, has_language, run_chunked,
                                          slice_batches)
from refinery.curriculum.quality_cut import QualityCut, score_keys
from refinery.curriculum.schedule import CurriculumError
from refinery.tasks import RunTasks, in_process

if TYPE_CHECKING:
    from refinery.config import RefineryConfig
    from refinery.curriculum.schedule import Schedule
    from refinery.storage import DataRoot

DIFFICULTY_COLUMN = "difficulty"
LEVEL_BITS = 16
BINS = 1 << LEVEL_BITS
# Cutoffs are 32-bit prefixes of the 64-bit score keys (two histogram levels).
PREFIX_SHIFT = np.uint64(64 - 2 * LEVEL_BITS)
NO_CUTOFF = 1 << 32  # above every prefix: a band no entry reaches


def band_dtype(total_entries: int) -> np.dtype:
    return np.dtype(np.uint32) if total_entries <= 1 << 32 else np.dtype(np.uint64)


def npy_header(dtype: np.dtype, count: int) -> bytes:
    """The .npy header `np.save` writes for `count` values of `dtype`, one dimension."""
    buf = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(np.zeros(0, dtype=dtype))
    np.lib.format.write_array_header_1_0(buf, {**header, "shape": (count,)})
    return buf.getvalue()


@dataclass(frozen=True)
class Served:
    """Which entries of a bucket a phase serves: those of `selection` (the key of a manifest's sorted
    global ids, already checked against its sha256), or the entries whose quality_score is at least
    `quality_cut` keeps (validation, before any selection is written), or every entry."""

    selection: str | None = None
    quality_cut: QualityCut | None = None


@dataclass(frozen=True)
class ServedBatch:
    first: int  # global entry id of the batch's first entry
    ids: np.ndarray  # int64 global ids of the served entries
    tokens: np.ndarray  # int64, per served entry
    scores: np.ndarray  # float64, NaN where the entry has no difficulty


def has_difficulty(root: "DataRoot", table_key: str) -> bool:
    import pyarrow.parquet as pq

    return DIFFICULTY_COLUMN in pq.ParquetFile(root.local_path(table_key)).schema_arrow.names


def batch_slices(parts: list[TableSlice]) -> list[TableSlice]:
    """The rows of `parts` (a table's slices, in order) cut at every `ENTRY_BATCH_ROWS` rows of the
    table instead: the batches a single reader of the whole table reads."""
    last = parts[-1]
    total = last.first + last.rows
    starts = range(0, max(total, 1), ENTRY_BATCH_ROWS)
    return [TableSlice(last.bucket, last.table, first, min(ENTRY_BATCH_ROWS, total - first), first == starts[-1])
            for first in starts]


def served_batches(root: "DataRoot", part: TableSlice, served: Served) -> Iterator[ServedBatch]:
    """The served entries' tokens and difficulty in the slice, `ENTRY_BATCH_ROWS` table rows at a time."""
    ids = None if served.selection is None else np.load(root.local_path(served.selection), mmap_mode="r")
    cut = served.quality_cut
    columns = ["tokens", DIFFICULTY_COLUMN] + (["quality_score"] if cut is not None else [])
    if cut is not None and cut.needs_languages and has_language(root, part.table):
        columns.append("language")
    for first, batch in slice_batches(root, part, columns):
        n = batch.num_rows
        if ids is not None:
            lo, hi = np.searchsorted(ids, [first, first + n])
            local = np.asarray(ids[lo:hi], dtype=np.int64) - first
        elif cut is not None:
            quality = batch.column("quality_score").to_numpy(zero_copy_only=False).astype(np.float64)
            languages = batch_languages(batch, n) if cut.needs_languages else None
            local = np.flatnonzero(cut.keeps(EntryBatch(first, np.zeros(0), np.zeros(0), quality, languages))).astype(np.int64)
        else:
            local = np.arange(n, dtype=np.int64)
        scores = batch.column(DIFFICULTY_COLUMN).to_numpy(zero_copy_only=False).astype(np.float64)  # nulls: NaN
        tokens = batch.column("tokens").to_numpy(zero_copy_only=False).astype(np.int64)
        yield ServedBatch(first, first + local, tokens[local], scores[local] + 0.0)  # -0.0 becomes 0.0


def _prefixes(scores: np.ndarray) -> np.ndarray:
    """uint64 32-bit key prefixes of the scored entries, in score order (NaN left out)."""
    return score_keys(scores[~np.isnan(scores)]) >> PREFIX_SHIFT


def _sparse(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    reached = np.flatnonzero(counts)
    return reached, counts[reached]


def level1_task(root: "DataRoot", item: tuple[TableSlice, Served], cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """One slice's histogram of the served scores' leading 16 key bits, sparse: (bins, counts) (a task)."""
    part, served = item
    level1 = np.zeros(BINS, dtype=np.int64)
    for batch in served_batches(root, part, served):
        level1 += np.bincount((_prefixes(batch.scores) >> np.uint64(LEVEL_BITS)).astype(np.intp), minlength=BINS)
    return _sparse(level1)


def level2_task(root: "DataRoot", item: tuple[TableSlice, Served, list[int]],
                cache: dict) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """One slice's histograms of the next 16 key bits inside each of the `chosen` leading bins,
    sparse (a task)."""
    part, served, chosen_bins = item
    chosen = np.array(chosen_bins, dtype=np.uint64)
    level2 = {b: np.zeros(BINS, dtype=np.int64) for b in chosen_bins}
    for batch in served_batches(root, part, served):
        prefixes = _prefixes(batch.scores)
        high = prefixes >> np.uint64(LEVEL_BITS)
        for b in chosen[np.isin(chosen, high)].tolist():
            level2[b] += np.bincount((prefixes[high == b] & np.uint64(BINS - 1)).astype(np.intp), minlength=BINS)
    return {b: _sparse(counts) for b, counts in level2.items() if counts.any()}


def band_cutoffs(run_tasks: RunTasks, parts: list[TableSlice], served: Served, bands: int) -> tuple[np.ndarray, int]:
    """(the bands - 1 ascending cutoff prefixes, scored served entries): ascending band k holds the
    scored entries whose prefix lies in [cutoff k-1, cutoff k). Two passes over the table, a task per slice."""
    level1 = np.zeros(BINS, dtype=np.int64)
    for reached, counts in run_chunked(run_tasks, level1_task, [(part, served) for part in parts]):
        level1[reached] += counts
    scored = int(level1.sum())
    ranks = [-(-k * scored // bands) for k in range(1, bands)]  # the ascending rank each band from the second starts at
    cum = np.cumsum(level1)
    wanted = [(int(np.searchsorted(cum, r, side="right")), r) for r in ranks if r < scored]
    level2 = {b: np.zeros(BINS, dtype=np.int64) for b, _ in wanted}
    if level2:
        chosen = sorted(level2)
        for found in run_chunked(run_tasks, level2_task, [(part, served, chosen) for part in parts]):
            for b, (reached, counts) in found.items():
                level2[b][reached] += counts
    cutoffs = []
    for b, r in wanted:
        inside = r - (int(cum[b - 1]) if b else 0)
        cutoffs.append(b << LEVEL_BITS | int(np.searchsorted(np.cumsum(level2[b]), inside, side="right")))
    cutoffs += [NO_CUTOFF] * (bands - 1 - len(cutoffs))
    return np.array(cutoffs, dtype=np.uint64), scored


def served_band(scores: np.ndarray, cutoffs: np.ndarray, descending: bool) -> np.ndarray:
    """Each entry's band in serving order (int64); entries without a score get len(cutoffs) + 1."""
    bands = len(cutoffs) + 1
    out = np.full(len(scores), bands, dtype=np.int64)
    scored = ~np.isnan(scores)
    ascending = np.searchsorted(cutoffs, score_keys(scores[scored]) >> PREFIX_SHIFT, side="right")
    out[scored] = bands - 1 - ascending if descending else ascending
    return out


@dataclass(frozen=True)
class BucketBands:
    """What an order makes of one bucket: per band in serving order (the unscored band last, when
    any entry lacks a score) its entries, tokens and mean difficulty (None for the unscored band)."""

    entries: list[int]
    tokens: list[int]
    mean_difficulty: list[float | None]
    cutoffs: list[int]  # the 32-bit key prefixes between ascending bands
    unscored: int  # entries without a score (the last band's, when > 0)

    def to_json(self) -> dict[str, Any]:
        return {"entries": self.entries, "tokens": self.tokens, "mean_difficulty": self.mean_difficulty,
                "unscored": self.unscored}


def band_totals_task(root: "DataRoot", item: tuple[TableSlice, Served, list[int], bool],
                     cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One batch slice's served entries, tokens and difficulty sum per band (and the unscored band),
    each sum added up in row order in one bincount, as a reader of that batch adds it (a task)."""
    part, served, cutoff_list, descending = item
    cutoffs = np.array(cutoff_list, dtype=np.uint64)
    read = list(served_batches(root, part, served))
    scores = np.concatenate([np.zeros(0)] + [batch.scores for batch in read])
    tokens = np.concatenate([np.zeros(0, dtype=np.int64)] + [batch.tokens for batch in read])
    band, slots = served_band(scores, cutoffs, descending), len(cutoffs) + 2
    return (np.bincount(band, minlength=slots), np.bincount(band, weights=tokens, minlength=slots).astype(np.int64),
            np.bincount(band, weights=np.nan_to_num(scores), minlength=slots))


def bucket_bands(root: "DataRoot", parts: list[TableSlice], served: Served, bands: int, descending: bool,
                 run_tasks: RunTasks | None = None) -> BucketBands | None:
    """The bucket's bands under an order (three passes over its entry table `parts`, as tasks run by
    `run_tasks`; default: in this process); None when no served entry has a difficulty (the score was
    not computed for the bucket, or the bucket has no shards)."""
    run_tasks = run_tasks or in_process(root)
    if not parts or not has_difficulty(root, parts[0].table):
        return None
    cutoffs, scored = band_cutoffs(run_tasks, parts, served, bands)
    if scored == 0:
        return None
    entries, tokens = np.zeros(bands + 1, dtype=np.int64), np.zeros(bands + 1, dtype=np.int64)
    sums = np.zeros(bands + 1, dtype=np.float64)
    items = [(part, served, cutoffs.tolist(), descending) for part in batch_slices(parts)]
    for batch_entries, batch_tokens, batch_sums in run_chunked(run_tasks, band_totals_task, items):
        entries += batch_entries
        tokens += batch_tokens
        sums += batch_sums
    unscored = int(entries[bands])
    kept = bands + (1 if unscored else 0)
    means = [float(s / n) if n else None for s, n in zip(sums[:bands].tolist(), entries[:bands].tolist())]
    return BucketBands(entries[:kept].tolist(), tokens[:kept].tolist(), means + ([None] if unscored else []),
                       cutoffs.tolist(), unscored)


def band_ids_task(root: "DataRoot", item: tuple[TableSlice, Served, list[int], bool],
                  cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """One slice's served ids grouped by band, ascending within each, and each band's count (the
    unscored band last) (a task)."""
    part, served, cutoff_list, descending = item
    cutoffs = np.array(cutoff_list, dtype=np.uint64)
    read = list(served_batches(root, part, served))
    ids = np.concatenate([np.zeros(0, dtype=np.int64)] + [batch.ids for batch in read])
    band = np.concatenate([np.zeros(0, dtype=np.int64)] + [served_band(batch.scores, cutoffs, descending) for batch in read])
    return ids[np.argsort(band, kind="stable")], np.bincount(band, minlength=len(cutoffs) + 2)


def write_band_file(root: "DataRoot", key: str, parts: list[TableSlice], served: Served, total_entries: int,
                    bands: BucketBands, descending: bool, run_tasks: RunTasks | None = None) -> str:
    """Write the band file (module doc) under `key` in one more pass, a task per slice; returns its
    sha256. Each slice's ids of a band land at the band's offset in slice order, so nothing per
    entry is held beyond a chunk of slices."""
    dtype = band_dtype(total_entries)
    table_key = parts[0].table
    header = npy_header(dtype, sum(bands.entries))
    at = len(header) + dtype.itemsize * np.cumsum([0, *bands.entries])[:-1]
    written = np.zeros(len(bands.entries), dtype=np.int64)
    items = [(part, served, bands.cutoffs, descending) for part in parts]
    with root.writer(key) as tmp, open(tmp, "wb") as f:
        f.write(header)
        f.truncate(len(header) + dtype.itemsize * sum(bands.entries))
        for ids, counts in run_chunked(run_tasks or in_process(root), band_ids_task, items):
            ends = np.cumsum(counts)
            for b in np.flatnonzero(counts).tolist():
                if b >= len(bands.entries) or written[b] + counts[b] > bands.entries[b]:
                    raise CurriculumError(f"{root.display(table_key)}: the difficulty column changed while "
                                          "phase_manifests read it; rebuild the manifest")
                f.seek(int(at[b]) + dtype.itemsize * int(written[b]))
                f.write(ids[ends[b] - counts[b]:ends[b]].astype(dtype).tobytes())
                written[b] += counts[b]
        if written.tolist() != bands.entries:
            raise CurriculumError(f"{root.display(table_key)}: the entry table changed while phase_manifests read "
                                  "it; rebuild the manifest")
    return root.sha256(key)


# Cells per phase over which `served_difficulty` integrates each bucket's tokens.
PROGRESS_CELLS = 1000


def served_difficulty(cfg: "RefineryConfig", schedule: "Schedule", bands: dict[str, dict[str, dict[str, Any] | None]],
                      points: np.ndarray) -> np.ndarray:
    """The mean difficulty served at each token position in `points`: in an ordered phase, the
    mixture-weighted mean of the band each weighted bucket is reading there; NaN in a uniform phase
    or where no weighted bucket has a scored band. `bands` is phase -> bucket -> BucketBands.to_json()
    (None: the bucket has no scores).

    As the trainer reads them, the phases that read the same entries of a bucket (the same bucket
    and quality cutoff, in any order) share one stream and its passes. An ordered phase goes on
    with the pass under way: the part of it already read is taken to be spread evenly over the
    bands (exact after a uniform phase), so each band has that fraction fewer tokens left; a phase
    with the same order as the one before it on the stream continues its band; later passes read
    every band whole, from band 0."""
    assert cfg.curriculum is not None
    points = np.asarray(points, dtype=np.float64)
    out = np.full(len(points), np.nan)
    # (bucket, quality cutoff) -> (tokens of the stream read so far, the order reading it, where that order began)
    streams: dict[tuple, tuple[float, str | None, float]] = {}
    for span, phase in zip(schedule.phases, cfg.curriculum.phases):
        if span.tokens == 0:
            continue
        order = None if phase.order is None else phase.order.model_dump_json()
        cells = min(PROGRESS_CELLS, span.tokens)
        width = span.tokens / cells
        weights = np.stack([schedule.weights_at(int(span.start + (i + 0.5) * width)) for i in range(cells)])
        inside = (points >= span.start) & (points < span.end)
        cell = np.minimum(((points[inside] - span.start) / width).astype(np.int64), cells - 1)
        num, den = np.zeros(inside.sum()), np.zeros(inside.sum())
        for b, bucket in enumerate(schedule.buckets):
            if not weights[:, b].any():
                continue
            key = (bucket, phase.quality_top_fraction)
            before, reader, began = streams.get(key, (0.0, None, 0.0))
            if reader != order:
                began = before  # the pass under way is handed to this phase's order here
            streams[key] = (before + float(weights[:, b].sum() * width), order, began)
            banded = bands.get(span.name, {}).get(bucket) if order is not None else None
            if banded is None:
                continue
            read = before + np.cumsum(weights[:, b] * width) - weights[:, b] * width / 2
            tokens = np.asarray(banded["tokens"], dtype=np.float64)
            whole = tokens.sum()
            pass_end = began - began % whole + whole
            left = np.cumsum(tokens * (1.0 - (began % whole) / whole))  # what the handover's pass left of each band
            band = np.where(read < pass_end, np.searchsorted(left, read - began, side="right"),
                            np.searchsorted(np.cumsum(tokens), (read - pass_end) % whole, side="right"))
            band = np.minimum(band, len(tokens) - 1)[cell]
            means = np.array([np.nan if m is None else m for m in banded["mean_difficulty"]])[band]
            w = np.where(np.isnan(means), 0.0, weights[cell, b])
            num += w * np.nan_to_num(means)
            den += w
        if order is not None:
            with np.errstate(invalid="ignore"):
                out[inside] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return out


def difficulty_progress(cfg: "RefineryConfig", schedule: "Schedule",
                        bands: dict[str, dict[str, dict[str, Any] | None]], steps: int = 10) -> dict[str, list[float | None]]:
    """Per ordered phase, the mean difficulty served at the middle of each `steps`-th of it."""
    out = {}
    for span, phase in zip(schedule.phases, cfg.curriculum.phases if cfg.curriculum else []):
        if phase.order is None:
            continue
        points = span.start + (np.arange(steps) + 0.5) / steps * span.tokens
        values = served_difficulty(cfg, schedule, bands, points)
        out[span.name] = [None if np.isnan(v) else float(v) for v in values.tolist()]
    return out
