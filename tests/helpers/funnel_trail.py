"""A crafted data root whose every document's fate is known: two input files of one web source,
their stage tables written by hand up to heuristic_filtered (the stages between the extracted and
the redacted text as attribute tables, as the funnel writes them), real dedup decisions
(refinery/global_steps/dedup_compute.py, no Dagster) after it, then quality_scored, pii_redacted and the
final shards' entry table. `refinery why` and the per-language funnel are tested on it.

    a/0 en   kept to the final shards (two windows)
    a/1 fr   language/unwanted_language (score 0.93)
    a/2 en   gopher_quality/min_words (value 3, threshold < 50)
    a/3 de   kept
    a/4 en   kept: the keeper of b/1's near-duplicate cluster
    a/5      extract/empty_text at extracted_text, before language ID
    b/0 en   exact duplicate of a/0
    b/1 en   near duplicate of a/4 (one word of 200 changed)
    b/2 de   language/low_score (score 0.4)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from helpers.configs import write_config
from refinery.config import load_config
from refinery.documents import PROVENANCE_SCHEMA, REJECTS_SCHEMA, input_shards
from refinery.layout import ATTRIBUTE_STAGES, bucket_entries_key, documents_key, final_index_key, rejects_key
from refinery.global_steps import dedup_compute as dc
from refinery.global_steps import exact_dedup as ex
from refinery.global_steps import near_dedup as nd
from refinery.stages.attributes import publish_attributes, read_stage_documents
from refinery.storage import LocalDataRoot

WORDS = ("river stone lantern harbour meadow copper violin orchard thunder pebble candle window garden "
         "silver forest bridge morning shadow ladder velvet").split()


def long_text(seed: int, n: int = 200) -> str:
    """n words no other seed's text shares many 5-word shingles with."""
    return " ".join(f"{WORDS[(i * 7 + seed) % len(WORDS)]}{(i * seed) % 97}" for i in range(n))


NEAR_BASE = long_text(3)
TEXTS = {
    "a/0": "The harbour town wakes slowly when the fishing boats return with the tide.",
    "a/1": "Le port se réveille lentement quand les bateaux de pêche reviennent avec la marée.",
    "a/2": "Buy now cheap",
    "a/3": "Die Hafenstadt erwacht langsam, wenn die Fischerboote mit der Flut zurückkehren.",
    "a/4": NEAR_BASE,
    "a/5": "",
    "b/0": "The harbour town wakes slowly when the fishing boats return with the tide.",
    "b/1": " ".join(w if i != 100 else "ocean" for i, w in enumerate(NEAR_BASE.split())),
    "b/2": "Kurz und knapp.",
}
LANGUAGE = {"a/0": ("en", 0.95), "a/1": ("fr", 0.93), "a/2": ("en", 0.9), "a/3": ("de", 0.97), "a/4": ("en", 0.8),
            "b/0": ("en", 0.95), "b/1": ("en", 0.8), "b/2": ("de", 0.4)}
DROPPED_AT = {  # stage, rule, value, detail
    "a/5": ("extracted_text", "extract/empty_text", None, "no text after extraction"),
    "a/1": ("language_filtered", "language/unwanted_language", 0.93, "fr"),
    "b/2": ("language_filtered", "language/low_score", 0.4, "de"),
    "a/2": ("heuristic_filtered", "gopher_quality/min_words", 3.0, "< 50"),
}
FINAL_WINDOWS = {"a/0": [(0, 0, 40), (1, 16, 24)], "a/3": [(0, 40, 30)], "a/4": [(1, 0, 16)]}  # (shard, start, tokens)
PII_TEXT = {"a/0": "The harbour town wakes slowly when the fishing boats return with the [EMAIL]."}


@dataclass
class Trail:
    config: Path
    root: LocalDataRoot
    doc_ids: dict[str, str]  # "a/0" -> the doc_id in the tables
    urls: dict[str, str]


def heuristic_verdict(text: str, url: str) -> tuple[str, str, float | None, str]:
    """The first rule heuristic_filtered's real rules (default settings) remove `text` by, as a
    DROPPED_AT entry."""
    from refinery.config.stages import HeuristicConfig
    from refinery.stages.heuristic.filter import HeuristicFilter

    first = HeuristicFilter(HeuristicConfig()).explain(text, url, "en")[0]
    return ("heuristic_filtered", first.rule, None if first.value is None else float(first.value), first.detail)


