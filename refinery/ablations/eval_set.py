"""The one evaluation set every variant is measured on, and no variant trains on.

Three kinds of documents, each with a `domain`, a `language` and `kept`:

- held-out documents of every bucket a source feeds (`ablations.eval_buckets` narrows them): web
  and code too, not only the curated buckets, so that a web filter is judged on web text. A
  document is held out when the hash of the run's seed and its doc id falls below
  `ablations.eval_fraction` (refinery/holdout.py): a function of the document alone, decided from
  extracted_text before any verdict or variant, so it is the same set whatever the variants are and
  however they are drawn; every variant leaves it out, and so does the quality classifier's
  training. Its text is the extracted text (the bucket as crawled, not as any filter left it), its
  domain its bucket, its language the funnel's language column where the language stage recorded
  one (kept or rejected), else the same fastText detector's. It is `kept` when the funnel keeps its
  language (`stages.language.languages`, or a source that skips language ID): the report judges
  variants on the kept documents only, since a variant that keeps a language the config drops on
  purpose wins on it by construction;
- the contamination eval sets (`contamination.eval_sets`): domain the set's name;
- the `ablations.eval_sets` JSONL files: domain the file's name before its first '.'.
  Eval-set lines get their language from the language stage's fastText detector (lid.176,
  `stages.language.model_path` or the bundled one), on the whole text, and are always kept: the
  config names them as what it wants to be good at.

Written to `ablations/eval/documents.parquet` (doc_id, text, domain, language, kept), a record batch
per row group, atomically, with `ablations/eval/info.json` (what it was chosen from, and its counts);
the same inputs, config and seed give the same bytes. Eval-set lines are
`<domain>/<id>` (the line's `id`). Memory: one record batch, and one JSONL line at a time.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any, Iterator

import polars as pl

from refinery.ablations.verdicts import LANGUAGE_STAGE, partition_rejects, recorded_facts, verdicts_digest
from refinery.config import RefineryConfig
from refinery.contamination import eval_set_lines
from refinery.config.run import eval_set_domain
from refinery.curriculum.inventory import UNKNOWN_LANGUAGE
from refinery.documents import input_shards
from refinery.holdout import eval_buckets, held_out_mask
from refinery.stages.attributes import stage_batches
from refinery.stages.parquet_batches import ParquetBatchWriter, parquet_batches
from refinery.stages.registry import TEXT_STAGE
from refinery.storage import DataRoot, sha256_file

EVAL_DOCUMENTS_KEY = "ablations/eval/documents.parquet"
EVAL_INFO_KEY = "ablations/eval/info.json"  # what the documents were chosen from, and their counts
EVAL_SCHEMA = {"doc_id": pl.String(), "text": pl.String(), "domain": pl.String(), "language": pl.String(),
               "kept": pl.Boolean()}
BATCH_ROWS = 4096


def eval_set_files(cfg: RefineryConfig) -> list[tuple[str, Path]]:
    """(domain, path) of each eval-set file: the contamination sets', then `ablations.eval_sets`."""
    assert cfg.ablations is not None
    return [*((es.name, Path(cfg.resolve(es.path))) for es in cfg.contamination.eval_sets),
            *((eval_set_domain(p), Path(cfg.resolve(p))) for p in cfg.ablations.eval_sets)]


def _detector(cfg: RefineryConfig):
    from refinery.stages.language import load_language_model

    path = cfg.stages.language.model_path
    return load_language_model(cfg.resolve(path) if path else None)


def keeps_language(cfg: RefineryConfig, source: str, languages: pl.Series) -> pl.Series:
    """Whether the funnel keeps each of `languages` for a document of `source`: every language when
    the source skips language ID or the stage keeps `all`, else the stage's list."""
    wanted = cfg.stages.language.languages
    if wanted == "all" or "language" in cfg.source(source).skip:
        return pl.Series([True] * len(languages), dtype=pl.Boolean)
    return languages.is_in(list(wanted)).fill_null(False)


