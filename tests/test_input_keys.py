"""Issue 26, items 3 and 4: an input file's partition key (and so its doc ids) is a function of its
own path below the source's folder, so a new file never moves an old one; and a symlink out of the
source's folder is never opened, by discovery, the preflight, ingest or `refinery init`."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import dagster as dg
import datasets
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from orchestration.definitions import build_definitions
from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph
from refinery import preflight
from refinery.config import ExtractConfig, load_config
from refinery.documents import input_shards
from refinery.commands.init import write_config as init_config
from refinery.layout import documents_key, stats_key
from refinery.stages.ingest import payload_checks, read_input_shard
from refinery.storage import LocalDataRoot

from helpers import configs
from helpers.fifo_watch import watched_fifo
from helpers.texts import PROSE

SECRET = "SECRET-TOKEN-do-not-train-on-me"
HASHED = r"~~[0-9a-f]{10}"  # what ends a key whose path had to be cleaned


def write_jsonl(path: Path, name: str, n: int = 3) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"text": f"{name} {j}. {PROSE}", "url": f"https://{name}.example/{j}"}) + "\n"
                    for j in range(n))
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(lines.encode()))
    else:
        path.write_text(lines)


def write_config(tmp_path: Path, pattern: str = "web/*.jsonl", fmt: str = "jsonl", **source) -> Path:
    return configs.write_config(tmp_path, {
        "seed": 1, "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": pattern, "format": fmt, "bucket": "web", **source}],
        "stages": {"quality": {"enabled": False}},
    }, "refinery.yaml")


def keys(config: Path) -> dict[str, str]:
    """Path below the config's folder -> partition key."""
    return {str(Path(s.path).relative_to(config.parent)): s.key for s in input_shards(load_config(config))}


def doc_ids(config: Path, key: str) -> list[str]:
    cfg = load_config(config)
    shard = next(s for s in input_shards(cfg) if s.key == key)
    return read_input_shard(shard, cfg.source(shard.source), ExtractConfig()).documents["doc_id"].to_list()


def run_ingest(config: Path) -> LocalDataRoot:
    with dg.DagsterInstance.ephemeral() as instance:
        assert materialize_graph(build_definitions(str(config)), instance, [dg.AssetKey("raw_documents")],
                                 log=lambda _: None, run_config=QUIET_RUN_CONFIG)
    cfg = load_config(config)
    return LocalDataRoot(cfg.resolve(cfg.data_root))


# ---- keys ------------------------------------------------------------------------------------------------


def test_a_new_file_whose_cleaned_name_collides_moves_no_old_key_doc_id_or_output(tmp_path):
    write_jsonl(tmp_path / "web" / "a_b.jsonl", "old")
    write_jsonl(tmp_path / "web" / "c.jsonl", "c")
    config = write_config(tmp_path)
    before = keys(config)
    assert before == {"web/a_b.jsonl": "web-a_b", "web/c.jsonl": "web-c"}
    assert doc_ids(config, "web-a_b") == ["web-a_b/0000000", "web-a_b/0000001", "web-a_b/0000002"]
    root = run_ingest(config)
    old_bytes = root.sha256(documents_key("raw_documents", "web-a_b"))

    # Each cleans to `a_b`, and " " and "+" sort before "_": the old numbering gave the first of
    # them `web-a_b` and moved the old file to `web-a_b-2`.
    for name in ("a b", "a+b", "a\u00e9b"):
        write_jsonl(tmp_path / "web" / f"{name}.jsonl", "new")
    after = keys(config)
    assert {p: after[p] for p in before} == before
    assert len(set(after.values())) == len(after) == 5
    for name in ("a b", "a+b", "a\u00e9b"):
        assert re.fullmatch("web-a_b" + HASHED, after[f"web/{name}.jsonl"]), after
    assert doc_ids(config, "web-a_b") == ["web-a_b/0000000", "web-a_b/0000001", "web-a_b/0000002"]
    assert doc_ids(config, after["web/a b.jsonl"]) == [f"{after['web/a b.jsonl']}/{i:07d}" for i in range(3)]
    root = run_ingest(config)
    assert root.sha256(documents_key("raw_documents", "web-a_b")) == old_bytes
    old = pl.read_parquet(root.local_path(documents_key("raw_documents", "web-a_b")))
    texts = pl.Series([f"old {j}. {PROSE}" for j in range(3)])  # the old file's payloads, by their stored hashes
    assert old["raw_hash"].equals(payload_checks(texts)["raw_hash"]) and old["file"].unique().to_list() == ["web/a_b.jsonl"]


