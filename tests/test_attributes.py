"""The text stored once: the stages between extracted_text and pii_redacted write attribute tables
(refinery/stages/attributes.py), and `stage_batches` reads each stage's documents back as the stage
made them. Fast: text edits as spans, the reader in step a few rows at a time, the contract checks.
Slow: the bundled sample through the graph to pii_redacted, every stage recomputed from the one
before it and compared with what the reader gives."""

import polars as pl
import pyarrow.parquet as pq
import pytest

from refinery.documents import PROVENANCE_SCHEMA
from refinery.layout import ATTRIBUTE_STAGES, attributes_key, documents_key
from refinery.stages.attributes import (AttributeTableError, apply_spans, publish_attributes, read_stage_documents,
                                        stage_batches, stage_columns, text_spans)
from refinery.storage import LocalDataRoot

from helpers.configs import demo_config, write_config


@pytest.mark.parametrize("old, new", [
    ("one.\ntwo\nthree.\n", "one.\nthree."),                          # a line dropped, the last stripped
    ("  padded line.  \nkept.\n", "padded line.\nkept."),             # lines stripped
    ("See [1] the harbour.\nEnd.", "See  the harbour.\nEnd."),        # a citation cut inside a line
    ("first.\r\nsecond.\r\n", "first.\nsecond."),                     # CRLF rejoined with "\n" only
    ("unchanged text", "unchanged text"),
    ("anything", ""),
])
def test_an_edited_text_is_spans_of_the_text_it_came_from(old, new):
    spans = text_spans(old, new)
    assert spans is not None and apply_spans(old, spans) == new
    assert len(spans) % 2 == 0 and all(0 <= s <= len(old) for s in spans)


def test_a_text_with_characters_its_source_lacks_has_no_spans():
    assert text_spans("abc", "abz") is None


def test_untouched_lines_are_one_span():
    old = "".join(f"line {i} ends here.\n" for i in range(50))
    new = "".join(f"line {i} ends here.\n" for i in range(50) if i != 20)
    assert text_spans(old, new) == [0, old.index("line 20 "), old.index("line 21 "), len(old)]


def documents(ids: list[int], texts: dict[int, str] | None = None) -> pl.DataFrame:
    texts = texts or {}
    return pl.DataFrame({
        "doc_id": [f"web-a/{i:07d}" for i in ids], "url": [f"https://a.example/{i}" for i in ids],
        "source": ["web"] * len(ids), "bucket": ["web"] * len(ids), "file": ["a.jsonl"] * len(ids),
        "record_index": ids, "record_offset": [0] * len(ids), "fetch_time": [None] * len(ids),
        "content_type": ["text/plain"] * len(ids), "text": [texts.get(i, f"Document {i}.\nIts second line.") for i in ids],
    }, schema={**PROVENANCE_SCHEMA, "text": pl.String})


def test_the_reader_walks_the_chain_a_batch_at_a_time(tmp_path):
    root = LocalDataRoot(tmp_path)
    extracted = documents(list(range(20)))
    language = extracted.filter(pl.col("record_index") % 3 != 0).with_columns(
        language=pl.lit("en"), language_score=pl.col("record_index").cast(pl.Float64) / 20)
    heuristic = language.filter(pl.col("record_index") != 7).with_columns(
        pl.when(pl.col("record_index") % 2 == 0).then(pl.col("text").str.replace("\nIts second line.", ""))
        .otherwise(pl.col("text")).alias("text"))
    root.write_parquet(documents_key("extracted_text", "web-a"), extracted)
    publish_attributes(root, "language_filtered", "web-a", extracted, language)
    publish_attributes(root, "heuristic_filtered", "web-a", language, heuristic)

    attributes = pl.read_parquet(root.local_path(attributes_key("heuristic_filtered", "web-a")))
    assert attributes.columns == ["doc_id", "text_spans", "text_literal"]
    assert attributes["text_spans"].null_count() == heuristic.filter(pl.col("record_index") % 2 == 1).height
    frames = list(stage_batches(root, "heuristic_filtered", "web-a", rows=4))
    assert max(f.height for f in frames) <= 4 and all(f.height for f in frames)
    assert pl.concat(frames).equals(heuristic)
    assert read_stage_documents(root, "language_filtered", "web-a").equals(language)
    assert stage_columns(root, "heuristic_filtered", "web-a") == heuristic.columns
    assert read_stage_documents(root, "heuristic_filtered", "web-a", columns=["url", "language_score"]).equals(
        heuristic.select("url", "language_score"))


