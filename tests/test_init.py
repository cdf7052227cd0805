"""`refinery init`: formats, buckets and fields found, the budget's maths, and refusals."""

import gzip
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from orchestration.cli import main as refinery
from refinery.config import ConfigError, load_config
from refinery.init import BUDGET_MARGIN, MICRO_BATCH_SIZE, SHORT_SEQ_LEN, plan_curriculum, scan
from refinery.testing.crawl import generate_corpus

DOCS = list(generate_corpus(24, seed=3, dup_fraction=0.0, near_dup_fraction=0.0))


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_formats_buckets_and_fields_are_found(tmp_path):
    data = tmp_path / "My Data"
    write_jsonl_gz(data / "top.jsonl.gz", [{"text": t, "url": u} for u, t in DOCS[:6]])
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"story": t, "uid": f"s{i}"} for i, (_, t) in enumerate(DOCS[6:12])]),
        "test": datasets.Dataset.from_list([{"story": t, "uid": f"t{i}"} for i, (_, t) in enumerate(DOCS[12:14])])})
    dd.save_to_disk(str(data / "Stories-2024" / "hf"))
    (data / "tables").mkdir()
    pq.write_table(pa.table({"n": [1, 2], "label": ["a", "b"]}), data / "tables" / "numbers.parquet")
    (data / "tables" / "readme.md").write_text("notes")
    sources, ignored = scan(str(data))
    assert [(s.name, s.bucket, s.fmt, s.pattern()) for s in sources] == [
        ("stories_2024", "stories_2024", "hf_dataset", "Stories-2024/hf"),
        ("tables", "tables", "parquet", "tables/*.parquet"),
        ("web", "web", "jsonl", "*.jsonl.gz"),
    ]
    assert ignored == ["tables/readme.md"]

    config = tmp_path / "cfg" / "refinery.yaml"
    assert refinery(["init", str(data), "--config", str(config), "--out", str(tmp_path / "out")]) == 0
    text = config.read_text()
    raw = yaml.safe_load(text)
    assert raw["data_root"] == "../out"
    by_name = {s["name"]: s for s in raw["sources"]}
    # A DatasetDict's text column is found by length when no usual name fits; its id column is kept.
    assert by_name["stories_2024"] == {"name": "stories_2024", "path": "../My Data/Stories-2024/hf",
                                       "format": "hf_dataset", "bucket": "stories_2024", "text_field": "story",
                                       "id_field": "uid"}
    # A table with no text column is written commented out, with the reason.
    assert "tables" not in by_name
    assert "# NOT USED: no text field found (fields: ['n', 'label'])" in text
    assert "  # - {name: tables, path: ../My Data/tables/*.parquet, format: parquet, bucket: tables}" in text
    cfg = load_config(config)
    assert sorted(cfg.buckets) == ["stories_2024", "tables", "web"]
    # The curated stories are the quality classifier's positive class, the web its negative.
    assert (cfg.stages.quality.positive_buckets, cfg.stages.quality.negative_buckets) == (["stories_2024"], ["web"])


def test_refusals(tmp_path, capsys):
    assert refinery(["init", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.csv").write_text("x,y\n")
    assert refinery(["init", str(tmp_path / "empty"), "--config", str(tmp_path / "c.yaml")]) == 2
    assert "no WARC, JSONL, Parquet or Hugging Face dataset inputs found (not read: a.csv)" in capsys.readouterr().err
    data = tmp_path / "data"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"content": t} for _, t in DOCS])
    config = tmp_path / "c.yaml"
    config.write_text("# mine\n")
    assert refinery(["init", str(data), "--config", str(config)]) == 2
    assert config.read_text() == "# mine\n"
    assert refinery(["init", str(data), "--config", str(config), "--force"]) == 0
    assert load_config(config).sources[0].text_field == "content"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"content": "A few words."}])
    with pytest.raises(ConfigError, match="too few for a curriculum"):
        from refinery.init import write_config
        write_config(str(data), str(config), force=True, log=lambda _: None)


def test_budget_is_whole_steps_within_the_margin_and_weights_follow_the_estimate():
    estimate = {"web": 60_000, "books": 30_000, "code": 0, "wiki": 9_000}
    plan = plan_curriculum(estimate)
    step = MICRO_BATCH_SIZE * SHORT_SEQ_LEN
    assert plan.seq_len == SHORT_SEQ_LEN
    assert [name for name, _ in plan.phases] == ["main", "anneal"]
    assert all(tokens % step == 0 and tokens > 0 for _, tokens in plan.phases)
    assert plan.total == sum(t for _, t in plan.phases) <= BUDGET_MARGIN * sum(estimate.values())
    assert plan.total > BUDGET_MARGIN * sum(estimate.values()) - 2 * step
    # rounded down to 0.001, the biggest bucket takes the rest; a bucket with no text gets no weight
    assert plan.weights == {"web": 0.607, "books": 0.303, "wiki": 0.09}
    assert sum(plan.weights.values()) == pytest.approx(1.0, abs=1e-9)


def test_config_and_data_root_inside_the_folder_are_not_inputs(tmp_path, monkeypatch):
    data = tmp_path / "d"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"text": t} for _, t in DOCS])
    (data / "refinery-out" / "documents").mkdir(parents=True)  # a previous run's tables
    pq.write_table(pa.table({"text": ["an earlier run's output " * 10]}), data / "refinery-out" / "documents" / "t.parquet")
    monkeypatch.chdir(data)
    assert refinery(["init", "."]) == 0
    assert refinery(["init", ".", "--force"]) == 0
    cfg = load_config(data / "refinery.yaml")
    assert cfg.buckets == ["books"] and [(s.name, s.path) for s in cfg.sources] == [("books", "books/*.jsonl.gz")]
    assert "Not read" not in (data / "refinery.yaml").read_text()  # nor is the config itself listed


def test_a_source_the_run_would_refuse_is_written_commented_out(tmp_path):
    """Parquet files whose text column is missing from one of them: init finds the column the files
    share, or says why the source is left out, and the config still loads."""
    data = tmp_path / "data"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"text": t} for _, t in DOCS])
    (data / "wiki").mkdir()
    pq.write_table(pa.table({"body": [t for _, t in DOCS[:4]]}), data / "wiki" / "a.parquet")
    pq.write_table(pa.table({"content": [t for _, t in DOCS[4:8]]}), data / "wiki" / "b.parquet")
    (data / "broken").mkdir()
    (data / "broken" / "x.parquet").write_bytes(b"PAR1 not really")
    config = tmp_path / "refinery.yaml"
    assert refinery(["init", str(data), "--config", str(config)]) == 0
    text = config.read_text()
    assert "# NOT USED: no text column that every file has (a.parquet: ['body']; b.parquet: ['content'])" in text
    assert "# NOT USED: x.parquet could not be read" in text
    assert [s.name for s in load_config(config).sources] == ["books"]
