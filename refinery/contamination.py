"""Eval-set contamination: word n-gram overlap between a phase's corpus and the eval sets.

The common standard is 13-gram overlap on normalized words (GPT-3, Llama). Each eval item's
n-grams are hashed to 64 bits and kept in one sorted numpy array with the item each came from, so a
document is checked with one vectorised `searchsorted` over its own n-gram hashes. A hit records
the document, the eval item and the matched n-gram as text, so a person can verify it.

Anneal replays its corpus 2-4 times when the model is most receptive (seed 000), so this scan is
re-run right before anneal starts; `ScanReport.fingerprint` pins what it scanned (the manifest and
eval-set hashes) so a stale scan can be recognised.

A phase with nothing to check against (no eval sets, or none with an item of `ngram` words) is
"not scanned", never "passed": the report says why and how many documents went unchecked, and
`verdict` words it the same way for the asset check (a warning), `refinery scan` and the demo.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import polars as pl

from refinery.config import ContaminationConfig, RefineryConfig
from refinery.storage import sha256_file

_WORD_HASH_SEED = 0x5EED
# An odd 64-bit multiplier for the polynomial n-gram hash; arithmetic wraps mod 2**64 on purpose.
_BASE = np.uint64(0x9E3779B97F4A7C15)


class ContaminationError(ValueError):
    """An eval set that cannot be read, or a scan that cannot run. The message says which and why."""


def _normalized_word_lists(texts: list[str | None]) -> pl.Series:
    """Lower-cased runs of word characters per text: punctuation, case and whitespace do not hide a
    leak. Polars does the splitting in Rust, which is most of a scan's cost."""
    return pl.Series(texts, dtype=pl.String).fill_null("").str.to_lowercase().str.extract_all(r"\w+")


def normalized_words(text: str) -> list[str]:
    return _normalized_word_lists([text])[0].to_list()