def test_a_stage_that_breaks_the_contract_is_refused(tmp_path):
    root = LocalDataRoot(tmp_path)
    extracted = documents([0, 1, 2])
    with pytest.raises(AttributeTableError, match="reordered"):
        publish_attributes(root, "language_filtered", "web-a", extracted, extracted.reverse())
    with pytest.raises(AttributeTableError, match=r"changed the column\(s\) \['url'\]"):
        publish_attributes(root, "language_filtered", "web-a", extracted, extracted.with_columns(url=pl.lit("x")))
    with pytest.raises(AttributeTableError, match="append its own"):
        publish_attributes(root, "language_filtered", "web-a", extracted,
                           extracted.select(pl.lit(1).alias("first"), pl.all()))
    assert not root.exists(attributes_key("language_filtered", "web-a"))


@pytest.mark.slow
def test_the_sample_keeps_two_text_tables_and_every_stage_reads_back_as_made(tmp_path):
    """One web file of the demo through the graph to pii_redacted: full text only in extracted_text
    and pii_redacted, the attribute tables narrow, and each stage's documents as read back equal
    that stage run again on the documents read back for the stage before it."""
    import dagster as dg

    from refinery.fanout import run_stage
    from refinery.stage_recipes import build_stage
    from orchestration.definitions import build_definitions
    from orchestration.demo import materialize_graph
    from refinery.config import load_config
    from refinery.documents import input_shards
    from refinery.global_steps import dedup_compute as dc
    from refinery.global_steps import exact_dedup as ex
    from refinery.global_steps import near_dedup as nd
    from refinery.models import quality as q
    from refinery.models import quality_training as qt
    from refinery.stages.pii import SafetyThenRedact

    config = write_config(tmp_path, demo_config(tmp_path / "out"), "demo.yaml")
    defs = build_definitions(str(config))
    selection = list(dg.AssetSelection.assets("pii_redacted").upstream().resolve(defs.resolve_asset_graph()))
    materialize_graph(defs, dg.DagsterInstance.ephemeral(), selection, log=lambda _: None)
    cfg, root = load_config(config), LocalDataRoot(tmp_path / "out")
    shard = next(s for s in input_shards(cfg) if s.key == "web-web-00.warc.gz")

    tables = [k for k in root.list("documents") + root.list("attributes") if k.endswith(f"/{shard.key}.parquet")]
    with_text = sorted(k for k in tables if "text" in pq.read_schema(root.local_path(k)).names)
    assert with_text == [documents_key("extracted_text", shard.key), documents_key("pii_redacted", shard.key)]
    assert sorted(k for k in tables if k.startswith("attributes/")) == sorted(
        attributes_key(stage, shard.key) for stage in ATTRIBUTE_STAGES)
    extracted = read_stage_documents(root, "extracted_text", shard.key)
    for stage in ATTRIBUTE_STAGES:
        attributes = pq.ParquetFile(root.local_path(attributes_key(stage, shard.key)))
        assert attributes.metadata.num_rows == read_stage_documents(root, stage, shard.key).height
        assert root.local_path(attributes_key(stage, shard.key)).stat().st_size * 5 < \
            root.local_path(documents_key("extracted_text", shard.key)).stat().st_size, stage

    def rerun(stage, docs):
        return run_stage(stage, cfg, shard, docs).documents

    language = rerun(build_stage("language_filtered", cfg, shard.source), extracted)
    assert read_stage_documents(root, "language_filtered", shard.key).equals(language)
    heuristic = rerun(build_stage("heuristic_filtered", cfg, shard.source), language)
    assert not heuristic["text"].equals(language.filter(pl.col("doc_id").is_in(heuristic["doc_id"].implode()))["text"])
    assert read_stage_documents(root, "heuristic_filtered", shard.key).equals(heuristic)
    ordinal = dc.shard_ordinals(cfg)[shard.key]
    on_shard = ex.shard_of(pl.col("doc_key")) == ordinal
    clusters = pl.scan_parquet(root.local_path(dc.NEAR_CLUSTERS_KEY)).filter(on_shard).collect()
    _, near = nd.apply_decisions(heuristic, ordinal, dc.scan_exact_drops(cfg, root).filter(on_shard).collect(), clusters)
    assert read_stage_documents(root, "deduped", shard.key).equals(near.documents)
    model, pointer = qt.load_published_model(root)
    scored = rerun(q.QualityScorer(model, cfg.stages.quality.threshold, model_id=pointer["model_hash"]), near.documents)
    assert read_stage_documents(root, "quality_scored", shard.key).equals(scored)
    redacted = rerun(SafetyThenRedact.from_config(cfg.stages, model.score), scored)
    assert root.read_parquet(documents_key("pii_redacted", shard.key)).equals(redacted)
