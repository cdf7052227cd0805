"""`refinery funnel`: stages in funnel order, retention overall and per bucket, and seed 002's budget."""

import json

import pytest
import yaml

from orchestration.cli import main
from refinery.reports.funnel import stage_order
from refinery.throughput import DEMO_BYTES_PER_TOKEN
from refinery.storage import LocalDataRoot

from helpers.funnel_stats import stats, write_funnel_config


@pytest.fixture
def materialized(tmp_path):
    root = LocalDataRoot(tmp_path / "out")
    parts = {
        # two partitions of raw_documents merge into one row
        ("raw_documents", "web-0"): stats("raw_documents", {"web": (60, 50, 1_000_000, 900_000)}, {"ingest/binary_payload": 10}),
        ("raw_documents", "code-0"): stats("raw_documents", {"code": (40, 40, 100_000, 100_000)}),
        ("extracted_text", "web-0"): stats("extracted_text", {"web": (50, 50, 900_000, 90_000)}),
        ("extracted_text", "code-0"): stats("extracted_text", {"code": (40, 40, 100_000, 100_000)}),
        ("heuristic_filtered", "web-0"): stats(
            "heuristic_filtered", {"web": (50, 25, 90_000, 45_000)}, {"gopher_quality/min_words": 20, "url/blocklisted_domain": 5}
        ),
        ("heuristic_filtered", "code-0"): stats("heuristic_filtered", {"code": (40, 40, 100_000, 100_000)}),
        ("some_new_stage", "web-0"): stats("some_new_stage", {"web": (25, 25, 45_000, 45_000)}),
        ("language_filtered", "web-0"): stats("language_filtered", {"web": (50, 50, 90_000, 90_000)}),
    }
    for (stage, part), s in parts.items():
        root.write_json(f"stats/{stage}/{part}.json", s.to_dict())
    return write_funnel_config(tmp_path)


