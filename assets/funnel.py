"""The per-document funnel, partitioned by input batch: `raw_documents` -> `extracted_text` ->
`language_filtered` -> `heuristic_filtered`, and any other stage of the registry with a recipe
(refinery/stage_recipes.py) whose asset assets/quality.py does not make, group "funnel".

raw_documents reads each file of the batch (refinery/stages/ingest.py) and writes its tables batch
by batch as it reads; the others run the stage their recipe builds on each file. A source that lists "language" or "heuristic" under `skip` passes its documents
through that stage untouched (the factory applies `skip:` through each stage's `skip_key`;
language columns are then null, so every partition of
language_filtered has the same schema).
"""

import inspect

import dagster as dg

from assets.factory import batch_stage_asset, pure_stage_asset
from refinery.fanout import FileResult
from assets.partitions import Partitions
from assets.provenance import code_version
from assets.resource import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard, input_file_state, input_shards
from assets.quality import STAGE_ASSETS
from refinery.stage_recipes import recipe, stage_code
from refinery.stages import ingest, readers, registry
from refinery.stage_file_tasks import ingest_file


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
    # Every other per-document stage of the registry, as its recipe builds it: its code version is
    # the code its recipe says it runs, its description the recipe's docstring.
    stages = [stage.name for stage in registry.STAGES if stage.build is not None and stage.name not in STAGE_ASSETS]
    return dg.Definitions(assets=[raw_documents] + [
        pure_stage_asset(name, parts, description=inspect.getdoc(recipe(name)) or name,
                         version=code_version(*stage_code(name, cfg)))
        for name in stages
    ])
