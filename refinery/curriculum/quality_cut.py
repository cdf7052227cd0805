"""What a phase with a quality cutoff keeps of a bucket: the best-scored documents by `quality_score`
holding the top fraction of its tokens, found exactly in memory that does not grow with the bucket.

The per-entry table is streamed in batches of `ENTRY_BATCH_ROWS`:
histograms of the scores' leading bits, 16 bits a pass, narrow the cutoff to one bin, and once a bin
holds at most `BRACKET_ENTRIES` entries their scores are read and the cutoff found exactly. The
cutoff, kept documents, entries and tokens are exactly those of ranking every document at once.

A phase's cut is per language by default (`curriculum.phases[].quality_cut: per_language`): the
entry table's `language` column (language_filtered's, null read as "unknown") splits the bucket, and
each language keeps its own top fraction of its tokens, so each keeps its share of the bucket's
tokens whatever its scores (FineWeb-2 keeps every filter per language). The unit is tokens, not
documents: the better-scored documents are longer, so a top 25% of documents held 47.5% of a web
bucket's tokens on a real crawl (issue 47). One census pass counts each language's tokens; then
each language's cutoff is found as above over its own entries: 1 + 2 x languages passes of the
columns tokens, window, quality_score and language, the state of one language's histogram at a time
(`quality_cut: global` ranks the bucket as one, then counts what each language kept in one pass).

Each pass runs as tasks over the inventory's table slices (inventory.py), one per final shard, and the
step adds their results up in shard order, a chunk of tasks at a time (inventory.run_chunked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np

from refinery.config import RefineryConfig
from refinery.curriculum.inventory import (BucketInventory, EntryBatch, TableSlice, entry_batches, in_language,
                                           inventory_slices, run_chunked)
from refinery.curriculum.schedule import CurriculumError
from refinery.layout import final_index_key
from refinery.tasks import RunTasks, in_process

if TYPE_CHECKING:
    from refinery.storage import DataRoot

# The most entries whose scores are held at once to find a cutoff exactly: 17 bytes each (a 64-bit
# score key, 64-bit tokens, a flag), so 17 MiB.
BRACKET_ENTRIES = 1 << 20
# Bits of the score key one histogram pass resolves: 65,536 bins of three 64-bit counts, 1.5 MiB.
LEVEL_BITS = 16
KEY_BITS = 64


@dataclass(frozen=True)
class QualityCut:
    """What a phase's quality cut keeps of a bucket: the entries scoring at least `cutoff` (a global
    cut), or at least their language's cutoff in `by_language` (a language not listed keeps nothing)."""

    cutoff: float | None = None
    by_language: dict[str, float] | None = None

    def keeps(self, batch: EntryBatch) -> np.ndarray:
        if self.by_language is None:
            return batch.scores >= self.cutoff
        lowest = np.array([self.by_language.get(lang, math.inf) for lang in batch.languages.tolist()], dtype=np.float64)
        return batch.scores >= lowest

    @property
    def needs_languages(self) -> bool:
        return self.by_language is not None


def as_cut(cut: "float | QualityCut") -> QualityCut:
    return cut if isinstance(cut, QualityCut) else QualityCut(cutoff=cut)


