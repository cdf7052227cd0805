"""The per-document funnel, one partition per input shard: `raw_documents` -> `extracted_text` ->
`language_filtered` -> `heuristic_filtered`, group "funnel".

raw_documents reads the shard's file (assets/stages/ingest.py); the other three are the factory's
shard stages. A source that lists "language" or "heuristic" under `skip` passes its documents
through that stage untouched (the factory applies `skip:` through each stage's `skip_key`;
language columns are then null, so every partition of language_filtered has the same schema).
"""

import dagster as dg

from assets.factory import code_version, provenance_metadata, publish_stage_output, shard_stage_asset
from assets.stages import extract, heuristic, ingest, language
from orchestration.resources import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, input_shard, input_shards


def _extractor(cfg: RefineryConfig, shard: InputShard) -> extract.Extractor:
    return extract.Extractor(cfg.stages.extract)


def _language(cfg: RefineryConfig, shard: InputShard) -> language.LanguageFilter:
    return language.LanguageFilter.from_config(cfg.stages.language, cfg.resolve)


def _heuristic(cfg: RefineryConfig, shard: InputShard) -> heuristic.HeuristicFilter:
    return heuristic.HeuristicFilter(cfg.stages.heuristic, cfg.source(shard.source).rules_off)


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    ingest_version = code_version(ingest)

    @dg.asset(
        name=ingest.STAGE,
        partitions_def=parts.input_shards,
        group_name="funnel",
        code_version=ingest_version,
        kinds={"polars", "parquet"},
        description="One row per WARC record or JSONL line of the shard's file, with provenance; "
        "bad records become ingest/* rejects.",
    )
    def raw_documents(context: dg.AssetExecutionContext, refinery: RefineryResource) -> dg.MaterializeResult:
        cfg, root = refinery.config, refinery.root
        if not input_shards(cfg):
            raise dg.Failure("no input files match any source path in the config; fix sources[].path")
        shard = input_shard(cfg, context.partition_key)
        source = cfg.source(shard.source)
        out = ingest.read_input_shard(shard, source, cfg.stages.extract, cfg.stages.record_timeout_s)
        outputs = publish_stage_output(root, ingest.STAGE, shard.key, out)
        context.log.info(f"raw_documents[{shard.key}]: {out.stats.docs_in} records -> {out.stats.docs_out} documents")
        settings = {"source": source.model_dump(mode="json"), "extract": cfg.stages.extract.model_dump(mode="json")}
        return dg.MaterializeResult(
            metadata=provenance_metadata(out.stats, settings, ingest_version, outputs, out.documents, "raw")
        )

    stages = [
        (extract.STAGE, ingest.STAGE, _extractor, extract, "HTML to text with resiliparse (main content); "
         "text passes through; other content types and empty extractions are rejected."),
        (language.STAGE, extract.STAGE, _language, language, "fastText lid.176 on the whole text; keeps "
         "the configured languages at or above min_score."),
        (heuristic.STAGE, language.STAGE, _heuristic, heuristic, "URL blocklist, Gopher quality and "
         "repetition, C4 line rules and FineWeb quality rules, each rule named and counted."),
    ]
    assets = [raw_documents] + [
        shard_stage_asset(
            name=name,
            upstream=upstream,
            build=build,
            partitions_def=parts.input_shards,
            description=description,
            version_of=module,
        )
        for name, upstream, build, module, description in stages
    ]
    return dg.Definitions(assets=assets)
