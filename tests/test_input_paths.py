"""Input paths that are not what they seem: symlinks that leave the source's folder (refused, one
`ingest/outside_source` reject, never read) and file names that are not valid UTF-8 (they cost only
their own file)."""

import json
import os
import re
from pathlib import Path

import dagster as dg
import polars as pl

from orchestration.definitions import build_definitions
from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph
from refinery.config import ExtractConfig, load_config
from refinery.documents import input_shards
from refinery.commands.init_sources import scan
from refinery.layout import documents_key, rejects_key
from refinery.stages.ingest import read_input_shard
from refinery.storage import LocalDataRoot

from helpers import configs
from helpers.texts import PROSE

SECRET = "SECRET-TOKEN-do-not-train-on-me"


def write_jsonl(path: Path, name: str, n: int = 3) -> None:
    path.write_text("".join(json.dumps({"text": f"{name} {j}. {PROSE}", "url": f"https://{name}.example/{j}"}) + "\n"
                            for j in range(n)))


def hostile_tree(tmp_path: Path) -> Path:
    """web/ with two valid files, a symlink to one of them (inside) and a symlink to a secret file
    outside web/, whose lines would each be a reject (not JSON) with their text as the excerpt."""
    web = tmp_path / "web"
    web.mkdir()
    write_jsonl(web / "a.jsonl", "a")
    write_jsonl(web / "b.jsonl", "b")
    (web / "c.jsonl").symlink_to(web / "a.jsonl")
    secret = tmp_path / "secret" / "keys.txt"
    secret.parent.mkdir()
    secret.write_text(f"{SECRET} line one\n{json.dumps({'text': SECRET + ' ' + PROSE})}\n")
    (web / "leak.jsonl").symlink_to(secret)
    return tmp_path


def write_config(tmp_path: Path) -> Path:
    return configs.write_config(tmp_path, {
        "seed": 1, "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "web/*.jsonl", "format": "jsonl", "bucket": "web"}],
        "stages": {"quality": {"enabled": False}},
    }, "refinery.yaml")


def ingest(config: Path):
    cfg = load_config(config)
    return {s.key: read_input_shard(s, cfg.source(s.source), ExtractConfig()) for s in input_shards(cfg)}


def test_a_symlink_out_of_the_source_folder_is_one_outside_source_reject_and_never_read(tmp_path):
    out = ingest(write_config(hostile_tree(tmp_path)))
    leak = out["web-leak"]
    assert leak.documents.height == 0
    assert leak.rejects["rule"].to_list() == ["ingest/outside_source"]
    assert leak.rejects["excerpt"].to_list() == [None]
    for o in out.values():
        assert SECRET not in o.documents.write_json() and SECRET not in o.rejects.write_json()
    # every valid record still comes out, the symlink inside the folder included
    assert {k: o.documents.height for k, o in out.items()} == {"web-a": 3, "web-b": 3, "web-c": 3, "web-leak": 0}
    assert {k: o.rejects.height for k, o in out.items() if k != "web-leak"} == {"web-a": 0, "web-b": 0, "web-c": 0}


def test_a_symlinked_source_folder_still_reads_its_own_files(tmp_path):
    real = tmp_path / "disk" / "web"
    real.mkdir(parents=True)
    write_jsonl(real / "a.jsonl", "a")
    (tmp_path / "web").symlink_to(real, target_is_directory=True)
    out = ingest(write_config(tmp_path))
    assert {k: (o.documents.height, o.rejects.height) for k, o in out.items()} == {"web-a": (3, 0)}


def test_init_skips_a_symlink_out_of_the_folder_with_a_note(tmp_path):
    hostile_tree(tmp_path)
    sources, ignored = scan(str(tmp_path / "web"))
    assert sorted(os.path.basename(p) for s in sources for p in s.paths) == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert ignored == ["leak.jsonl (a symlink out of this folder)"]


def test_a_file_name_that_is_not_utf8_costs_only_itself(tmp_path):
    web = tmp_path / "web"
    web.mkdir()
    write_jsonl(web / "a.jsonl", "a")
    bad = os.path.join(os.fsencode(web), b"bad\xff.jsonl")
    with open(bad, "wb") as f:
        f.write(json.dumps({"text": f"bad name. {PROSE}", "url": "https://bad.example/0"}).encode() + b"\n")
    config = write_config(tmp_path)
    with dg.DagsterInstance.ephemeral() as instance:
        assert materialize_graph(build_definitions(str(config)), instance, [dg.AssetKey("raw_documents")],
                                 log=lambda _: None, run_config=QUIET_RUN_CONFIG)
    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    # The name is cleaned for its key, so the key ends in a hash of the real name (`input_key`).
    bad_key = next(s.key for s in input_shards(cfg) if s.key != "web-a")
    assert re.fullmatch(r"web-bad_~~[0-9a-f]{10}", bad_key), bad_key
    docs = {k: pl.read_parquet(root.local_path(documents_key("raw_documents", k))) for k in ("web-a", bad_key)}
    bad = pl.read_parquet(root.local_path(rejects_key("raw_documents", bad_key)))
    assert {k: d.height for k, d in docs.items()} == {"web-a": 3, bad_key: 0}
    assert bad["rule"].to_list() == ["ingest/bad_file_name"]
    assert bad["detail"][0].endswith("web/bad\\xff.jsonl")
