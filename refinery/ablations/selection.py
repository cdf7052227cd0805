"""Variants as data: a variant's documents are a selection over the funnel's stored verdicts, read
back from the tables the graph wrote (no stage is rerun to decide what it decided).

- `raw`: every document of extracted_text, with its extracted text; every later verdict and edit
  ignored (language and quality_score are the ones the funnel recorded, where it recorded one).
- `funnel`: the documents pii_redacted keeps, with its text (every edit and the PII redaction).
- `without: [names]`: the funnel plus the documents whose rejection is one the names cover
  (refinery/stages/registry.py `left_out`: a stage, a verdict, or one rule family of it).
- `quality_top: F`: of those, the documents at or above the quality_score of the document ranked
  ceil(F x documents) within their bucket and language (the phase quality cut's rule and code:
  `refinery.curriculum.inventory.stratified_cutoffs`); a document without a score is not kept.

What "ignored" means for a document a stage removed, which no later stage ever saw:

- Each document has at most one rejection (the first stage that removed it; none after it read it).
  A readmitted document carries the text its rejecting stage received: its upstream table's text,
  with the edits of the stages before it applied.
- It then goes through the last stage's own code, pii_redacted's (the safety filter, then PII
  redaction; the redaction alone when the variant leaves out `safety` or the whole stage), so no
  variant but `raw` trains on unredacted PII, and one that the safety filter drops is not kept.
- The stages between its rejecting stage and pii_redacted are NOT run on it: exact and near dedup
  and the quality threshold never judge a readmitted document (they are global or model-backed; the
  bias is stated rather than hidden). `without: [heuristic]` therefore also keeps heuristic rejects
  that dedup or the quality threshold would have removed: it measures the heuristic stage's removals
  at most, an upper bound of what leaving it out admits. A readmitted document rejected before
  quality_scored has no quality_score, so a `quality_top` cut never keeps it.
- Documents the evaluation set holds out (refinery/ablations/eval_set.py) are in no variant.

Memory: one record batch of a table at a time, plus one partition's rejected doc ids and its
recorded facts (doc_id, language, quality_score: no text); nothing per corpus.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import polars as pl

from refinery.ablations.eval_set import held_out_mask
from refinery.ablations.verdicts import VERDICT_TABLES, partition_rejects, recorded_facts
from refinery.config import RefineryConfig
from refinery.curriculum.inventory import UNKNOWN_LANGUAGE, stratified_cutoffs
from refinery.documents import CLEAN_STAGE
from refinery.layout import documents_key
from refinery.stages import pii as pii_stage
from refinery.stages.attributes import stage_batches
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

    def leaves_out_safety(self) -> bool:
        return self.readmits("pii_redacted", "safety/")


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


def _with_facts(batch: pl.DataFrame, facts: pl.DataFrame) -> pl.DataFrame:
    """The batch's language and quality_score, filled from the recorded facts where it has none."""
    recorded = facts.rename({"language": "language__recorded", "quality_score": "quality_score__recorded"})
    joined = batch.join(recorded, on="doc_id", how="left", maintain_order="left")
    fill = []
    for column in ("language", "quality_score"):
        recorded = pl.col(f"{column}__recorded")
        fill.append(pl.coalesce(pl.col(column), recorded).alias(column) if column in batch.columns
                    else recorded.alias(column))
    return joined.with_columns(fill).drop("language__recorded", "quality_score__recorded")


def _not_held_out(cfg: RefineryConfig, batch: pl.DataFrame) -> pl.DataFrame:
    return batch.filter(~held_out_mask(cfg, batch["doc_id"], batch["bucket"]))


@dataclass
class PartitionCounts:
    """What a variant's files gave it, before its quality cut."""

    funnel: int = 0  # documents the funnel kept
    readmitted: int = 0  # documents from outside the funnel's kept ones (for `raw`, every document)
    safety_dropped: int = 0  # readmitted documents the safety filter then removed
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
    pii = (pii_stage.PiiRedactor.from_config(cfg.stages.pii) if sel.leaves_out_safety()
           else pii_stage.SafetyThenRedact.from_config(cfg.stages))
    pii.record_timeout_s = cfg.stages.record_timeout_s
    for table in VERDICT_TABLES:
        ids = readmitted.filter(pl.col("table") == table)["doc_id"]
        if ids.is_empty():
            continue
        wanted = ids.implode()
        for batch in stage_batches(root, funnel_stage(table).upstream, partition, READ_ROWS):
            batch = keep(batch.filter(pl.col("doc_id").is_in(wanted)))
            if not batch.height:
                continue
            out = pii.run(batch)
            counts.readmitted += out.documents.height
            counts.safety_dropped += batch.height - out.documents.height
            if out.documents.height:
                yield _aligned(_with_facts(out.documents, facts), schema)


def language_of(languages: pl.Series) -> pl.Series:
    return languages.fill_null(UNKNOWN_LANGUAGE)


def quality_cutoffs(scored: Iterator[pl.DataFrame], top_fraction: float) -> dict[str, dict[str, float]]:
    """bucket -> language -> the lowest quality_score a `top_fraction` cut keeps, from frames of
    bucket, language and quality_score (null: unscored, counted but never kept), as a phase's
    per-language quality cut computes it. Memory: one float per document of the variant."""
    scores: dict[str, dict[str, list[np.ndarray]]] = {}
    for frame in scored:
        frame = frame.with_columns(language=language_of(frame["language"]))
        for (bucket, lang), part in frame.group_by(["bucket", "language"], maintain_order=True):
            values = part["quality_score"].cast(pl.Float64).fill_null(np.nan).to_numpy()
            scores.setdefault(bucket, {}).setdefault(lang, []).append(values)
    return {bucket: stratified_cutoffs({lang: np.concatenate(v) for lang, v in by_lang.items()}, top_fraction)
            for bucket, by_lang in sorted(scores.items())}


def quality_cut(batch: pl.DataFrame, cutoffs: dict[str, dict[str, float]]) -> pl.DataFrame:
    """The documents of `batch` at or above their bucket's and language's cutoff."""
    lowest = [cutoffs.get(b, {}).get(lang, np.inf)
              for b, lang in zip(batch["bucket"].to_list(), language_of(batch["language"]).to_list())]
    score = batch["quality_score"].cast(pl.Float64)
    return batch.filter((score >= pl.Series(lowest, dtype=pl.Float64)).fill_null(False))