def write_trail_corpus(tmp_path: Path, heuristic_text: str | None = None) -> Trail:
    """The crafted data root; `heuristic_text` replaces a/2's text, and its removal is then the one
    the real rules give it."""
    for name in ("a", "b"):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"{name}.jsonl").write_text('{"text": "x"}\n')
    config = write_config(tmp_path, {
        "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "in/*.jsonl", "format": "jsonl", "bucket": "web"}],
        "stages": {"language": {"languages": ["en", "de"], "min_score": 0.65}},
    })
    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    partitions = {s.key.rsplit("-", 1)[1]: s.key for s in input_shards(cfg)}
    doc_ids = {d: f"{partitions[d[0]]}/{int(d[2:]):07d}" for d in TEXTS}
    urls = {d: f"https://{d[0]}.example/page-{d[2:]}" for d in TEXTS}
    urls["b/0"] = urls["a/0"]  # the exact copy was crawled at the same address
    texts, dropped = dict(TEXTS), dict(DROPPED_AT)
    if heuristic_text is not None:
        texts["a/2"], dropped["a/2"] = heuristic_text, heuristic_verdict(heuristic_text, urls["a/2"])

    def table(docs: list[str], language: bool = False) -> pl.DataFrame:
        columns = {
            "doc_id": [doc_ids[d] for d in docs], "url": [urls[d] for d in docs], "source": ["web"] * len(docs),
            "bucket": ["web"] * len(docs), "file": [f"{d[0]}.jsonl" for d in docs], "record_index": [int(d[2:]) for d in docs],
            "record_offset": [0] * len(docs), "fetch_time": [None] * len(docs), "content_type": ["text/plain"] * len(docs),
            "text": [texts[d] for d in docs],
        }
        schema = {**PROVENANCE_SCHEMA, "text": pl.String()}
        if language:
            columns |= {"language": [LANGUAGE[d][0] for d in docs], "language_score": [LANGUAGE[d][1] for d in docs]}
            schema |= {"language": pl.String(), "language_score": pl.Float64()}
        return pl.DataFrame(columns, schema=schema)

    def rejects(stage: str, docs: list[str]) -> pl.DataFrame:
        rows = [(doc_ids[d], urls[d], "web", "web", stage, *dropped[d][1:], texts[d],
                 [{"rule": dropped[d][1], "value": dropped[d][2]}]) for d in docs]
        return pl.DataFrame(rows, schema=REJECTS_SCHEMA, orient="row")

    stages = ("raw_documents", "extracted_text", "language_filtered", "heuristic_filtered")
    for part, key in partitions.items():
        alive = [d for d in TEXTS if d[0] == part]
        upstream = None
        for stage in stages:
            gone = [d for d in alive if dropped.get(d, ("",))[0] == stage]
            alive = [d for d in alive if d not in gone]
            kept = table(alive, language=stage != stages[0] and stage != stages[1])
            if stage in ATTRIBUTE_STAGES:
                publish_attributes(root, stage, key, upstream, kept)
            else:
                root.write_parquet(documents_key(stage, key), kept)
            root.write_parquet(rejects_key(stage, key), rejects(stage, gone))
            upstream = kept
    for key in partitions.values():
        dc.compute_signatures(cfg, root, key)
    for hash_range in ex.range_keys(cfg.stages.exact_dedup.hash_ranges):
        dc.compute_exact_range(cfg, root, hash_range)
    for band in nd.band_keys(nd.DedupSettings.from_config(cfg).bands):
        dc.compute_band_edges(cfg, root, band)
    dc.compute_clusters(cfg, root)
    for key in partitions.values():
        dc.apply_to_shard(cfg, root, key)
        deduped = read_stage_documents(root, dc.STAGE, key)
        scored = deduped.with_columns(quality_score=pl.lit(0.5))
        publish_attributes(root, "quality_scored", key, deduped, scored)
        root.write_parquet(rejects_key("quality_scored", key), pl.DataFrame(schema=REJECTS_SCHEMA))
        redacted_text = {doc_ids[d]: t for d, t in PII_TEXT.items()}
        redacted = scored.with_columns(pl.col("doc_id").replace_strict(redacted_text, default=pl.col("text")).alias("text"))
        root.write_parquet(documents_key("pii_redacted", key), redacted)
        root.write_parquet(rejects_key("pii_redacted", key), pl.DataFrame(schema=REJECTS_SCHEMA))
    entries = [(doc_ids[d], shard, start, tokens, window, len(ws))
               for d, ws in FINAL_WINDOWS.items() for window, (shard, start, tokens) in enumerate(ws)]
    entries_sha = root.write_parquet(bucket_entries_key("final", "web"), pl.DataFrame(
        entries, schema={"doc_id": pl.String, "shard": pl.Int32, "start": pl.Int64, "tokens": pl.Int32,
                         "window": pl.Int32, "n_windows": pl.Int32}, orient="row"))
    # The part of the bucket's index.json that `why` reads: the entry table's sha256.
    root.write_json(final_index_key("web"), {"entries_table": {"key": bucket_entries_key("final", "web"),
                                                                "sha256": entries_sha}})
    return Trail(config, root, doc_ids, urls)


def one_row_per_row_group(t: Trail) -> None:
    """Rewrite every table of the trail's data root with one row per row group (as the funnel's batch
    writers cut a large file, here at the smallest grain), statistics kept, and record the final
    entry table's new sha256 in its index: the same rows, so the same answers, in many row groups."""
    import pyarrow.parquet as pq

    for path in sorted(t.root.root.rglob("*.parquet")):
        pq.write_table(pq.read_table(path), path, row_group_size=1, write_statistics=True)
    entries = bucket_entries_key("final", "web")
    t.root.write_json(final_index_key("web"), {"entries_table": {"key": entries, "sha256": t.root.sha256(entries)}})