def test_keys_depend_on_each_files_own_relative_path_alone(tmp_path):
    names = ["x/a.jsonl", "y/a.jsonl", "x~y/a.jsonl", "x/y~a.jsonl", "x/a b.jsonl", "x/a_b.jsonl",
             "CC-MAIN-2024-10/part-00.jsonl", "z/" + "n" * 200 + ".jsonl"]
    everything = tmp_path / "all"
    for name in names:
        write_jsonl(everything / "web" / name, "t", 1)
    together = keys(write_config(everything, "web/*/*.jsonl"))
    assert together["web/x/a.jsonl"] == "web-x~a" and together["web/y/a.jsonl"] == "web-y~a"
    assert together["web/CC-MAIN-2024-10/part-00.jsonl"] == "web-CC-MAIN-2024-10~part-00"
    assert re.fullmatch("web-x_y~a" + HASHED, together["web/x~y/a.jsonl"])
    assert re.fullmatch("web-x~y_a" + HASHED, together["web/x/y~a.jsonl"])
    assert re.fullmatch("web-z~n{118}" + HASHED, together["web/z/" + "n" * 200 + ".jsonl"])
    assert len(set(together.values())) == len(names)
    # Each file alone, in a folder elsewhere on the machine: the same key.
    for i, name in enumerate(names):
        alone = tmp_path / f"alone{i}" / "deeper"
        write_jsonl(alone / "web" / name, "t", 1)
        assert keys(write_config(alone, "web/*/*.jsonl")) == {f"web/{name}": together[f"web/{name}"]}


def test_the_extension_stays_in_the_key_unless_the_glob_fixes_it(tmp_path):
    for name in ("a.jsonl", "a.jsonl.gz", "a.json", "b.jsonl.gz"):
        write_jsonl(tmp_path / "web" / name, "t", 1)
    assert keys(write_config(tmp_path, "web/*.json*")) == {
        "web/a.json": "web-a.json", "web/a.jsonl": "web-a.jsonl", "web/a.jsonl.gz": "web-a.jsonl.gz",
        "web/b.jsonl.gz": "web-b.jsonl.gz"}
    assert keys(write_config(tmp_path, "web/*.jsonl.gz")) == {"web/a.jsonl.gz": "web-a", "web/b.jsonl.gz": "web-b"}
    assert keys(write_config(tmp_path, "web/a.jsonl")) == {"web/a.jsonl": "web-a"}


def test_every_key_is_a_valid_partition_key_and_file_name(tmp_path):
    names = ["a...b.jsonl", "a..jsonl", "-a.jsonl", "a b\tc.jsonl", "\u00e9t\u00e9.jsonl", "a|b,c[d].jsonl",
             "n" * 240 + ".jsonl", "a_b.jsonl"]
    for name in names:
        write_jsonl(tmp_path / "web" / name, "t", 1)
    found = keys(write_config(tmp_path))
    assert len(found) == len(names) and len(set(found.values())) == len(names)
    dg.StaticPartitionsDefinition(list(found.values()))
    for key in found.values():
        assert re.fullmatch(r"web-[A-Za-z0-9_.~-]+", key) and "..." not in key and len(key) < 150, key
        (tmp_path / "out" / f"{key}.parquet").parent.mkdir(exist_ok=True)
        (tmp_path / "out" / f"{key}.parquet").write_bytes(b"")
    assert found["web/a_b.jsonl"] == "web-a_b"