def score_keys(scores: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the (non-NaN) float64 scores: the sign bit flipped for positive
    scores, every bit for negative ones."""
    bits = scores.view(np.uint64)
    return np.where(bits >> np.uint64(63) != 0, ~bits, bits | np.uint64(1 << 63))


def key_score(key: int) -> float:
    bits = key & ~(1 << 63) if key >> 63 else ~key & (2**64 - 1)
    return float(np.array(bits, dtype=np.uint64).view(np.float64))


@dataclass
class Kept:
    """What a cutoff keeps: entries, their tokens and the documents they belong to."""

    entries: int = 0
    tokens: int = 0
    documents: int = 0

    def add_bins(self, hist: "ScoreHistogram", bins: slice) -> None:
        self.entries += int(hist.entries[bins].sum())
        self.tokens += int(hist.tokens[bins].sum())
        self.documents += int(hist.documents[bins].sum())


@dataclass(frozen=True)
class ScoreHistogram:
    """Per bin of the next `LEVEL_BITS` bits of the score key, over the scored entries whose key
    starts with a prefix: entries, documents (first windows) and tokens. Plus the whole table's
    entries, documents and tokens, scored or not."""

    entries: np.ndarray
    documents: np.ndarray
    tokens: np.ndarray
    table: Kept


@dataclass(frozen=True)
class SliceHistogram:
    """A `ScoreHistogram` of one slice, sparse: only the bins its entries reach."""

    bins: np.ndarray  # intp, ascending
    entries: np.ndarray
    documents: np.ndarray
    tokens: np.ndarray
    table: Kept


def slice_histogram_task(root: "DataRoot", item: tuple[TableSlice, int, int, str | None], cache: dict) -> SliceHistogram:
    """One slice's histogram of the keys whose leading `fixed` bits are `prefix`, over the entries
    of one language (all of them for None) (a task)."""
    part, prefix, fixed, language = item
    bins = 1 << LEVEL_BITS
    entries, documents, tokens = (np.zeros(bins, dtype=np.int64) for _ in range(3))
    table = Kept()
    shift = np.uint64(KEY_BITS - fixed - LEVEL_BITS)
    for batch in entry_batches(root, part, languages=language is not None):
        batch = in_language(batch, language)
        table.entries += len(batch.tokens)
        table.tokens += int(batch.tokens.sum())
        table.documents += int(batch.first_window.sum())
        scored = ~np.isnan(batch.scores)
        keys = score_keys(batch.scores[scored])
        inside = keys >> np.uint64(KEY_BITS - fixed) == np.uint64(prefix) if fixed else np.ones(len(keys), dtype=bool)
        binned = ((keys[inside] >> shift) & np.uint64(bins - 1)).astype(np.intp)
        entries += np.bincount(binned, minlength=bins)
        documents += np.bincount(binned[batch.first_window[scored][inside]], minlength=bins)
        # float64 weights are exact here: a batch's tokens stay far below 2^53
        tokens += np.bincount(binned, weights=batch.tokens[scored][inside], minlength=bins).astype(np.int64)
    reached = np.flatnonzero(entries)
    return SliceHistogram(reached, entries[reached], documents[reached], tokens[reached], table)


def score_histogram(run_tasks: RunTasks, parts: list[TableSlice], prefix: int, fixed: int,
                    language: str | None = None) -> ScoreHistogram:
    """One pass over the entry table, a task per slice: the histogram of the keys whose leading
    `fixed` bits are `prefix`, over one language's entries (all of them for None)."""
    bins = 1 << LEVEL_BITS
    entries, documents, tokens = (np.zeros(bins, dtype=np.int64) for _ in range(3))
    table = Kept()
    for found in run_chunked(run_tasks, slice_histogram_task, [(part, prefix, fixed, language) for part in parts]):
        entries[found.bins] += found.entries
        documents[found.bins] += found.documents
        tokens[found.bins] += found.tokens
        table.entries += found.table.entries
        table.tokens += found.table.tokens
        table.documents += found.table.documents
    return ScoreHistogram(entries, documents, tokens, table)


def check_table(root: "DataRoot", inv: BucketInventory, table: Kept) -> None:
    if (table.entries, table.tokens) != (inv.entries, inv.tokens):
        assert inv.entries_table is not None
        raise CurriculumError(
            f"{root.display(inv.entries_table)}: {table.entries} entries / {table.tokens} tokens, but "
            f"{root.display(final_index_key(inv.bucket))} lists {inv.entries} / {inv.tokens}; "
            f"re-materialize shuffled_shards[{inv.bucket}]"
        )


def bracket_task(root: "DataRoot", item: tuple[TableSlice, int, int, str | None], cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One slice's (keys, tokens, first-window flags) of the scored entries of one language (all for
    None) whose key starts with `prefix` (a task)."""
    part, prefix, fixed, language = item
    keys, tokens, first_window = [np.zeros(0, dtype=np.uint64)], [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=bool)]
    for batch in entry_batches(root, part, languages=language is not None):
        batch = in_language(batch, language)
        scored = ~np.isnan(batch.scores)
        batch_keys = score_keys(batch.scores[scored])
        inside = batch_keys >> np.uint64(KEY_BITS - fixed) == np.uint64(prefix)
        keys.append(batch_keys[inside])
        tokens.append(batch.tokens[scored][inside])
        first_window.append(batch.first_window[scored][inside])
    return np.concatenate(keys), np.concatenate(tokens), np.concatenate(first_window)


def bracket_cutoff(run_tasks: RunTasks, parts: list[TableSlice], prefix: int, fixed: int, rank: int, kept: Kept,
                   language: str | None = None) -> int:
    """The key at which the best entries (of `language`; all for None) whose key starts with
    `prefix` (at most BRACKET_ENTRIES of them, read in one pass) first hold `rank` tokens; adds what
    it keeps of them to `kept`."""
    keys, tokens, first_window = zip(*run_chunked(run_tasks, bracket_task,
                                                  [(part, prefix, fixed, language) for part in parts]))
    all_keys, all_tokens, all_first = np.concatenate(keys), np.concatenate(tokens), np.concatenate(first_window)
    best_first = np.argsort(all_keys, kind="stable")[::-1]
    reached = int(np.searchsorted(np.cumsum(all_tokens[best_first]), rank))
    cutoff = int(all_keys[best_first[min(reached, len(best_first) - 1)]])
    kept_here = all_keys >= np.uint64(cutoff)
    kept.entries += int(kept_here.sum())
    kept.tokens += int(all_tokens[kept_here].sum())
    kept.documents += int((kept_here & all_first).sum())
    return cutoff


@dataclass(frozen=True)
class QualitySelection:
    """What a phase keeps of a bucket under its quality cut: the entries `cut` keeps
    (`kept_entry_ids` lists them), and per language the documents of the bucket and those kept."""

    cutoff: float  # the lowest kept document score (of any language)
    documents: int
    entries: int
    tokens: int
    cut: QualityCut | None = None
    # language -> {documents, kept, tokens, kept_tokens, share_of_bucket, share_of_selection} (shares of tokens)
    languages: dict[str, dict[str, float]] | None = None


def _top_tokens(run_tasks: RunTasks, parts: list[TableSlice], top_fraction: float, tokens: int | None,
                language: str | None) -> tuple[int | None, Kept, Kept]:
    """The key of the cutoff keeping the best-scored documents that first hold the top
    `top_fraction` of `tokens` (None: the table's own count) among one language's entries (all for
    None), what it keeps, and what the pass counted of the whole table; key None when nothing there
    is scored. Every window of a document has its score, so a document is kept whole: the cut
    overshoots the fraction by less than the document at the cutoff."""
    kept = Kept()
    prefix = fixed = 0
    hist = score_histogram(run_tasks, parts, prefix, fixed, language)
    table = hist.table
    scored = int(hist.tokens.sum())
    if int(hist.entries.sum()) == 0:
        return None, kept, table
    rank = top_fraction_rank(top_fraction, table.tokens if tokens is None else tokens, scored)
    while True:
        # the highest bin whose tokens, with those of every bin above it, reach `rank`
        above = np.cumsum(hist.tokens[::-1])
        chosen = len(above) - 1 - int(np.searchsorted(above, rank))
        kept.add_bins(hist, slice(chosen + 1, None))
        rank -= int(hist.tokens[chosen + 1:].sum())
        prefix, fixed = (prefix << LEVEL_BITS) | chosen, fixed + LEVEL_BITS
        if fixed == KEY_BITS:  # every entry of the bin has the cutoff's score
            kept.add_bins(hist, slice(chosen, chosen + 1))
            return prefix, kept, table
        if hist.entries[chosen] <= BRACKET_ENTRIES:
            return bracket_cutoff(run_tasks, parts, prefix, fixed, rank, kept, language), kept, table
        hist = score_histogram(run_tasks, parts, prefix, fixed, language)


def census_task(root: "DataRoot", item: tuple[TableSlice, QualityCut | None], cache: dict) -> dict[str, list[int]]:
    """One slice's [entries, tokens, documents, kept documents, kept tokens] per language, kept
    under `cut` (none: nothing kept) (a task)."""
    part, cut = item
    out: dict[str, list[int]] = {}
    for batch in entry_batches(root, part, languages=True):
        keeps = cut.keeps(batch) if cut is not None else np.zeros(len(batch.scores), dtype=bool)
        for lang in np.unique(batch.languages).tolist():
            mine = batch.languages == lang
            row = out.setdefault(lang, [0, 0, 0, 0, 0])
            row[0] += int(mine.sum())
            row[1] += int(batch.tokens[mine].sum())
            row[2] += int((batch.first_window & mine).sum())
            row[3] += int((batch.first_window & mine & keeps).sum())
            row[4] += int(batch.tokens[mine & keeps].sum())
    return out


def language_census(run_tasks: RunTasks, parts: list[TableSlice], cut: QualityCut | None) -> dict[str, list[int]]:
    """`census_task` over the table, summed per language (one entry per language: bounded by the
    number of languages, never by the corpus)."""
    total: dict[str, list[int]] = {}
    for found in run_chunked(run_tasks, census_task, [(part, cut) for part in parts]):
        for lang, row in found.items():
            total[lang] = [a + b for a, b in zip(total.get(lang, [0] * 5), row)]
    return dict(sorted(total.items()))


def language_shares(census: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """Per language: its documents and tokens, those kept, and its share of the bucket's tokens and
    of the kept tokens (the cut's unit)."""
    tokens = sum(r[1] for r in census.values()) or 1
    kept = sum(r[4] for r in census.values()) or 1
    return {lang: {"documents": r[2], "kept": r[3], "tokens": r[1], "kept_tokens": r[4],
                   "share_of_bucket": round(r[1] / tokens, 6), "share_of_selection": round(r[4] / kept, 6)}
            for lang, r in census.items()}


def select_top_quality(root: "DataRoot", inv: BucketInventory, top_fraction: float,
                       run_tasks: RunTasks | None = None, per_language: bool = True) -> QualitySelection:
    """Keep the best-scored documents, every window of each, until they hold ceil(top_fraction x
    tokens) of the bucket's tokens; with `per_language` (the default), within each language of the
    bucket, counting that language's tokens. The cutoff is the score of the document that reaches
    the count, so the cut keeps the fraction plus less than that one document; ties at a cutoff are
    all kept; a document without a score (empty text) is never kept. Reads the entry table once per histogram level and once for the last bracket (per
    language), plus one census pass, a task per final shard (run by `run_tasks`; default: in this
    process), never all of it at once."""
    run_tasks = run_tasks or in_process(root)
    parts = inventory_slices(inv)
    if not per_language:
        key, kept, table = _top_tokens(run_tasks, parts, top_fraction, None, None)
        check_table(root, inv, table)
        if key is None:
            return QualitySelection(cutoff=math.inf, documents=0, entries=0, tokens=0, cut=QualityCut(cutoff=math.inf))
        cut = QualityCut(cutoff=key_score(key))
        return QualitySelection(cutoff=cut.cutoff, documents=kept.documents, entries=kept.entries, tokens=kept.tokens,
                                cut=cut, languages=language_shares(language_census(run_tasks, parts, cut)))
    census = language_census(run_tasks, parts, None)
    check_table(root, inv, Kept(sum(r[0] for r in census.values()), sum(r[1] for r in census.values()),
                                sum(r[2] for r in census.values())))
    cutoffs, total = {}, Kept()
    for lang, row in census.items():
        key, kept, _ = _top_tokens(run_tasks, parts, top_fraction, row[1], lang)
        cutoffs[lang] = math.inf if key is None else key_score(key)
        row[3], row[4] = kept.documents, kept.tokens
        total.entries += kept.entries
        total.tokens += kept.tokens
        total.documents += kept.documents
    cut = QualityCut(by_language=cutoffs)
    return QualitySelection(cutoff=min(cutoffs.values(), default=math.inf), documents=total.documents,
                            entries=total.entries, tokens=total.tokens, cut=cut, languages=language_shares(census))


def kept_ids_task(root: "DataRoot", item: tuple[TableSlice, QualityCut], cache: dict) -> np.ndarray:
    """The global ids of one slice's entries the cut keeps, ascending (a task)."""
    part, cut = item
    found = [np.zeros(0, dtype=np.int64)]
    for batch in entry_batches(root, part, languages=cut.needs_languages):
        found.append(batch.first + np.flatnonzero(cut.keeps(batch)).astype(np.int64))
    return np.concatenate(found)


def kept_entry_ids(root: "DataRoot", inv: BucketInventory, cut: "float | QualityCut",
                   run_tasks: RunTasks | None = None) -> Iterator[np.ndarray]:
    """The global ids of the entries the cut keeps (a float: those scoring at least it), ascending,
    one array per final shard (a task each, run by `run_tasks`; default: in this process)."""
    yield from run_chunked(run_tasks or in_process(root), kept_ids_task,
                           [(part, as_cut(cut)) for part in inventory_slices(inv)])


def phase_selections(cfg: RefineryConfig, root: "DataRoot", inventory: dict[str, BucketInventory],
                     run_tasks: RunTasks | None = None) -> dict[str, dict[str, QualitySelection]]:
    """For each phase with a quality cutoff: what it keeps of each non-empty bucket."""
    assert cfg.curriculum is not None
    return {
        p.name: {b: select_top_quality(root, inv, p.quality_top_fraction, run_tasks, p.quality_cut == "per_language")
                 for b, inv in inventory.items() if inv.entries}
        for p in cfg.curriculum.phases
        if p.quality_top_fraction is not None
    }


def top_fraction_rank(top_fraction: float, total: int, scored: int) -> int:
    """How many tokens (or documents) a top-`top_fraction` cut of `total` keeps (ties aside): ceil of
    the fraction, at least one, at most the `scored` ones."""
    return min(max(1, math.ceil(top_fraction * total)), scored)


def top_fraction_cutoff(scores: np.ndarray, top_fraction: float, tokens: np.ndarray | None = None) -> float:
    """The cutoff `select_top_quality` finds, over documents' scores held in memory (NaN: unscored)
    and their tokens; without tokens, every document counts one (a cut by documents)."""
    weights = np.ones(len(scores), dtype=np.int64) if tokens is None else np.asarray(tokens, dtype=np.int64)
    scored = ~np.isnan(scores)
    if not scored.any():
        return math.inf
    best_first = np.argsort(scores[scored], kind="stable")[::-1]
    held = np.cumsum(weights[scored][best_first])
    rank = top_fraction_rank(top_fraction, int(weights.sum()), int(held[-1]))
    return float(scores[scored][best_first][min(int(np.searchsorted(held, rank)), len(held) - 1)])


def stratified_cutoffs(scores_by_language: dict[str, np.ndarray], top_fraction: float,
                       tokens_by_language: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """`top_fraction_cutoff` within each language: what `select_top_quality` finds per language,
    given each language's documents' tokens (without them, a cut by documents)."""
    return {lang: top_fraction_cutoff(s, top_fraction, None if tokens_by_language is None else tokens_by_language[lang])
            for lang, s in sorted(scores_by_language.items())}
