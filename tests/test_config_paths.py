"""refinery/config/paths.py: every file a config names is rewritten when the config moves."""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel

from refinery.config import RefineryConfig
from refinery.config.paths import FILE_FIELDS, dotted, rebase_paths
from refinery.preflight import Needs, path_problems
from tests.helpers.configs import DEMO, read_demo

# Fields whose name looks like a path but name no input file: where outputs go, an import path.
NOT_INPUT_FILES = {"data_root", "training.run_dir", "stages.custom_filters[].path", "base_dir"}
LIST_FIELDS = {"sources[].path", "contamination.eval_sets[].path", "ablations.eval_sets"}


def schema_fields(model: type[BaseModel], prefix: str = ""):
    """Every field of the config schema as a dotted name (`[]` for a list of sections)."""
    for name, field in model.model_fields.items():
        yield prefix + name
        ann = field.annotation
        for arg in (ann, *typing.get_args(ann)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                nested = "[]." if typing.get_origin(ann) is list else "."
                yield from schema_fields(arg, prefix + name + nested)


def test_every_path_like_field_of_the_schema_is_rebased():
    path_like = {name for name in schema_fields(RefineryConfig)
                 if re.search(r"(^|_)(path|set|sets|dir|root|file)$", name.rsplit(".", 1)[-1])}
    assert path_like - NOT_INPUT_FILES - {"contamination.eval_sets"} == LIST_FIELDS | {dotted(k) for k in FILE_FIELDS}


def test_the_demo_config_moved_elsewhere_names_every_file_it_did(tmp_path):
    moved = rebase_paths(read_demo(), DEMO.parent)
    (tmp_path / "refinery.yaml").write_text(yaml.safe_dump(moved))
    assert path_problems(moved, tmp_path, Needs(sources=True, eval_sets=True)) == []
    assert os.path.isabs(moved["contamination"]["eval_sets"][0]["path"])
    # Unmoved, the same relative paths name nothing from the other folder.
    assert any("contamination.eval_sets[0].path" in p
               for p in path_problems(read_demo(), tmp_path, Needs(sources=True, eval_sets=True)))


def test_rebase_relative_to_another_folder_keeps_urls_and_absolute_paths(tmp_path):
    base, to = tmp_path / "configs", tmp_path / "packed"
    data = {
        "sources": [{"name": "web", "path": "../data/*.warc.gz"}, {"name": "s3", "path": "s3://bucket/x/*.jsonl"}],
        "contamination": {"eval_sets": [{"name": "e", "path": "/abs/eval.jsonl"}]},
        "ablations": {"eval_sets": ["evals/extra.jsonl"]},
        "tokenizer": {"path": "tok/tokenizer.json"},
        "stages": {"quality": {"labelled_set": None}, "language": {"model_path": "lid.ftz"}},
    }
    out = rebase_paths(data, base, to=to)
    assert out["sources"][0]["path"] == os.path.join("..", "data", "*.warc.gz")
    assert out["sources"][1]["path"] == "s3://bucket/x/*.jsonl"
    assert out["contamination"]["eval_sets"][0]["path"] == "/abs/eval.jsonl"
    assert out["ablations"]["eval_sets"] == [os.path.join("..", "configs", "evals", "extra.jsonl")]
    assert out["tokenizer"]["path"] == os.path.join("..", "configs", "tok", "tokenizer.json")
    assert out["stages"]["language"]["model_path"] == os.path.join("..", "configs", "lid.ftz")
    assert out["stages"]["quality"]["labelled_set"] is None
    assert data["tokenizer"]["path"] == "tok/tokenizer.json"  # the input is not modified
    moved = rebase_paths(data, base, sources=lambda p: str(Path("/new") / p.name))
    assert moved["sources"][0]["path"] == "/new/*.warc.gz"
