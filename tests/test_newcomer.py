"""A newcomer's first hour: a folder of their own JSONL.gz, WARC and Parquet files, `refinery init`
on it, then `refinery demo --config` materializes the whole graph in one try, training included."""

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from orchestration.cli import main as refinery
from refinery.config import load_config
from refinery.documents import CLEAN_STAGE, input_shards
from refinery.layout import documents_key
from refinery.throughput import DEMO_BYTES_PER_TOKEN
from refinery.curriculum import read_manifest
from refinery.storage import LocalDataRoot
from synthetic.crawl import generate_corpus
from training.phase_runs import phase_run_dir
from training.status import read_status

REPO = Path(__file__).resolve().parents[1]


def write_user_files(root: Path) -> None:
    """What a user brings: a crawl file at the top, two JSONL.gz files whose text is under "content",
    a Parquet file whose text is under "body", and a note Refinery cannot read."""
    root.mkdir()
    shutil.copy(REPO / "data" / "sample" / "web" / "web-00.warc.gz", root / "crawl-2024-00.warc.gz")
    (root / "books").mkdir()
    docs = list(generate_corpus(60, seed=7, dup_fraction=0.0, near_dup_fraction=0.0))
    for part in range(2):
        with gzip.open(root / "books" / f"part-{part}.jsonl.gz", "wt") as f:
            for i, (url, text) in enumerate(docs[part * 20:(part + 1) * 20]):
                f.write(json.dumps({"id": f"b{part}-{i}", "content": text, "link": url}) + "\n")
    (root / "wiki").mkdir()
    rows = [{"title": f"Article {i}", "body": text, "page_url": url} for i, (url, text) in enumerate(docs[40:])]
    pq.write_table(pa.Table.from_pylist(rows), root / "wiki" / "articles.parquet")
    (root / "notes.txt").write_text("my own notes\n")


@pytest.mark.slow
def test_init_then_the_whole_graph_materializes_in_one_try(tmp_path, monkeypatch, capsys):
    data = tmp_path / "mydata"
    write_user_files(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))

    assert refinery(["init", "mydata"]) == 0
    text = (tmp_path / "refinery.yaml").read_text()
    assert "files directly in it go to the `web` bucket" in text
    assert f"tokenizer's {DEMO_BYTES_PER_TOKEN} bytes per token" in text
    assert "Not read (no format Refinery knows): notes.txt" in text
    raw = yaml.safe_load(text)
    assert raw["data_root"] == "refinery-out"
    assert {s["name"]: (s["path"], s["format"], s["bucket"], s.get("text_field")) for s in raw["sources"]} == {
        "web": ("mydata/*.warc.gz", "warc", "web", None),
        "books": ("mydata/books/*.jsonl.gz", "jsonl", "books", "content"),
        "wiki": ("mydata/wiki/*.parquet", "parquet", "wiki", "body"),
    }
    assert raw["stages"]["language"]["languages"] == ["en"]

    # A second init does not overwrite the config the user may have edited.
    assert refinery(["init", "mydata"]) == 2
    assert "refinery.yaml exists; pass --force" in capsys.readouterr().err

    # The command the README gives, exactly once.
    assert refinery(["demo", "--config", "refinery.yaml"]) == 0
    out = capsys.readouterr().out
    assert "OK: the curriculum is valid" in out
    assert "Open the UI on these runs with `make ui CONFIG=refinery.yaml`" in out, "the config just run, not the demo's"

    cfg = load_config(tmp_path / "refinery.yaml")
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    for shard in input_shards(cfg):  # every input of every source reached raw_documents
        assert root.read_parquet(documents_key("raw_documents", shard.key)).height > 0, shard.key
    clean = pl.concat([root.read_parquet(documents_key(CLEAN_STAGE, s.key)) for s in input_shards(cfg)])
    per_bucket = dict(clean.group_by("bucket").len().iter_rows())
    assert set(per_bucket) == {"web", "books", "wiki"} and min(per_bucket.values()) > 0
    planned = {p["name"]: p["tokens"] for p in raw["curriculum"]["phases"]}
    assert list(planned) == ["main", "anneal"]
    for phase, tokens in planned.items():
        manifest = read_manifest(root, phase)
        assert (manifest.phase, manifest.token_budget, manifest.validation["ok"]) == (phase, tokens, True)
        assert set(manifest.buckets) == {"web", "books", "wiki"}
    status = read_status(phase_run_dir(cfg, "anneal"))
    assert status["state"] == "completed"
