"""A data root whose every document's fate is drawn and known, for the ablation tests: two web files
and one wiki file (a curated bucket: of the quality classifier's default positive buckets, the one a
source feeds), their stage tables
written as the funnel writes them (text tables for extracted_text and pii_redacted, attribute tables
in between with text edits and added columns, a rejects table per stage), pii_redacted computed by
the real pii stage (safety filter, then redaction), and a trained tokenizer.

Fates: kept, or removed at one stage with one rule (`FATES`). Some documents removed before dedup
copy (in upper case: the same normalized text) an earlier document that reached dedup, or one
removed before it (`copy_of`); the signature tables hold exact dedup's hashes of what reached it. Some texts hold an email address
(redacted by the pii stage) or the blocked word (removed by the safety filter, at pii_redacted, or
after readmission for a document removed earlier). heuristic_filtered drops the last line of the
documents it keeps whose doc number is a multiple of 4 (a C4-like line edit).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from helpers.configs import write_config
from refinery.config import RefineryConfig, load_config
from refinery.documents import PROVENANCE_SCHEMA, REJECTS_SCHEMA, input_shards, make_doc_id
from refinery.layout import documents_key, rejects_key
from refinery.global_steps import dedup_compute as dc
from refinery.stages import pii as pii_stage
from refinery.global_steps import tokenize as tk
from refinery.stages.attributes import publish_attributes
from refinery.models.quality_training import train_and_publish
from refinery.storage import LocalDataRoot

BLOCKED = "forbiddenword"
WORDS = ("river stone lantern harbour meadow copper violin orchard thunder pebble candle window garden silver "
         "forest bridge morning shadow ladder velvet the of and a in").split()
# (table, verdict, rule) of each way a document can be removed, and how often (the rest are kept).
FATES = [
    ("language_filtered", "language_filtered", "language/unwanted_language"),
    ("heuristic_filtered", "heuristic_filtered", "gopher_rep/dup_line_frac"),
    ("heuristic_filtered", "heuristic_filtered", "c4/curly_bracket"),
    ("deduped", "exact_deduped", "exact_dedup/duplicate"),
    ("deduped", "near_deduped", "near_dedup/duplicate"),
    ("quality_scored", "quality_scored", "quality/below_threshold"),
]
FILES = {"web": ["a", "b"], "wiki": ["w"]}
# Eval-set lines: the contamination set `bench` and the ablations eval set `extra` (evals/extra.jsonl).
EVAL_LINES = {
    "bench": [{"id": "q1", "text": "The committee published its annual report on the river bridges today."},
              {"id": "q2", "text": "Die Kommission hat heute ihren Jahresbericht über die Brücken veröffentlicht."}],
    "extra": [{"id": 7, "text": "Several families have farmed the valley for more than two hundred years."}],
}
DOCS_PER_FILE = 60


@dataclass
class VerdictCorpus:
    folder: Path
    config_path: Path
    cfg: RefineryConfig
    root: LocalDataRoot
    fate: dict[str, tuple[str, str] | None] = field(default_factory=dict)  # doc_id -> (verdict, rule) or None
    extracted: dict[str, str] = field(default_factory=dict)  # doc_id -> extracted text
    bucket: dict[str, str] = field(default_factory=dict)
    language: dict[str, str] = field(default_factory=dict)
    score: dict[str, float | None] = field(default_factory=dict)  # recorded quality_score (None: never scored)
    copy_of: dict[str, str] = field(default_factory=dict)  # doc_id -> the earlier document whose text it copies


def edited(doc_id: str, text: str) -> str:
    """heuristic_filtered's edit of a document it keeps: the last line dropped when the doc number
    is a multiple of 4."""
    return text.rsplit("\n", 1)[0] if int(doc_id[-7:]) % 4 == 0 else text


def received_text(c: "VerdictCorpus", doc_id: str, table: str) -> str:
    """The text the stage writing `table` received for `doc_id` (the heuristic edit applied after it)."""
    text = c.extracted[doc_id]
    return text if table in ("language_filtered", "heuristic_filtered") else edited(doc_id, text)


def config_data(data_root: str = "out", **ablations) -> dict:
    return {
        "seed": 11, "data_root": data_root, "buckets": ["web", "wiki"],
        "sources": [{"name": b, "path": f"in/{b}/*.jsonl", "format": "jsonl", "bucket": b} for b in FILES],
        # quality's buckets left at their defaults (books, wiki): the curated bucket is the one fed, wiki
        "stages": {"safety": {"blocked_words": [BLOCKED]}, "quality": {"num_features": 4096, "threshold": 0.3}},
        "tokenizer": {"vocab_size": 300, "train_docs": 500},
        "shards": {"max_seq_len": 64, "overlap": 8, "shard_tokens": 2048, "shuffle_buffer_mb": 1},
        "contamination": {"eval_sets": [{"name": "bench", "path": "evals/bench.jsonl"}]},
        "ablations": {"variants": {"funnel": {}}, "seq_len": 32, "micro_batch_size": 2, "eval_fraction": 0.2,
                      "eval_sets": ["evals/extra.jsonl"], **ablations},
    }


def _text(rng: random.Random, i: int) -> str:
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) for _ in range(rng.randint(2, 5))]
    if i % 3 == 0:
        lines[0] += f" write to person{i}@example.org"
    if i % 11 == 3:
        lines[-1] += f" {BLOCKED}"
    return "\n".join(lines)


def write_verdict_corpus(folder: Path, **ablations) -> VerdictCorpus:
    for bucket, stems in FILES.items():
        (folder / "in" / bucket).mkdir(parents=True, exist_ok=True)
        for stem in stems:
            (folder / "in" / bucket / f"{stem}.jsonl").write_text("")
    (folder / "evals").mkdir(exist_ok=True)
    for name, lines in EVAL_LINES.items():
        (folder / "evals" / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    config_path = write_config(folder, config_data(**ablations))
    cfg = load_config(config_path)
    c = VerdictCorpus(folder, config_path, cfg, LocalDataRoot(cfg.resolve(cfg.data_root)))
    rng = random.Random(5)
    text_schema = {**PROVENANCE_SCHEMA, "text": pl.String()}
    kept_by_dedup: dict[str, tuple[pl.DataFrame, dict]] = {}
    for shard in input_shards(cfg):
        ids = [make_doc_id(shard.key, i) for i in range(DOCS_PER_FILE)]
        rows = []
        for i, doc_id in enumerate(ids):
            text = _text(rng, i)
            c.language[doc_id] = "de" if i % 7 == 1 else "en"
            roll = rng.random()
            c.fate[doc_id] = FATES[int(roll * 10)][1:] if roll < 0.6 else None
            if c.fate[doc_id] is not None and c.fate[doc_id][0] in ("language_filtered", "heuristic_filtered") and i % 2:
                # a copy (in other case) of a document dedup saw unedited, or of one removed before it
                reached = [d for d in ids[:i] if int(d[-7:]) % 4 and (c.fate[d] is None or c.fate[d][0] not in
                                                                     ("language_filtered", "heuristic_filtered"))]
                removed_before = [d for d in ids[:i] if c.fate[d] and c.fate[d][0] == "language_filtered"]
                earlier = reached if i % 4 == 1 else removed_before
                if earlier:
                    text = c.extracted[earlier[-1]].upper()
                    c.copy_of[doc_id] = earlier[-1]
            c.extracted[doc_id], c.bucket[doc_id] = text, shard.bucket
            rows.append({"doc_id": doc_id, "url": f"https://{shard.bucket}.example/{shard.key}/{i}",
                         "source": shard.source, "bucket": shard.bucket, "file": shard.path, "record_index": i,
                         "record_offset": 0, "fetch_time": None, "content_type": "text/plain", "text": text})
        docs = pl.DataFrame(rows, schema=text_schema)
        c.root.write_parquet(documents_key("extracted_text", shard.key), docs)
        removed = {d: f for d, f in c.fate.items() if f is not None and d in set(ids)}

        def rejects(verdicts: tuple[str, ...], upstream: pl.DataFrame, removed: dict = removed) -> tuple[pl.DataFrame, pl.DataFrame]:
            gone = [d for d in upstream["doc_id"].to_list() if d in removed and removed[d][0] in verdicts]
            value = {d: 0.1 if removed[d][1].startswith("quality") else 1.0 for d in gone}
            out = [(d, None, None, c.bucket[d], removed[d][0], removed[d][1], value[d],
                    c.language[d] if removed[d][1].startswith("language") else "", None,
                    [{"rule": removed[d][1], "value": value[d]}]) for d in gone]
            if verdicts == ("quality_scored",):
                for d in gone:
                    c.score[d] = 0.1
            return (upstream.filter(~pl.col("doc_id").is_in(gone)),
                    pl.DataFrame(out, schema=REJECTS_SCHEMA, orient="row"))

        upstream = docs
        language, rej = rejects(("language_filtered",), upstream)
        language = language.with_columns(language=pl.col("doc_id").replace_strict(c.language),
                                         language_score=pl.lit(0.9))
        publish_attributes(c.root, "language_filtered", shard.key, upstream, language)
        c.root.write_parquet(rejects_key("language_filtered", shard.key), rej)
        heuristic, rej = rejects(("heuristic_filtered",), language)
        lines_cut = heuristic.with_columns(text=pl.struct("doc_id", "text").map_elements(
            lambda r: edited(r["doc_id"], r["text"]), return_dtype=pl.String))
        publish_attributes(c.root, "heuristic_filtered", shard.key, heuristic, lines_cut)
        c.root.write_parquet(rejects_key("heuristic_filtered", shard.key), rej)
        deduped, rej = rejects(("exact_deduped", "near_deduped"), lines_cut)
        deduped = deduped.with_columns(dup_cluster=pl.lit(None, pl.String), dup_cluster_size=pl.lit(1, pl.Int64))
        publish_attributes(c.root, "deduped", shard.key, lines_cut, deduped)
        c.root.write_parquet(rejects_key("deduped", shard.key), rej)
        kept_by_dedup[shard.key] = (deduped, removed)
        dc.compute_signatures(cfg, c.root, shard.key)  # exact dedup's hashes of what reached it
    # the quality classifier of the real stage, trained on the curated bucket against web: what
    # judges a readmitted document that never reached quality_scored
    train_and_publish(cfg, c.root)
    for shard in input_shards(cfg):
        deduped, removed = kept_by_dedup[shard.key]
        scored, rej = rejects(("quality_scored",), deduped, removed)
        scores = {d: round(rng.random(), 4) for d in scored["doc_id"].to_list()}
        c.score.update(scores)
        scored = scored.with_columns(quality_score=pl.col("doc_id").replace_strict(scores))
        publish_attributes(c.root, "quality_scored", shard.key, deduped, scored)
        c.root.write_parquet(rejects_key("quality_scored", shard.key), rej)
        out = pii_stage.SafetyThenRedact.from_config(cfg.stages).run(scored)
        c.root.write_parquet(documents_key("pii_redacted", shard.key), out.documents)
        c.root.write_parquet(rejects_key("pii_redacted", shard.key), out.rejects)
        for d, rule in zip(out.rejects["doc_id"].to_list(), out.rejects["rule"].to_list()):
            c.fate[d] = ("pii_redacted", rule)
    tk.build_tokenizer(c.root, cfg)
    return c
