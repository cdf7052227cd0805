"""Variants as data: a variant's documents are a selection over the funnel's stored verdicts, read
back from the tables the graph wrote (no stage is rerun to decide what it decided).

- `raw`: every document of extracted_text, with its extracted text; every later verdict and edit
  ignored (language and quality_score are the ones the funnel recorded, where it recorded one).
- `funnel`: the documents pii_redacted keeps, with its text (every edit and the PII redaction).
- `without: [names]`: the funnel plus the documents whose rejection is one the names cover
  (refinery/stages/registry.py `left_out`: a stage, a verdict, or one rule family of it).
- `quality_top: F`: of those, the best-scored documents that first hold ceil(F x tokens) of their
  bucket's and language's tokens (at the packing window, `ablations.seq_len`), every document
  scoring at least the one that reaches the count: the unit and the rule of a phase's `top N%`
  (`refinery.curriculum.quality_cut.stratified_cutoffs`); a document without a score (the quality
  stage off, or a `raw` document the funnel removed before scoring it) is not kept, its tokens
  counted.

What "ignored" means for a document a stage removed, which no later stage ever saw:

- Each document has at most one rejection (the first stage that removed it; none after it read it).
  A readmitted document carries the text its rejecting stage received: its upstream table's text,
  with the edits of the stages before it applied, and the language the funnel found for it.
- It then goes through the stages after its rejection that can judge one document alone, by their
  own code (`Judges`): heuristic_filtered (the rules in its language, the custom filters; its line
  edits apply), exact dedup (its normalized-text hash against the hashes of every document that
  reached dedup, in the signature tables, and of the documents let in before it: a copy is
  removed, the copy already there stays), quality_scored (the published model scores it; the
  threshold drops it unless the variant leaves the quality verdict out) and, always, pii_redacted
  (the safety filter, unless left out, then PII redaction, which is no verdict: only `raw` trains
  on unredacted PII). A removal by one of them that the variant leaves out keeps the document as
  it went in.
- Near dedup is NOT run on it (its clusters are global; MinHash over the corpus is not redone):
  `without: [heuristic]` also keeps heuristic removals that near dedup would have removed next, an
  upper bound by those near copies of what leaving the stage out of the graph would let through.
- Documents the evaluation set holds out (refinery/holdout.py) are in no variant.

Memory: one record batch of a table at a time, plus one partition's rejected doc ids and its
recorded facts (doc_id, language, quality_score: no text); per corpus, only what exact dedup's
judgment of readmitted documents holds (16 bytes per document that reached dedup) and a quality
cut's scores (8 bytes per document of the variant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import polars as pl

from refinery.holdout import held_out_mask
from refinery.ablations.verdicts import VERDICT_TABLES, dedup_hashes, partition_rejects, recorded_facts
from refinery.config import RefineryConfig
from refinery.curriculum.inventory import UNKNOWN_LANGUAGE
from refinery.curriculum.quality_cut import stratified_cutoffs
from refinery.documents import CLEAN_STAGE
from refinery.layout import documents_key
from refinery.global_steps import exact_dedup
from refinery.global_steps.dedup_compute import STAGE as DEDUP_STAGE
from refinery.stage_recipes import build_stage
from refinery.stages.base import Stage
from refinery.stages.attributes import stage_batches
from refinery.stages import registry
from refinery.stages.registry import TEXT_STAGE, LeftOut, funnel_stage, left_out, rule_family
from refinery.storage import DataRoot

# Rows of a table read at a time.
READ_ROWS = 4096


@dataclass(frozen=True)
class Selection:
    """A variant's definition, resolved: its base, what it leaves out and its quality cut."""

    name: str
    base: str
    left_out: tuple[LeftOut, ...]
    quality_top: float | None

    def readmits(self, verdict: str, rule: str) -> bool:
        """Whether a document rejected by `verdict` with `rule` is in the variant (funnel base)."""
        family = rule_family(rule)
        return any(lo.verdict == verdict and (lo.families is None or family in lo.families) for lo in self.left_out)


def variant_selection(cfg: RefineryConfig, name: str) -> Selection:
    assert cfg.ablations is not None
    spec = cfg.ablations.variants[name]
    custom = [f.name for f in cfg.stages.custom_filters]
    resolved = tuple(lo for n in spec.without or () for lo in left_out(n, custom))
    return Selection(name, spec.base, resolved, spec.quality_top)


def clean_schema(root: DataRoot, partition: str) -> dict[str, pl.DataType]:
    """The columns of the funnel's clean documents of one file: every variant's table has them."""
    return dict(pl.read_parquet_schema(root.local_path(documents_key(CLEAN_STAGE, partition))))


