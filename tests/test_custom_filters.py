"""stages.custom_filters: filters of your own by dotted path, on the built-in filters' base."""

import sys
import textwrap
import uuid
from pathlib import Path

import polars as pl
import pytest
import yaml

from refinery.stage_recipes import build_stage
from refinery.config import ConfigError, load_config
from refinery.documents import REJECTS_SCHEMA
from refinery.preflight import require
from helpers import configs
from helpers.documents import provenance_frame
from helpers.texts import PROSE

EXAMPLE = {"name": "digits", "path": "docs.examples.min_digits:MinDigits", "params": {"min_digits": 3}}


def write_config(tmp_path: Path, custom_filters: list[dict], skip: list[str] | None = None) -> Path:
    cfg = {
        "data_root": "out",
        "buckets": ["web"],
        "sources": [{"name": "web", "path": "in/*.jsonl", "format": "jsonl", "bucket": "web", "skip": skip or []}],
        "stages": {"custom_filters": custom_filters},
    }
    return configs.write_config(tmp_path, cfg)


def docs(texts: list[str]) -> pl.DataFrame:
    return provenance_frame(texts, [f"https://harbour.example/{i}" for i in range(len(texts))], language="en")


def test_example_filter_removes_exactly_the_documents_without_enough_digits(tmp_path):
    cfg = load_config(write_config(tmp_path, [EXAMPLE]))
    texts = [
        PROSE,                                              # no digits: the example drops it
        PROSE + " The harbour wall was built in 1887.",     # four digits: kept
        "Too short.",                                       # the built-in rules drop it first
        PROSE + " Two boats, 12 nets.",                     # two digits: dropped
    ]
    stage = build_stage("heuristic_filtered", cfg, "web")
    out = stage.run(docs(texts))
    assert out.documents["doc_id"].to_list() == ["web-a/0000001"]
    assert out.documents.columns == docs(texts).columns
    assert dict(out.rejects.schema) == REJECTS_SCHEMA
    assert out.rejects.select("doc_id", "stage", "rule", "value").rows() == [
        ("web-a/0000002", "heuristic_filtered", "gopher_quality/min_words", 2.0),
        ("web-a/0000000", "heuristic_filtered", "digits/too_few_digits", 0.0),
        ("web-a/0000003", "heuristic_filtered", "digits/too_few_digits", 2.0),
    ]
    assert out.rejects["detail"][2] == "2 digits < min_digits 3"
    assert dict(out.stats.dropped) == {"gopher_quality/min_words": 1, "digits/too_few_digits": 2}
    assert (out.stats.docs_in, out.stats.docs_out) == (4, 1)
    assert out.stats.by_bucket["web"].docs_out == 1
    assert stage.config_summary()["custom_filters"] == [EXAMPLE]


def test_a_source_that_skips_heuristic_skips_its_custom_filters(tmp_path):
    cfg = load_config(write_config(tmp_path, [EXAMPLE], skip=["heuristic"]))
    stage = build_stage("heuristic_filtered", cfg, "web")
    out = stage.run_for_source(docs([PROSE, "Too short."]), cfg.source("web").skip)
    assert out.documents.height == 2 and out.rejects.height == 0
    assert out.stats.counters["skipped_by_source"] == 2


def test_module_beside_the_config_is_isolated_per_record_and_its_reasons_get_the_family(tmp_path):
    module = f"shouting_{uuid.uuid4().hex[:8]}"  # a fresh name: the import cache holds no other
    (tmp_path / f"{module}.py").write_text(textwrap.dedent("""
        from refinery.stages.base import Drop, Filter

        class Shouting(Filter):
            reads = ("text",)

            def check(self, record):
                if "boom" in record["text"]:
                    raise RuntimeError("exploded")
                return Drop("too_loud", 1.0) if "!!!" in record["text"] else None
    """))
    cfg = load_config(write_config(tmp_path, [{"name": "shout", "path": f"{module}:Shouting"}]))
    out = build_stage("heuristic_filtered", cfg, "web").run(docs([PROSE + " Hooray!!!", PROSE + " boom.", PROSE]))
    assert out.documents["doc_id"].to_list() == ["web-a/0000002"]
    assert out.rejects["rule"].to_list() == ["shout/too_loud", "shout/error"]
    assert out.rejects["detail"][1] == "RuntimeError: exploded"


@pytest.mark.parametrize("spec, message", [
    ({"name": "digits", "path": "no_such_pkg.filters:MinDigits"},
     "stages.custom_filters[0].path: cannot import 'no_such_pkg.filters': No module named 'no_such_pkg'"),
    ({"name": "digits", "path": "docs.examples.min_digits:MaxDigits"},
     "stages.custom_filters[0].path: module 'docs.examples.min_digits' has no attribute 'MaxDigits'"),
    ({"name": "digits", "path": "refinery.config:SourceConfig"},
     "stages.custom_filters[0].path: refinery.config:SourceConfig is not a subclass of refinery.stages.base.Filter"),
    ({"name": "digits", "path": "refinery.stages.base:Filter"},
     "stages.custom_filters[0].path: refinery.stages.base:Filter does not implement ['check']"),
    ({"name": "digits", "path": "docs.examples.min_digits:MinDigits", "params": {"min_digit": 3}},
     "stages.custom_filters[0].params: MinDigits(**params) raised TypeError"),
    ({"name": "digits", "path": "docs.examples.min_digits:MinDigits", "params": {"min_digits": 0}},
     "stages.custom_filters[0].params: MinDigits(**params) raised ValueError: min_digits must be at least 1"),
    ({"name": "c4", "path": "docs.examples.min_digits:MinDigits"},
     "stages.custom_filters[0].name: 'c4' is a built-in stage's reason family"),
    ({"name": "digits", "path": "docs/examples/min_digits.py"},
     "stages.custom_filters[0].path: String should match pattern"),
])
def test_bad_custom_filters_are_config_errors_naming_the_field(tmp_path, spec, message):
    with pytest.raises(ConfigError) as err:
        require(write_config(tmp_path, [spec]))  # the preflight builds them, not load_config
    assert message in str(err.value)