def test_json_report_orders_stages_and_merges_partitions(materialized, capsys):
    assert main(["funnel", "--config", materialized, "--json", "--target-tokens", "1000000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["stage"] for s in report["stages"]] == [
        "raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "some_new_stage"
    ]
    raw = report["stages"][0]
    assert (raw["partitions"], raw["docs_in"], raw["docs_out"]) == (2, 100, 90)
    assert raw["top_reasons"] == {"ingest/binary_payload": 10}
    heur = report["stages"][3]
    assert heur["retention"] == pytest.approx(65 / 90)
    assert list(heur["top_reasons"]) == ["gopher_quality/min_words", "url/blocklisted_domain"]

    byte_product = (1_000_000 / 1_100_000) * (190_000 / 1_000_000) * (145_000 / 190_000) * 1.0 * 1.0
    assert report["overall"]["byte_retention"] == pytest.approx(byte_product, abs=1e-6)
    budget = report["budget"]
    # no token shards to measure b_t from: init's estimate, said to be one
    assert budget["target_tokens"] == 1_000_000 and budget["bytes_per_token"] == DEMO_BYTES_PER_TOKEN
    assert budget["bytes_per_token_source"].startswith("estimate: the demo tokenizer's")
    assert budget["raw_input_bytes"] == pytest.approx(1_000_000 * DEMO_BYTES_PER_TOKEN / byte_product)

    web = report["buckets"]["web"]
    assert web["stages"]["heuristic_filtered"]["retention"] == 0.5
    assert web["retention"] == pytest.approx(50 / 60 * 0.5)
    assert web["byte_retention"] == pytest.approx(0.9 * 0.1 * 0.5)
    assert web["raw_bytes_per_token"] == pytest.approx(DEMO_BYTES_PER_TOKEN / (0.9 * 0.1 * 0.5), rel=1e-5)
    assert report["buckets"]["code"]["retention"] == 1.0


def test_table_report_for_people(materialized, capsys):
    assert main(["funnel", "--config", materialized, "--bytes-per-token", "3.5"]) == 0
    out = capsys.readouterr().out
    assert out.index("raw_documents") < out.index("extracted_text") < out.index("some_new_stage")
    assert "gopher_quality/min_words 20" in out
    assert "b_t = 3.5" in out and "N = 1,000,000,000 tokens" in out
    assert "b_t: bytes of clean text per token (as given (--bytes-per-token))" in out
    assert "Per bucket" in out and "code" in out
    # every column of every table has a legend line
    for column in ("parts:", "kept:", "bytes kept:", "dropped:", "rewritten:", "docs kept, bytes kept:",
                   "raw bytes/token:", "B0:", "prod(r_j):"):
        assert column in out, column
    assert "seed 0" not in out


def test_b_t_is_measured_from_the_token_shards_once_they_exist(tmp_path):
    from refinery.reports.funnel import bytes_per_token
    from refinery.layout import final_index_key
    from refinery.stages.stats import StageStats

    root = LocalDataRoot(tmp_path)
    assert bytes_per_token(root, ["web"])[0] == DEMO_BYTES_PER_TOKEN
    root.write_json("stats/tokenized_shards/web-00.json", StageStats(stage="tokenized_shards", bytes_in=3_700).to_dict())
    root.write_json(final_index_key("web"), {"tokens": 1_000})
    assert bytes_per_token(root, ["web"]) == (3.7, "measured: text bytes tokenized per token in the final shards")
    assert bytes_per_token(None, ["web"])[0] == DEMO_BYTES_PER_TOKEN, "the funnel_report asset: always the estimate"


def test_target_tokens_default_to_the_curriculum_total(tmp_path, materialized, capsys):
    curriculum = {"total_tokens": 5000, "phases": [{"name": "main", "share": 1.0, "weights": {"web": 1.0}, "seq_len": 64}]}
    config = write_funnel_config(tmp_path, curriculum=curriculum)
    assert main(["funnel", "--config", config, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"]["target_tokens"] == 5000


def test_nothing_materialized_is_an_error_that_says_what_to_do(tmp_path, capsys):
    config = write_funnel_config(tmp_path)
    assert main(["funnel", "--config", config]) == 1
    err = capsys.readouterr().err
    assert "nothing materialized yet" in err and "make demo" not in err  # the user's own config, not the demo's
    # `refinery demo` trains, so a config without a curriculum is pointed at the UI's funnel group only.
    assert "refinery demo" not in err
    assert f"materialize the graph on this config first: `make ui CONFIG={config}`" in err


def test_a_stage_where_nothing_survives_has_no_finite_budget(tmp_path, capsys):
    root = LocalDataRoot(tmp_path / "out")
    root.write_json("stats/raw_documents/web-0.json", stats("raw_documents", {"web": (5, 0, 100, 0)}).to_dict())
    assert main(["funnel", "--config", write_funnel_config(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"]["raw_input_bytes"] is None


@pytest.mark.parametrize("content", ["{not json", '{"stage": "raw_documents"}', "[1, 2]"])
def test_an_unreadable_stats_file_is_named(tmp_path, capsys, content):
    bad = tmp_path / "out" / "stats" / "raw_documents" / "web-0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(content)
    assert main(["funnel", "--config", write_funnel_config(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "re-materialize" in err


def test_bad_arguments_and_missing_config(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["funnel", "--config", write_funnel_config(tmp_path), "--target-tokens", "-5"])
    assert exit_info.value.code == 2
    assert main(["funnel", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_stage_order_puts_unknown_stages_last():
    assert stage_order(["zeta", "heuristic_filtered", "raw_documents", "alpha"]) == [
        "raw_documents", "heuristic_filtered", "alpha", "zeta"
    ]


# ---- --explain -------------------------------------------------------------------------------------

SPAM = "\n".join(["Buy cheap phones now {click} here"] * 20)
CLEAN = "\n".join(
    [
        "The harbour town wakes slowly when the fishing boats return with the morning tide.",
        "Traders set out their stalls along the quay and argue about the price of fresh mackerel.",
        "Children run between the nets while their parents count the catch and mend the torn ropes.",
        "By noon the market is loud with voices, and the smell of salt and smoke drifts over the water.",
        "Visitors who come for a single day often stay for a week, charmed by the narrow streets.",
        "In the evening the lamps are lit and the old sailors tell stories that grow longer every year.",
    ]
)


@pytest.fixture
def language_filtered(tmp_path):
    import polars as pl

    from refinery.documents import PROVENANCE_SCHEMA
    from refinery.stages.attributes import write_stage_documents

    rows = [("web-0/0000000", "https://a.example/spam", SPAM), ("web-0/0000001", "https://a.example/town", CLEAN)]
    table = pl.DataFrame(
        {
            "doc_id": [r[0] for r in rows],
            "url": [r[1] for r in rows],
            "source": ["web"] * 2,
            "bucket": ["web"] * 2,
            "file": ["a.warc.gz"] * 2,
            "record_index": [0, 1],
            "record_offset": [0, 100],
            "fetch_time": [None] * 2,
            "content_type": ["text/html"] * 2,
            "text": [r[2] for r in rows],
            "language": ["en"] * 2,
            "language_score": [0.9, 0.95],
        },
        schema_overrides={**PROVENANCE_SCHEMA, "text": pl.String, "language": pl.String},
    )
    write_stage_documents(LocalDataRoot(tmp_path / "out"), "language_filtered", "web-0", table)
    return tmp_path


def test_explain_lists_every_rule_a_document_fails(language_filtered, capsys):
    config = write_funnel_config(language_filtered)
    assert main(["funnel", "--config", config, "--explain", "https://a.example/spam"]) == 0
    out = capsys.readouterr().out
    assert "doc_id web-0/0000000" in out and "language en (0.90)" in out
    assert "fails 15 heuristic rule(s)" in out
    rows = [line.split(None, 2) for line in out.splitlines()]
    for row in (["gopher_quality/stop_words", "0", "< 2"], ["gopher_rep/dup_line_frac", "0.95", "> 0.3"],
                ["gopher_rep/dup_10_gram", "0.7761", "> 0.1"], ["c4/curly_bracket", "1", "'{' in a line that is not code: 'Buy cheap phones now {click} here'"],
                ["fineweb/char_dup_ratio", "0.95", "> 0.1"]):
        assert row in rows, out
    assert main(["funnel", "--config", config, "--explain", "web-0/0000000", "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    rules = [f["rule"] for f in exp["failures"]]
    assert rules[0] == "gopher_quality/stop_words" and "c4/curly_bracket" in rules and len(rules) == 15
    assert exp["failures"][1] == {"rule": "gopher_rep/dup_line_frac", "value": pytest.approx(0.95),
                                  "threshold": "> 0.3",
                                  "excerpt": "most repeated line (20 times): 'Buy cheap phones now {click} here'"}
    # every failure says where to look; the curly bracket's threshold quotes the line already
    shown = {f["rule"]: f["excerpt"] for f in exp["failures"]}
    assert shown["c4/curly_bracket"] is None and all(v for r, v in shown.items() if r != "c4/curly_bracket")
    assert shown["gopher_rep/dup_10_gram"].startswith("most common 10-gram")
    assert shown["gopher_quality/stop_words"] == "text starts: " + repr(" ".join(SPAM.split())[:120] + "...")
    assert main(["funnel", "--config", config, "--explain", "web-0/0000000"]) == 0
    assert "  gopher_rep/dup_line_frac: most repeated line (20 times): 'Buy cheap phones now {click} here'" in \
        capsys.readouterr().out.split("where to look:")[1]


def test_the_offending_line_is_found_by_each_languages_rules():
    """Chinese counts 。 as end punctuation and a line of ten characters as short; German's
    commonest 2-gram is named in its own words."""
    from refinery.config.stages import HeuristicConfig
    from refinery.stages.heuristic.explain import offending_excerpt
    from refinery.stages.heuristic.filter import HeuristicFilter

    rules = HeuristicFilter(HeuristicConfig()).rules_for
    zh = "安装软件包之前请先更新索引。\n常用选项如下所示共有三项内容\n选项列表\n最后一行。"
    assert offending_excerpt("fineweb/line_punct_ratio", zh, rules("zh")) == \
        "first line without end punctuation (line 2): '常用选项如下所示共有三项内容'"
    assert offending_excerpt("fineweb/short_line_ratio", zh, rules("zh")) == "first short line (line 3): '选项列表'"
    assert offending_excerpt("fineweb/short_line_ratio", zh, rules("en")) == \
        "first short line (line 1): '安装软件包之前请先更新索引。'"  # 14 characters: short at English's 30
    de = "Jetzt kaufen und sparen, jetzt kaufen und sparen, jetzt kaufen!"
    assert offending_excerpt("gopher_rep/top_2_gram", de, rules("de")) == "most common 2-gram (2 times): 'kaufen und'"
    assert offending_excerpt("c4/curly_bracket", de, rules("de")) is None  # its threshold quotes the line


def test_explain_follows_the_sources_rule_switches(language_filtered, capsys):
    config = write_funnel_config(language_filtered)
    data = yaml.safe_load(open(config))
    data["sources"][0]["rules_off"] = ["c4/curly_bracket"]
    open(config, "w").write(yaml.safe_dump(data))
    assert main(["funnel", "--config", config, "--explain", "web-0/0000000", "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    assert exp["rules_off"] == ["c4/curly_bracket"]
    assert "c4/curly_bracket" not in [f["rule"] for f in exp["failures"]]
    assert main(["funnel", "--config", config, "--explain", "https://a.example/town"]) == 0
    assert "passes every heuristic rule" in capsys.readouterr().out


def test_explain_runs_the_configs_custom_filters_after_the_rules(language_filtered, capsys):
    digits = {"name": "digits", "path": "docs.examples.min_digits:MinDigits", "params": {"min_digits": 3}}
    config = write_funnel_config(language_filtered, stages={"custom_filters": [digits]})
    assert main(["funnel", "--config", config, "--explain", "https://a.example/town", "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    assert exp["custom_filters"] == ["digits"]
    assert exp["failures"] == [{"rule": "digits/too_few_digits", "value": 0.0, "threshold": "0 digits < min_digits 3",
                                "excerpt": None}]
    assert main(["funnel", "--config", config, "--explain", "web-0/0000000", "--json"]) == 0
    rules = [f["rule"] for f in json.loads(capsys.readouterr().out)["failures"]]
    assert len(rules) == 16 and rules[0] == "gopher_quality/stop_words" and rules[-1] == "digits/too_few_digits"
    assert main(["funnel", "--config", config, "--explain", "https://a.example/town"]) == 0
    out = capsys.readouterr().out
    assert "custom filters, after the rules: digits" in out
    assert ["digits/too_few_digits", "0", "0 digits < min_digits 3"] in [line.split(None, 2) for line in out.splitlines()]


def test_explain_of_an_unknown_document_says_where_it_looked(language_filtered, capsys):
    assert main(["funnel", "--config", write_funnel_config(language_filtered), "--explain", "https://nowhere.example/"]) == 1
    err = capsys.readouterr().err
    assert "no document with doc_id or url 'https://nowhere.example/'" in err and "language_filtered" in err


# ---- per language ----------------------------------------------------------------------------------


def test_retention_per_language_counts_documents_and_bytes_after_every_stage(tmp_path, capsys):
    from helpers.funnel_trail import PII_TEXT, TEXTS, write_trail_corpus

    trail = write_trail_corpus(tmp_path)

    def size(*docs: str, text: dict = TEXTS) -> int:
        return sum(len(text.get(d, TEXTS[d]).encode()) for d in docs)

    assert main(["funnel", "--config", str(trail.config), "--json"]) == 0
    languages = json.loads(capsys.readouterr().out)["languages"]
    assert set(languages) == {"en", "de", "fr"}  # a/5 was removed before language ID
    en = languages["en"]
    assert (en["docs_in"], en["bytes_in"]) == (5, size("a/0", "a/2", "a/4", "b/0", "b/1"))
    assert {s: (v["docs_out"], v["bytes_out"]) for s, v in en["stages"].items()} == {
        "language_filtered": (5, size("a/0", "a/2", "a/4", "b/0", "b/1")),
        "heuristic_filtered": (4, size("a/0", "a/4", "b/0", "b/1")),
        "exact_deduped": (3, size("a/0", "a/4", "b/1")),
        "near_deduped": (2, size("a/0", "a/4")),
        "quality_scored": (2, size("a/0", "a/4")),
        "pii_redacted": (2, size("a/0", "a/4", text=PII_TEXT)),  # the redacted text's bytes
    }
    assert (en["docs_out"], en["retention"]) == (2, 0.4)
    assert en["byte_retention"] == round(size("a/0", "a/4", text=PII_TEXT) / size("a/0", "a/2", "a/4", "b/0", "b/1"), 6)
    de = languages["de"]
    assert (de["docs_in"], de["bytes_in"], de["docs_out"], de["bytes_out"]) == (2, size("a/3", "b/2"), 1, size("a/3"))
    assert de["stages"]["language_filtered"] == {"docs_out": 1, "bytes_out": size("a/3")}  # b/2 scored too low
    fr = languages["fr"]
    assert (fr["docs_in"], fr["bytes_in"], fr["retention"]) == (1, size("a/1"), 0.0)
    assert all(v == {"docs_out": 0, "bytes_out": 0} for v in fr["stages"].values())

    assert main(["funnel", "--config", str(trail.config)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["language", "in", "language_filtered", "heuristic_filtered", "exact_deduped", "near_deduped",
            "quality_scored", "pii_redacted", "kept"] in rows
    assert ["en", "5", "5", "4", "3", "2", "2", "2", "40.0%"] in rows
    assert ["de", "2", "1", "1", "1", "1", "1", "1", "50.0%"] in rows
    assert ["fr", "1", "0", "0", "0", "0", "0", "0", "0.0%"] in rows
    firsts = [r[0] for r in rows if r]
    assert firsts.index("en") < firsts.index("de") < firsts.index("fr"), "most documents entering language ID first"


def test_no_language_table_before_language_id_has_run(materialized, capsys):
    assert main(["funnel", "--config", materialized, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["languages"] == {}
    assert main(["funnel", "--config", materialized]) == 0
    assert "Per language" not in capsys.readouterr().out