def test_a_datasetdicts_splits_are_keyed_by_their_folders(tmp_path):
    rows = [{"text": f"story {i}. {PROSE}"} for i in range(2)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows)}
                         ).save_to_disk(str(tmp_path / "hf" / "corpus"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf" / "corpus_train"))
    found = {s.key for s in input_shards(load_config(write_config(tmp_path, "hf/*", "hf_dataset")))}
    assert found == {"web-corpus~train", "web-corpus~test", "web-corpus_train"}


# ---- symlinks out of the source's folder ------------------------------------------------------------------


def leaky_tree(tmp_path: Path) -> Path:
    """web/ with a file, a symlink to it (inside the folder) and a symlink to a secret file outside."""
    write_jsonl(tmp_path / "web" / "a.jsonl", "a")
    (tmp_path / "web" / "c.jsonl").symlink_to(tmp_path / "web" / "a.jsonl")
    secret = tmp_path / "secret" / "keys.jsonl"
    secret.parent.mkdir()
    secret.write_text(f"{SECRET} not json\n{json.dumps({'text': SECRET + ' ' + PROSE})}\n")
    (tmp_path / "web" / "leak.jsonl").symlink_to(secret)
    return tmp_path


def test_a_run_counts_a_symlink_out_as_one_reject_and_stores_nothing_of_it(tmp_path):
    config = write_config(leaky_tree(tmp_path))
    assert preflight.check(config, preflight.DEFINITIONS)[1] == []
    root = run_ingest(config)
    stats = {k: root.read_json(stats_key("raw_documents", k)) for k in ("web-a", "web-c", "web-leak")}
    assert stats["web-leak"]["dropped"] == {"ingest/outside_source": 1}
    assert stats["web-a"]["dropped"] == stats["web-c"]["dropped"] == {}
    assert {k: s["docs_out"] for k, s in stats.items()} == {"web-a": 3, "web-c": 3, "web-leak": 0}
    stored = sorted(p for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert stored
    for path in stored:
        text = pl.read_parquet(path).write_json() if path.suffix == ".parquet" else path.read_bytes().decode("latin-1")
        assert SECRET not in text, path
    reject = pl.read_parquet(root.local_path("rejects/raw_documents/web-leak.parquet"))
    assert reject["rule"].to_list() == ["ingest/outside_source"] and reject["excerpt"].to_list() == [None]


def test_ingest_and_the_preflight_never_open_a_symlink_out(tmp_path):
    write_jsonl(tmp_path / "web" / "a.jsonl", "a")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "web" / "leak.jsonl").symlink_to(tmp_path / "elsewhere" / "pipe")
    with watched_fifo(tmp_path / "elsewhere" / "pipe") as opened:
        config = write_config(tmp_path)
        assert preflight.check(config, preflight.DEFINITIONS)[1] == []
        cfg = load_config(config)
        out = {s.key: read_input_shard(s, cfg.source("web"), ExtractConfig()) for s in input_shards(cfg)}
        assert not opened.wait(1)
    assert out["web-leak"].rejects["rule"].to_list() == ["ingest/outside_source"]
    assert out["web-a"].documents.height == 3


def test_a_table_out_of_the_folder_is_not_named_by_the_preflight(tmp_path):
    (tmp_path / "tables").mkdir()
    (tmp_path / "secret").mkdir()
    pq.write_table(pa.table({"text": [PROSE]}), tmp_path / "tables" / "a.parquet")
    pq.write_table(pa.table({SECRET: ["x"]}), tmp_path / "secret" / "b.parquet")
    (tmp_path / "tables" / "b.parquet").symlink_to(tmp_path / "secret" / "b.parquet")
    config = write_config(tmp_path, "tables/*.parquet", "parquet")
    assert preflight.check(config, preflight.DEFINITIONS)[1] == []
    cfg = load_config(config)
    out = {s.key: read_input_shard(s, cfg.source("web"), ExtractConfig()) for s in input_shards(cfg)}
    assert out["web-b"].rejects["rule"].to_list() == ["ingest/outside_source"]
    assert SECRET not in out["web-b"].rejects.write_json()


def hf_with_a_data_file_out(tmp_path: Path) -> Path:
    """hf/ds saved with save_to_disk, its Arrow data file replaced by a symlink to a secret one."""
    datasets.Dataset.from_list([{"text": f"{SECRET} {PROSE}"}]).save_to_disk(str(tmp_path / "secret" / "ds"))
    datasets.Dataset.from_list([{"text": PROSE}]).save_to_disk(str(tmp_path / "hf" / "ds"))
    state = json.loads((tmp_path / "hf" / "ds" / "state.json").read_text())
    data = tmp_path / "hf" / "ds" / state["_data_files"][0]["filename"]
    secret_data = tmp_path / "secret" / "ds" / json.loads(
        (tmp_path / "secret" / "ds" / "state.json").read_text())["_data_files"][0]["filename"]
    data.unlink()
    data.symlink_to(secret_data)
    return tmp_path


def test_a_datasets_data_file_out_of_its_folder_is_one_reject(tmp_path):
    config = write_config(hf_with_a_data_file_out(tmp_path), "hf/*", "hf_dataset")
    assert preflight.check(config, preflight.DEFINITIONS)[1] == []
    cfg = load_config(config)
    (shard,) = input_shards(cfg)
    out = read_input_shard(shard, cfg.source("web"), ExtractConfig())
    assert out.documents.height == 0
    assert out.rejects["rule"].to_list() == ["ingest/outside_source"]
    assert SECRET not in out.rejects.write_json()


def test_init_samples_no_symlink_out_and_survives_a_link_loop(tmp_path):
    data = tmp_path / "data"
    write_jsonl(data / "web" / "a.jsonl", "a", 30)
    (data / "web" / "again").symlink_to(data / "web", target_is_directory=True)  # a loop
    (data / "web" / "leak.jsonl").symlink_to(tmp_path / "pipe")
    with watched_fifo(tmp_path / "pipe") as opened:
        lines: list[str] = []
        text = init_config(str(data), str(tmp_path / "refinery.yaml"), log=lines.append)
        assert not opened.wait(1)
    assert SECRET not in text
    assert "leak.jsonl" in text and "symlinks out of this folder" in text
    sources = yaml.safe_load(text)["sources"]
    assert [s["path"] for s in sources] == ["data/web/*.jsonl"]