def _aligned(batch: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return batch.select([pl.col(c).cast(t) if c in batch.columns else pl.lit(None, dtype=t).alias(c)
                         for c, t in schema.items()])


def _with_facts(batch: pl.DataFrame, facts: pl.DataFrame,
                columns: tuple[str, ...] = ("language", "quality_score")) -> pl.DataFrame:
    """The batch's `columns`, filled from the recorded facts where it has none."""
    recorded = facts.select("doc_id", *columns).rename({c: f"{c}__recorded" for c in columns})
    joined = batch.join(recorded, on="doc_id", how="left", maintain_order="left")
    fill = [pl.coalesce(pl.col(c), pl.col(f"{c}__recorded")).alias(c) if c in batch.columns
            else pl.col(f"{c}__recorded").alias(c) for c in columns]
    return joined.with_columns(fill).drop(*(f"{c}__recorded" for c in columns))


def _not_held_out(cfg: RefineryConfig, batch: pl.DataFrame) -> pl.DataFrame:
    return batch.filter(~held_out_mask(cfg, batch["doc_id"], batch["bucket"]))


@dataclass
class PartitionCounts:
    """What a variant's files gave it, before its quality cut."""

    funnel: int = 0  # documents the funnel kept
    readmitted: int = 0  # documents from outside the funnel's kept ones (for `raw`, every document)
    judged_out: int = 0  # readmitted documents a later per-document stage then removed
    held_out: int = 0  # documents left out for the evaluation set


def variant_batches(root: DataRoot, cfg: RefineryConfig, sel: Selection, partition: str,
                    counts: PartitionCounts | None = None) -> Iterator[pl.DataFrame]:
    """The variant's documents of one input file before its quality cut, in record batches with the
    clean documents' columns: see the module docstring. `counts` is filled as the batches go."""
    counts = counts if counts is not None else PartitionCounts()
    schema = clean_schema(root, partition)
    rejects = partition_rejects(root, partition)
    facts = recorded_facts(root, partition, rejects)

    def keep(batch: pl.DataFrame) -> pl.DataFrame:
        kept = _not_held_out(cfg, batch)
        counts.held_out += batch.height - kept.height
        return kept

    if sel.base == "raw":
        for batch in stage_batches(root, TEXT_STAGE, partition, READ_ROWS):
            batch = keep(batch)
            counts.readmitted += batch.height
            if batch.height:
                yield _aligned(_with_facts(batch, facts), schema)
        return
    for batch in stage_batches(root, CLEAN_STAGE, partition, READ_ROWS):
        batch = keep(batch)
        counts.funnel += batch.height
        if batch.height:
            yield _aligned(batch, schema)
    readmitted = rejects.filter(pl.Series([sel.readmits(v, r) for v, r in zip(rejects["stage"], rejects["rule"])],
                                          dtype=pl.Boolean))
    if readmitted.is_empty():
        return
    judges = Judges(root, cfg, sel)
    for table in VERDICT_TABLES:
        ids = readmitted.filter(pl.col("table") == table)["doc_id"]
        if ids.is_empty():
            continue
        wanted = ids.implode()
        for batch in stage_batches(root, funnel_stage(table).upstream, partition, READ_ROWS):
            batch = keep(batch.filter(pl.col("doc_id").is_in(wanted)))
            if not batch.height:
                continue
            # judged in the language the funnel found (the heuristic rules are per language)
            judged = judges.judge(table, _with_facts(batch, facts, ("language",)))
            counts.readmitted += judged.height
            counts.judged_out += batch.height - judged.height
            if judged.height:
                yield _aligned(_with_facts(judged, facts), schema)


class Judges:
    """The stages after a readmitted document's rejection that judge one document alone, built once
    per variant by their recipes (refinery/stage_recipes.py) as the funnel builds them, told what
    the variant leaves out: every per-document stage of the registry, and exact dedup (by the
    stage's hash, `_exact_dedup`) for deduped. Near dedup is not among them."""

    def __init__(self, root: DataRoot, cfg: RefineryConfig, sel: Selection):
        self.root, self.cfg, self.sel = root, cfg, sel
        self._built: dict[tuple[str, str], Stage] = {}
        self._shared: dict = {}  # what the builds share: the published quality model
        self._seen: np.ndarray | None = None  # exact dedup: the normalized-text hashes it kept (S16, sorted)
        self._readmitted: set[bytes] = set()  # and those of the documents let in so far

    def _stage(self, name: str, source: str) -> Stage:
        if (name, source) not in self._built:
            self._built[name, source] = build_stage(name, self.cfg, source, self.root, leaves_out=self.sel.readmits,
                                                    shared=self._shared)
        return self._built[name, source]

    def _exact_dedup(self, batch: pl.DataFrame) -> pl.DataFrame:
        """exact dedup's verdict on documents that never reached it: a document whose normalized
        text (the stage's own hash) is one that dedup saw, or one already let in, is a copy; the
        copy the funnel kept (or the first let in) stays. Unless the variant leaves exact dedup out.
        Memory: 16 bytes per document that reached dedup (its signature tables' hashes), plus 16
        per document let in."""
        if self.sel.readmits("exact_deduped", "exact_dedup/duplicate"):
            return batch
        if self._seen is None:
            self._seen = np.unique(np.concatenate([np.zeros(0, dtype="S16"), *(
                _hash_keys(*(t[c].to_numpy() for c in ("hash_hi", "hash_lo")))
                for t in dedup_hashes(self.root, self.cfg))]))
        keys = _hash_keys(*exact_dedup.text_hashes(batch["text"].fill_null("").to_list()))
        at = np.minimum(np.searchsorted(self._seen, keys), max(len(self._seen) - 1, 0))
        copy = (self._seen[at] == keys) if len(self._seen) else np.zeros(len(keys), dtype=bool)
        keep = []
        for key, is_copy in zip(keys.tolist(), copy.tolist()):
            keep.append(not is_copy and key not in self._readmitted)
            self._readmitted.add(key)
        return batch.filter(pl.Series(keep, dtype=pl.Boolean))

    def judge(self, rejected_by: str, batch: pl.DataFrame) -> pl.DataFrame:
        """What the per-document stages after `rejected_by` keep of `batch` (pii_redacted's redaction
        always runs); a removal the variant leaves out keeps the document as it went in."""
        stages = registry.STAGES  # read when called: a test may register a stage
        after = [s.name for s in stages[registry.stage_names().index(rejected_by) + 1:]
                 if s.build is not None or s.name == DEDUP_STAGE]
        if rejected_by == CLEAN_STAGE:
            after = [CLEAN_STAGE]
        source = batch["source"][0]  # one input file's documents: one source
        for name in after:
            if name == DEDUP_STAGE:
                batch = self._exact_dedup(batch)
                continue
            out = self._stage(name, source).run_for_source(batch, self.cfg.source(source).skip)
            back = out.rejects.filter(pl.Series([self.sel.readmits(v, r) for v, r in
                                                 zip(out.rejects["stage"], out.rejects["rule"])], dtype=pl.Boolean))
            kept = out.documents
            if back.height:
                kept = pl.concat([kept, batch.filter(pl.col("doc_id").is_in(back["doc_id"].implode()))],
                                 how="diagonal_relaxed")
                order_of = batch.select("doc_id").with_row_index("_row")
                kept = kept.join(order_of, on="doc_id", maintain_order="left").sort("_row").drop("_row")
            batch = kept
            if not batch.height:
                break
        return batch


def _hash_keys(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """exact dedup's (hi, lo) hash halves as one sortable 16-byte key each."""
    return np.stack([hi.astype(">u8"), lo.astype(">u8")], axis=1).reshape(-1).view("S16")


def language_of(languages: pl.Series) -> pl.Series:
    return languages.fill_null(UNKNOWN_LANGUAGE)


def quality_cutoffs(scored: Iterator[pl.DataFrame], top_fraction: float) -> dict[str, dict[str, float]]:
    """bucket -> language -> the lowest quality_score a `top_fraction` cut keeps, from frames of
    bucket, language, quality_score (null: unscored, counted but never kept) and tokens: the
    best-scored documents that first hold `top_fraction` of each language's tokens, as a phase's
    per-language quality cut keeps them. Memory: two numbers per document of the variant."""
    scores: dict[str, dict[str, list[np.ndarray]]] = {}
    tokens: dict[str, dict[str, list[np.ndarray]]] = {}
    for frame in scored:
        frame = frame.with_columns(language=language_of(frame["language"]))
        for (bucket, lang), part in frame.group_by(["bucket", "language"], maintain_order=True):
            scores.setdefault(bucket, {}).setdefault(lang, []).append(
                part["quality_score"].cast(pl.Float64).fill_null(np.nan).to_numpy())
            tokens.setdefault(bucket, {}).setdefault(lang, []).append(part["tokens"].cast(pl.Int64).to_numpy())
    return {bucket: stratified_cutoffs({lang: np.concatenate(v) for lang, v in by_lang.items()}, top_fraction,
                                       {lang: np.concatenate(v) for lang, v in tokens[bucket].items()})
            for bucket, by_lang in sorted(scores.items())}


def quality_cut(batch: pl.DataFrame, cutoffs: dict[str, dict[str, float]]) -> pl.DataFrame:
    """The documents of `batch` at or above their bucket's and language's cutoff."""
    lowest = [cutoffs.get(b, {}).get(lang, np.inf)
              for b, lang in zip(batch["bucket"].to_list(), language_of(batch["language"]).to_list())]
    score = batch["quality_score"].cast(pl.Float64)
    return batch.filter((score >= pl.Series(lowest, dtype=pl.Float64)).fill_null(False))

