"""One reader per input format, registered once (refinery/stages/readers/formats.py): the config
accepts exactly the registered formats, and ingest, preflight and `refinery init` each take a
format's reader, column check and file names from the registry, so a change there reaches all
three."""

from __future__ import annotations

import dataclasses
import json
import typing

import pyarrow as pa
import pyarrow.parquet as pq

from helpers.configs import write_config
from refinery.commands.init_sources import detect_format, scan
from refinery.config import SourceConfig, load_config
from refinery.documents import input_shards
from refinery.preflight import source_file_problems
from refinery.stages import ingest
from refinery.stages.readers import formats, input_format, known_format
from refinery.stages.readers.jsonl import read_jsonl


def test_the_config_accepts_exactly_the_registered_formats():
    accepted = typing.get_args(SourceConfig.model_fields["format"].annotation)
    assert accepted == tuple(f.name for f in formats.FORMATS)
    assert known_format("csv") is None and known_format(None) is None
    folder_formats = [f.name for f in formats.FORMATS if f.is_folder]
    assert folder_formats == ["hf_dataset"] and not input_format("hf_dataset").extensions


def test_each_formats_file_names_and_folders_are_detected(tmp_path):
    names = {"a.warc.gz": "warc", "B.WARC": "warc", "c.jsonl.gz": "jsonl", "d.ndjson": "jsonl", "e.parquet": "parquet",
             "f.csv": None, "g.json": None}
    for name, fmt in names.items():
        (tmp_path / name).write_bytes(b"")
        assert detect_format(str(tmp_path / name)) == fmt, name
    (tmp_path / "ds").mkdir()
    assert detect_format(str(tmp_path / "ds")) is None
    (tmp_path / "ds" / "state.json").write_text("{}")
    assert detect_format(str(tmp_path / "ds")) == "hf_dataset"


def test_ingest_preflight_and_init_take_a_format_from_the_registry(tmp_path, monkeypatch):
    read: list[str] = []

    def counted(path, *args):
        read.append(path)
        read_jsonl(path, *args)

    jsonl = dataclasses.replace(input_format("jsonl"), read=counted, extensions=(".lines",))
    parquet = dataclasses.replace(input_format("parquet"), schemas=lambda path: [(path, ["body"])])
    replaced = {"jsonl": jsonl, "parquet": parquet}
    monkeypatch.setattr(formats, "FORMATS", tuple(replaced.get(f.name, f) for f in formats.FORMATS))

    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.lines").write_text(json.dumps({"text": "the harbour at dawn"}) + "\n")
    (inputs / "b.jsonl").write_text(json.dumps({"text": "not this one"}) + "\n")
    # init: the registered file names, and no others
    found, ignored = scan(str(inputs))
    assert [(s.fmt, [p.rsplit("/", 1)[-1] for p in s.paths]) for s in found] == [("jsonl", ["a.lines"])]
    assert ignored == ["b.jsonl"]

    # ingest: the registered reader
    cfg = load_config(write_config(tmp_path, {
        "data_root": str(tmp_path / "out"), "buckets": ["web"],
        "sources": [{"name": "web", "path": str(inputs / "*.lines"), "format": "jsonl", "bucket": "web"}]}))
    shard, = input_shards(cfg)
    documents = []
    stats = ingest.stream_input_shard(shard, cfg.source("web"), cfg.stages.extract, documents.append, lambda _: None)
    assert read == [shard.path] and stats.docs_out == 1
    assert [t for frame in documents for t in frame["raw"].to_list()] == ["the harbour at dawn"]

    # preflight: the registered column check
    table = inputs / "t.parquet"
    pq.write_table(pa.table({"text": ["x"]}), table)
    problems = source_file_problems({"format": "parquet", "text_field": "text"}, 0, [str(table)], str(inputs))
    assert problems == [f"sources[0].text_field: {table} has no column 'text'; its columns are ['body']; "
                        f"set text_field to one of them"]
    assert source_file_problems({"format": "jsonl", "text_field": "text"}, 0, [str(table)], str(inputs)) == []


def test_input_discovery_takes_a_formats_inputs_from_the_registry(tmp_path, monkeypatch):
    """What a source's glob matches stand for is its format's record's to say (a DatasetDict's
    directory stands for its splits): input discovery asks it, given the source's folder."""
    asked = []

    def first_only(matched, folder):
        asked.append((list(matched), folder))
        return matched[:1]

    jsonl = dataclasses.replace(input_format("jsonl"), expand=first_only)
    monkeypatch.setattr(formats, "FORMATS", tuple(jsonl if f.name == "jsonl" else f for f in formats.FORMATS))
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (inputs / name).write_text(json.dumps({"text": name}) + "\n")
    cfg = load_config(write_config(tmp_path, {
        "data_root": str(tmp_path / "out"), "buckets": ["web"],
        "sources": [{"name": "web", "path": str(inputs / "*.jsonl"), "format": "jsonl", "bucket": "web"}]}))
    assert [s.path for s in input_shards(cfg)] == [str(inputs / "a.jsonl")]
    assert asked[0] == ([str(inputs / "a.jsonl"), str(inputs / "b.jsonl")], str(inputs))
