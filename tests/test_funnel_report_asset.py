"""`funnel_report`: the whole corpus's funnel on one asset page, the same table `refinery funnel` prints."""

import base64
import hashlib
import re
from pathlib import Path

import dagster as dg

from assets import report
from refinery.reports.funnel import FUNNEL_ORDER, funnel_chart_png, load_stage_totals
from refinery.layout import FUNNEL_CHART_KEY, FUNNEL_REPORT_KEY
from orchestration.cli import main
from refinery.storage import LocalDataRoot

from helpers.funnel_stats import stats, write_funnel_config
from helpers.materialize import materialize, module_assets

STAGES = {
    ("raw_documents", "web-0"): stats("raw_documents", {"web": (60, 50, 1_000_000, 900_000)}, {"ingest/binary_payload": 10}),
    ("raw_documents", "code-0"): stats("raw_documents", {"code": (40, 40, 100_000, 100_000)}),
    ("heuristic_filtered", "web-0"): stats("heuristic_filtered", {"web": (50, 25, 900_000, 450_000)},
                                           {"gopher_quality/min_words": 20, "url/blocklisted_domain": 5}),
    ("heuristic_filtered", "code-0"): stats("heuristic_filtered", {"code": (40, 40, 100_000, 100_000)}),
    ("pii_redacted", "web-0"): stats("pii_redacted", {"web": (25, 24, 450_000, 440_000)}, {"safety/blocked_word": 1}),
    ("pii_redacted", "code-0"): stats("pii_redacted", {"code": (40, 40, 100_000, 100_000)}),
}


def fr_totals(root: LocalDataRoot) -> dict:
    """The stage totals the asset charts: the funnel's stages only."""
    return {k: v for k, v in load_stage_totals(root).items() if k in FUNNEL_ORDER}


STORES_HEAD = "\n\nData root: "


def materialize_report(config: str) -> dg.ExecuteInProcessResult:
    [asset] = module_assets(report, config).values()
    return materialize([asset], config, raise_on_error=False)


def test_page_shows_the_chart_and_the_table_of_refinery_funnel(tmp_path, capsys):
    config = write_funnel_config(tmp_path)
    root = LocalDataRoot(tmp_path / "out")
    for (stage, part), s in STAGES.items():
        root.write_json(f"stats/{stage}/{part}.json", s.to_dict())
    assert main(["funnel", "--config", config]) == 0
    # The command ends with the data root's stores, which the asset (run before the tokens) leaves out.
    printed = capsys.readouterr().out.split(STORES_HEAD)[0].rstrip("\n") + "\n"
    # tokenized_shards is downstream of the report: the command lists it, the asset does not
    root.write_json("stats/tokenized_shards/web.json", stats("tokenized_shards", {"web": (24, 24, 1, 1)}).to_dict())

    result = materialize_report(config)
    assert result.success
    md = {k: v.value for k, v in result.get_asset_materialization_events()[0].materialization.metadata.items()}
    # the chart on its own row (the asset page draws a short markdown in place), the table on the next
    [chart] = re.fullmatch(r"!\[corpus funnel: 100 records to 64 documents\]\(data:image/png;base64,([^)]+)\)"
                           r"\n\ndocuments left after each stage \(`.*`\)", md["funnel"], re.S).groups()
    [table] = re.fullmatch(r"`refinery funnel`:\n\n```\n(.*)```", md["funnel_table"], re.S).groups()
    assert table == printed, "the same table as the command"
    assert "gopher_quality/min_words 20" in table and "Budget: B0 = N * b_t / prod(r_j)" in table
    assert (md["stages"], md["records_in"], md["docs_out"]) == (3, 100, 64)
    assert md["retention"] == round(90 / 100 * 65 / 90 * 64 / 65, 6)
    assert [s["stage"] for s in md["report"]["stages"]] == ["raw_documents", "heuristic_filtered", "pii_redacted"]
    assert md["target_tokens"] == 1_000_000_000
    assert md["raw_input_bytes"] == round(md["report"]["budget"]["raw_input_bytes"])

    png = base64.b64decode(chart)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and root.read_bytes(FUNNEL_CHART_KEY) == png
    assert md["content_hashes"] == {FUNNEL_REPORT_KEY: hashlib.sha256(root.read_bytes(FUNNEL_REPORT_KEY)).hexdigest(),
                                    FUNNEL_CHART_KEY: hashlib.sha256(png).hexdigest()}
    assert root.read_json(FUNNEL_REPORT_KEY) == md["report"]


def test_without_funnel_stats_it_fails_naming_what_to_materialize(tmp_path):
    config = write_funnel_config(tmp_path)
    result = materialize_report(config)
    assert not result.success
    error = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "no funnel stats under" in error and "materialize the funnel first" in error
    assert not (tmp_path / "out" / "reports").exists()


def test_the_demo_materializes_it_in_the_run_of_pii_redacted():
    from orchestration.definitions import build_definitions as build_graph
    from orchestration.demo import execution_plan

    steps = [[k.to_user_string() for k in step.keys] for step in execution_plan(build_graph(str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")))]
    [step] = [s for s in steps if "funnel_report" in s]
    assert "pii_redacted" in step and step.index("pii_redacted") < step.index("funnel_report")


def test_page_shows_retention_per_language_in_its_metadata_table_and_chart(tmp_path, capsys):
    from helpers.funnel_trail import write_trail_corpus

    trail = write_trail_corpus(tmp_path)
    result = materialize_report(str(trail.config))
    assert result.success
    md = {k: v.value for k, v in result.get_asset_materialization_events()[0].materialization.metadata.items()}
    by_language = md["retention_by_language"]
    assert {lang: (v["docs_in"], v["docs_out"], v["retention"]) for lang, v in by_language.items()} == {
        "en": (5, 2, 0.4), "de": (2, 1, 0.5), "fr": (1, 0, 0.0)}
    assert md["report"]["languages"]["en"]["stages"]["near_deduped"]["docs_out"] == 2
    assert main(["funnel", "--config", str(trail.config)]) == 0
    printed = capsys.readouterr().out.split(STORES_HEAD)[0]
    assert "Per language, documents" in printed and printed.strip() in md["funnel_table"]
    stats = [t.stats for t in fr_totals(trail.root).values()]
    png = trail.root.read_bytes(FUNNEL_CHART_KEY)
    assert png == funnel_chart_png(stats, md["funnel"].split("]")[0].removeprefix("!["), md["report"]["languages"])
    assert png != funnel_chart_png(stats, md["funnel"].split("]")[0].removeprefix("![")), "the language panel is drawn"