def _held_out_batches(root: DataRoot, cfg: RefineryConfig) -> Iterator[pl.DataFrame]:
    detector = None
    curated = set(eval_buckets(cfg))
    for shard in input_shards(cfg):
        if shard.bucket not in curated:
            continue
        facts = None
        for batch in stage_batches(root, TEXT_STAGE, shard.key, BATCH_ROWS, columns=["doc_id", "bucket", "text"]):
            batch = batch.filter(held_out_mask(cfg, batch["doc_id"], batch["bucket"]))
            if not batch.height:
                continue
            if facts is None:
                rejects = partition_rejects(root, shard.key).filter(pl.col("table") == LANGUAGE_STAGE)
                facts = recorded_facts(root, shard.key, rejects).select("doc_id", "language")
            batch = batch.join(facts, on="doc_id", how="left", maintain_order="left")
            if batch["language"].null_count():
                detector = detector or _detector(cfg)
                batch = batch.with_columns(language=pl.Series(
                    [lang if lang is not None else detector.predict(text or "")[0]
                     for lang, text in zip(batch["language"].to_list(), batch["text"].to_list())], dtype=pl.String))
            yield batch.select("doc_id", "text", domain=pl.col("bucket"), language=pl.col("language"),
                               kept=keeps_language(cfg, shard.source, batch["language"]))


def _eval_set_batches(cfg: RefineryConfig) -> Iterator[pl.DataFrame]:
    detector = None
    for domain, path in eval_set_files(cfg):
        rows: list[tuple[str, str, str, str, bool]] = []
        for item_id, text in eval_set_lines(path):
            detector = detector or _detector(cfg)
            rows.append((f"{domain}/{item_id}", text, domain, detector.predict(text)[0] if text else UNKNOWN_LANGUAGE,
                         True))
            if len(rows) == BATCH_ROWS:
                yield pl.DataFrame(rows, schema=EVAL_SCHEMA, orient="row")
                rows = []
        if rows:
            yield pl.DataFrame(rows, schema=EVAL_SCHEMA, orient="row")


def write_eval_set(root: DataRoot, cfg: RefineryConfig) -> dict[str, dict[str, int]]:
    """Write `ablations/eval/documents.parquet`; returns documents per domain and language."""
    counts: dict[str, dict[str, int]] = {}
    with root.writer(EVAL_DOCUMENTS_KEY) as path, ParquetBatchWriter(path, EVAL_SCHEMA) as out:
        for batch in itertools.chain(_held_out_batches(root, cfg), _eval_set_batches(cfg)):
            batch = batch.cast(EVAL_SCHEMA)
            out.write(batch)
            for domain, lang, n in batch.group_by(["domain", "language"]).len().iter_rows():
                counts.setdefault(domain, {})
                counts[domain][lang] = counts[domain].get(lang, 0) + n
    return {d: dict(sorted(by.items())) for d, by in sorted(counts.items())}


def eval_set_digest(root: DataRoot, cfg: RefineryConfig) -> str:
    """What the evaluation set is chosen from: the seed, fraction and buckets, the eval-set files'
    bytes, the language model, the languages kept (and the sources that skip language ID), and the
    verdicts of extracted_text and the language stage."""
    assert cfg.ablations is not None
    files = [(domain, sha256_file(path)) for domain, path in eval_set_files(cfg)]
    payload = [cfg.seed, cfg.ablations.eval_fraction, eval_buckets(cfg), files, cfg.stages.language.model_path,
               cfg.stages.language.languages, [(s.name, s.skip) for s in cfg.sources],
               verdicts_digest(root, cfg, (TEXT_STAGE, LANGUAGE_STAGE))]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


def ensure_eval_set(root: DataRoot, cfg: RefineryConfig) -> dict[str, Any]:
    """The evaluation set's info (`inputs` digest and `documents` per domain and language), written
    first when missing or chosen from other inputs."""
    digest = eval_set_digest(root, cfg)
    if root.exists(EVAL_INFO_KEY) and root.exists(EVAL_DOCUMENTS_KEY):
        info = root.read_json(EVAL_INFO_KEY)
        if info.get("inputs") == digest:
            return info
    info = {"inputs": digest, "documents": write_eval_set(root, cfg)}
    root.write_json(EVAL_INFO_KEY, info)
    return info


def eval_documents(root: DataRoot, rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """The evaluation documents (doc_id, text, domain, language, kept), a record batch at a time."""
    yield from parquet_batches(root.local_path(EVAL_DOCUMENTS_KEY), rows)