def word_hashes(texts: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
    """(64-bit hash of every word of every text, back to back; word count of each text).

    Polars' seeded hash is stable within a Polars version; the index and the documents are hashed
    in the same process and hashes are never stored, so that is all a scan needs."""
    lists = _normalized_word_lists(texts)
    counts = lists.list.len().to_numpy().astype(np.int64)
    flat = lists.explode().drop_nulls()
    return flat.hash(seed=_WORD_HASH_SEED).to_numpy(), counts


def ngram_hashes(word_hashes: np.ndarray, n: int) -> np.ndarray:
    """Hash of every window of `n` consecutive words: sum_k h[i+k] * BASE^(n-1-k) mod 2**64."""
    m = len(word_hashes) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    out = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            out *= _BASE
            out += word_hashes[k : k + m]
    return out


def eval_set_lines(path: Path) -> Iterator[tuple[str, str]]:
    """(id, text) of each non-blank line of a JSONL eval set of {"id", "text"} objects, one line
    read at a time; ContaminationError naming the line for one that is not."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                item_id, text = str(rec["id"]), rec["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ContaminationError(
                    f"{path}:{lineno}: each line must be a JSON object with `id` and `text` ({err})"
                ) from None
            if not isinstance(text, str):
                raise ContaminationError(f"{path}:{lineno}: `text` must be a string")
            yield item_id, text


@dataclass(frozen=True)
class EvalItem:
    eval_set: str
    item_id: str


class EvalIndex:
    """Every n-gram of every eval item, as a sorted hash array plus the item each came from.

    A bitmap over the low bits of the hashes, about 16 bits per n-gram, answers "certainly not in
    the index" for almost every n-gram of a clean document with one gather; only the rest pay for
    the binary search. The bitmap stops growing at MAX_BITMAP_BITS (128 MiB)."""

    MAX_BITMAP_BITS = 1 << 30

    def __init__(self, n: int, hashes: np.ndarray, items: np.ndarray, catalogue: list[EvalItem], texts: list[list[str]], sha256: dict[str, str]):
        self.n = n
        self.hashes = hashes
        bits = min(self.MAX_BITMAP_BITS, 1 << max(6, (16 * max(len(hashes), 1) - 1).bit_length()))
        self._mask = np.uint64(bits - 1)
        self._bitmap = np.zeros(bits // 8, dtype=np.uint8)
        low = hashes & self._mask
        np.bitwise_or.at(self._bitmap, (low >> np.uint64(3)).astype(np.int64), (np.uint8(1) << (low & np.uint64(7)).astype(np.uint8)))
        self.items = items
        self.catalogue = catalogue
        self._texts = texts  # each item's text, to show the matched n-gram
        self.sha256 = sha256  # eval-set name -> file hash: a scan is stale when these change

    @classmethod
    def build(cls, cfg: RefineryConfig) -> "EvalIndex":
        ccfg = cfg.contamination
        records: list[tuple[str, str, str]] = []  # (eval set, item id, text)
        digests: dict[str, str] = {}
        for es in ccfg.eval_sets:
            path = Path(cfg.resolve(es.path))
            if not path.is_file():
                raise ContaminationError(
                    f"contamination.eval_sets[{es.name}].path: {path} not found; list JSONL files of {{id, text}}"
                )
            digests[es.name] = sha256_file(path)
            records += [(es.name, item_id, text) for item_id, text in eval_set_lines(path)]
        return cls.from_records(ccfg.ngram, records, digests)

    @classmethod
    def from_records(cls, n: int, records: list[tuple[str, str, str]], digests: dict[str, str]) -> "EvalIndex":
        """The index of (eval set, item id, text) records, `digests` naming what they were read from."""
        flat, counts = word_hashes([text for _, _, text in records])
        ends = np.cumsum(counts)
        all_hashes: list[np.ndarray] = []
        all_items: list[np.ndarray] = []
        catalogue: list[EvalItem] = []
        texts: list[str] = []
        for (name, item_id, text), end, count in zip(records, ends.tolist(), counts.tolist()):
            grams = ngram_hashes(flat[end - count:end], n)
            if len(grams) == 0:
                continue  # shorter than one n-gram: it cannot leak by this measure
            all_hashes.append(grams)
            all_items.append(np.full(len(grams), len(catalogue), dtype=np.int32))
            catalogue.append(EvalItem(name, item_id))
            texts.append(text)
        hashes = np.concatenate(all_hashes) if all_hashes else np.zeros(0, dtype=np.uint64)
        items = np.concatenate(all_items) if all_items else np.zeros(0, dtype=np.int32)
        order = np.argsort(hashes, kind="stable")
        return cls(n, hashes[order], items[order], catalogue, texts, digests)

    def __len__(self) -> int:
        return len(self.hashes)

    def may_contain(self, grams: np.ndarray) -> np.ndarray:
        """False where an n-gram hash is certainly not in the index; True may be a bitmap collision."""
        low = grams & self._mask
        return (self._bitmap[(low >> np.uint64(3)).astype(np.intp)] >> (low & np.uint64(7)).astype(np.uint8)) & 1 == 1

    def matched_ngram(self, item: int, gram_hash: int) -> str:
        words = normalized_words(self._texts[item])
        grams = ngram_hashes(word_hashes([self._texts[item]])[0], self.n)
        pos = int(np.flatnonzero(grams == np.uint64(gram_hash))[0])
        return " ".join(words[pos : pos + self.n])


@dataclass
class Hit:
    doc_id: str
    url: str | None
    bucket: str
    eval_set: str
    eval_id: str
    ngram: str
    matched_ngrams: int  # how many distinct n-grams of this document are in the eval sets


NOT_SCANNED = "not scanned"


@dataclass
class ScanReport:
    phase: str
    ngram: int
    docs_scanned: int
    contaminated_docs: int
    max_contaminated_docs: int
    hits: list[Hit] = field(default_factory=list)
    wall_s: float = 0.0
    fingerprint: dict[str, str] = field(default_factory=dict)  # manifest + eval-set hashes scanned
    not_scanned: str | None = None  # why no document could be checked (`unscannable`); None when scanned
    docs_unscanned: int = 0  # the phase's documents left unchecked for that reason

    @property
    def passed(self) -> bool:
        """Scanned, and within the limit: a phase that was not scanned has not passed."""
        return self.not_scanned is None and self.contaminated_docs <= self.max_contaminated_docs

    @property
    def status(self) -> str:
        return NOT_SCANNED if self.not_scanned is not None else "passed" if self.passed else "failed"

    @property
    def docs_per_s(self) -> float:
        return self.docs_scanned / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        d["status"] = self.status
        d["docs_per_s"] = round(self.docs_per_s, 1)
        return d


def verdict(report: dict) -> str:
    """A scan report (`ScanReport.to_json()`, fresh or stored) in one line: the words the asset
    check, `refinery scan` and the demo summary all use."""
    if report.get("not_scanned"):
        return (f"{NOT_SCANNED}: {report['not_scanned']}; none of the phase's {report['docs_unscanned']:,} documents "
                f"was checked for contamination (a warning: training is not held back for it)")
    return (f"{report['contaminated_docs']} of {report['docs_scanned']:,} documents share a {report['ngram']}-gram "
            f"with an eval set (limit {report['max_contaminated_docs']}): {'passed' if report['passed'] else 'FAILED'}")


def unscannable(ccfg: ContaminationConfig, index: "EvalIndex") -> str | None:
    """Why a scan against `index` could find nothing whatever the documents hold, or None."""
    if not ccfg.eval_sets:
        return "no eval sets configured (list JSONL files of {id, text} under contamination.eval_sets)"
    if len(index) == 0:
        names = ", ".join(es.name for es in ccfg.eval_sets)
        return f"no item of the eval sets ({names}) has the {ccfg.ngram} words (contamination.ngram) a match needs"
    return None


SCAN_BATCH_DOCS = 2048  # documents split, hashed and looked up together: one Polars and numpy pass per batch
SCAN_BATCH_BYTES = 16 << 20  # and at most this many bytes of their text (a larger document alone)
# Rows of a clean table a scan task reads at a time (and at most SCAN_BATCH_BYTES of text).
SCAN_READ_ROWS = 10_000


def _scan_batches(docs: Iterable[tuple[str, str | None, str, str]]) -> Iterator[list[tuple[str, str | None, str, str]]]:
    """`docs` in lists of at most SCAN_BATCH_DOCS documents and SCAN_BATCH_BYTES bytes of text."""
    batch: list[tuple[str, str | None, str, str]] = []
    held = 0
    for doc in docs:
        size = len(doc[3].encode()) if doc[3] else 0
        if batch and (len(batch) == SCAN_BATCH_DOCS or held + size > SCAN_BATCH_BYTES):
            yield batch
            batch, held = [], 0
        batch.append(doc)
        held += size
    if batch:
        yield batch


def _in_index(index: EvalIndex, grams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found mask, index position) of each n-gram hash."""
    pos = np.searchsorted(index.hashes, grams)
    pos[pos == len(index.hashes)] = 0
    return index.hashes[pos] == grams, pos


def scan_documents(
    index: EvalIndex, docs: Iterable[tuple[str, str | None, str, str]]
) -> Iterator[Hit]:
    """Yield one Hit per contaminated document of (doc_id, url, bucket, text), in input order.

    A batch's words are hashed as one array and its n-grams rolled over the whole array; windows
    that cross a document boundary are masked out, so the answer is the per-document one."""
    if len(index) == 0:
        return
    n = index.n
    for batch in _scan_batches(docs):
        flat, lengths = word_hashes([text for _, _, _, text in batch])
        ends = np.cumsum(lengths)
        starts = ends - lengths
        grams = ngram_hashes(flat, n)
        if len(grams) == 0:
            continue
        candidates = np.flatnonzero(index.may_contain(grams))
        candidates = candidates[_in_index(index, grams[candidates])[0]]
        doc_of = np.searchsorted(ends, candidates, side="right")
        inside = candidates + n <= ends[doc_of]  # windows that cross into the next document do not count
        for d in np.unique(doc_of[inside]).tolist():
            doc_id, url, bucket, _ = batch[d]
            distinct = np.unique(grams[starts[d]:ends[d] - n + 1])
            hit, pos = _in_index(index, distinct)
            first = int(np.flatnonzero(hit)[0])
            item = int(index.items[pos[first]])
            ev = index.catalogue[item]
            yield Hit(
                doc_id=doc_id,
                url=url,
                bucket=bucket,
                eval_set=ev.eval_set,
                eval_id=ev.item_id,
                ngram=index.matched_ngram(item, int(distinct[first])),
                matched_ngrams=int(hit.sum()),
            )


def scan(
    phase: str,
    ccfg: ContaminationConfig,
    index: EvalIndex,
    docs: Iterable[tuple[str, str | None, str, str]],
    fingerprint: dict[str, str],
) -> ScanReport:
    start = time.perf_counter()
    counted = _Counted(docs)
    hits = sorted(scan_documents(index, counted), key=lambda h: h.doc_id)
    return ScanReport(
        phase=phase,
        ngram=index.n,
        docs_scanned=counted.n,
        contaminated_docs=len(hits),
        max_contaminated_docs=ccfg.max_contaminated_docs,
        hits=hits,
        wall_s=time.perf_counter() - start,
        fingerprint=fingerprint,
    )


class _Counted:
    def __init__(self, it: Iterable):
        self._it, self.n = it, 0

    def __iter__(self):
        for x in self._it:
            self.n += 1
            yield x