def test_editing_a_custom_filters_code_changes_heuristic_filtered_code_version(tmp_path):
    """Dagster marks heuristic_filtered, and what follows it, stale when its code version changes:
    the version covers each custom filter's module, and is the built-in rules' alone without any."""
    from assets import funnel
    from assets.provenance import code_version, stage_code_version
    from assets.partitions import Partitions
    from refinery.stage_recipes import stage_code
    from refinery.stages import heuristic

    def heuristic_version(cfg) -> str:
        return code_version(*stage_code("heuristic_filtered", cfg))

    module = f"tagged_{uuid.uuid4().hex[:8]}"

    def write_filter(most_tags: int) -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(f"""
            from refinery.stages.base import Drop, Filter

            class Tagged(Filter):
                reads = ("text",)

                def check(self, record):
                    return Drop("hashtags", 1.0) if record["text"].count("#") > {most_tags} else None
        """))

    write_filter(3)
    cfg = load_config(write_config(tmp_path, [{"name": "tags", "path": f"{module}:Tagged"}]))
    before = heuristic_version(cfg)
    write_filter(12)  # another length too, so no cached copy of the old source can pass for the new
    sys.modules.pop(module)  # as a reloaded code server would, import the edited file afresh
    after = heuristic_version(cfg)
    (tmp_path / "plain").mkdir()
    built_in = heuristic_version(load_config(write_config(tmp_path / "plain", [])))
    assert built_in == code_version(heuristic)
    assert len({built_in, before, after}) == 3
    defs = funnel.build_definitions(cfg, Partitions.from_config(cfg))
    [stage] = [a for a in defs.assets if a.key.to_user_string() == "heuristic_filtered"]
    assert stage.code_versions_by_key[stage.key] == stage_code_version("heuristic_filtered", after)


def test_custom_filter_names_must_differ(tmp_path):
    with pytest.raises(ConfigError, match=r"stages.custom_filters: names repeat: \['digits', 'digits'\]"):
        load_config(write_config(tmp_path, [EXAMPLE, EXAMPLE]))


@pytest.mark.slow  # two spawned workers each import Dagster and the stages: about 30 s
def test_custom_filter_in_the_materialized_funnel_with_worker_processes(tmp_path):
    """heuristic_filtered through Dagster, its files fanned out over two spawned workers: each worker
    imports the filter from the config and its rejects and counts reach the tables and metadata."""
    import json

    from assets import funnel
    from helpers.materialize import materialize, module_assets
    from refinery.documents import input_batches
    from refinery.layout import rejects_key, stats_key
    from refinery.stages.attributes import read_stage_documents
    from refinery.storage import LocalDataRoot

    (tmp_path / "in").mkdir()
    for part, extra in enumerate(["The harbour wall was built in 1887.", "Two boats, 12 nets."]):
        lines = [{"text": PROSE, "url": f"https://harbour.example/{part}/plain"},
                 {"text": f"{PROSE} {extra}", "url": f"https://harbour.example/{part}/numbers"}]
        (tmp_path / "in" / f"part-{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    config = write_config(tmp_path, [EXAMPLE])
    raw = yaml.safe_load(config.read_text())
    raw["partitions"] = {"by": "hash", "count": 1, "workers": 2}
    config.write_text(yaml.safe_dump(raw))
    cfg = load_config(config)
    [batch] = input_batches(cfg)
    assets = list(module_assets(funnel, config).values())
    result = materialize(assets, config, partition_key=batch.key)
    root = LocalDataRoot(tmp_path / "out")
    kept = pl.concat([read_stage_documents(root, "heuristic_filtered", s.key) for s in batch.shards])
    assert kept["url"].to_list() == ["https://harbour.example/0/numbers"]
    rejects = pl.concat([root.read_parquet(rejects_key("heuristic_filtered", s.key)) for s in batch.shards])
    assert sorted(zip(rejects["url"], rejects["rule"], rejects["value"])) == [
        ("https://harbour.example/0/plain", "digits/too_few_digits", 0.0),
        ("https://harbour.example/1/numbers", "digits/too_few_digits", 2.0),
        ("https://harbour.example/1/plain", "digits/too_few_digits", 0.0),
    ]
    assert root.read_json(stats_key("heuristic_filtered", batch.shards[1].key))["dropped"] == {"digits/too_few_digits": 2}
    [md] = [e.materialization.metadata for e in result.get_asset_materialization_events()
            if e.asset_key.to_user_string() == "heuristic_filtered"]
    assert md["removed_by_rule"].data == {"digits/too_few_digits": 3}
    assert md["config"].data["custom_filters"] == [EXAMPLE]
