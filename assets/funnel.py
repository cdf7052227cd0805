"""The per-document funnel, partitioned by input batch: `raw_documents` -> `extracted_text` ->
`language_filtered` -> `heuristic_filtered`, group "funnel".

raw_documents reads each file of the batch (refinery/stages/ingest.py) and writes its tables batch
by batch as it reads; the other three run a pure stage on each file. A source that lists "language" or "heuristic" under `skip` passes its documents
through that stage untouched (the factory applies `skip:` through each stage's `skip_key`;
language columns are then null, so every partition of
language_filtered has the same schema).
"""

import dagster as dg
import polars as pl

from assets.factory import batch_stage_asset, pure_stage_asset
from refinery.fanout import FileResult
from assets.partitions import Partitions
from assets.provenance import code_version
from assets.resource import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, input_file_state, input_shards
from refinery.stages import custom, extract, heuristic, ingest, language, readers
from refinery.stage_file_tasks import build_extractor, build_heuristic, build_language, ingest_file



def heuristic_code_version(cfg: RefineryConfig) -> str:
    """heuristic_filtered's code version: the built-in rules' module, then the module of each of the
    config's custom filters, so that editing a filter's code marks the stage (and what follows) stale."""
    filters = [custom.custom_filter_class(spec, cfg.base_dir) for spec in cfg.stages.custom_filters]
    return code_version(heuristic, *filters)



# raw_documents' metadata entry of each batch's input files (`input_file_state`): what `refinery
# demo --changed` compares with the files now there (orchestration/changed.py).
INPUT_STATE = "input_file_state"


def input_state_metadata(refinery: RefineryResource, files: list[InputShard], done: list[FileResult]) -> dict:
    return {INPUT_STATE: dg.MetadataValue.json(input_file_state(files))}


def require_input_files(cfg: RefineryConfig) -> None:
    if not input_shards(cfg):
        raise dg.Failure("no input files match any source path in the config; fix sources[].path")


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    raw_documents = batch_stage_asset(
        ingest.STAGE, ingest_file, parts, version=code_version(ingest, readers), deps=[], text_column="raw",
        check_input=require_input_files, extra_metadata=input_state_metadata,
        description="One row per WARC record, JSONL line or table row of each file of the batch, with provenance; "
        "bad records become ingest/* rejects.",
    )
    stages = [
        (extract.STAGE, build_extractor, code_version(extract), "HTML to text with resiliparse (main "
         "content); text passes through; other content types and empty extractions are rejected."),
        (language.STAGE, build_language, code_version(language), "fastText lid.176 on the whole text; "
         "keeps the configured languages at or above min_score."),
        (heuristic.STAGE, build_heuristic, heuristic_code_version(cfg), "URL blocklist, Gopher quality "
         "and repetition, C4 line rules and FineWeb quality rules, each rule named and counted; then the "
         "config's custom filters."),
    ]
    return dg.Definitions(assets=[raw_documents] + [
        pure_stage_asset(name, build, parts, description=description, version=version)
        for name, build, version, description in stages
    ])
