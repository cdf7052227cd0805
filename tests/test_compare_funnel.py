"""`refinery compare` on two roots one heuristic threshold apart: the funnel summary before the file
list (per stage and per rule, matching each root's own stats), every failing rule counted, and a
root compared with itself refused."""

import json

import polars as pl

from orchestration.cli import main as refinery
from refinery.commands.compare import compare_roots
from refinery.layout import rejects_key
from refinery.reports.funnel_diff import rule_failures
from refinery.stages.heuristic.filter import STAGE
from refinery.storage import LocalDataRoot

from helpers.threshold_roots import write_heuristic_root


def test_a_document_failing_two_rules_is_counted_under_both(tmp_path):
    folder, stats = write_heuristic_root(tmp_path / "a", min_words=50)
    rejects = LocalDataRoot(str(folder)).read_parquet(rejects_key(STAGE, "web-00"))
    symbols = rejects.filter(pl.col("doc_id") == "web/2").row(0, named=True)
    failed = [f["rule"] for f in symbols["failures"]]
    assert symbols["rule"] == failed[0] == "gopher_quality/min_words"  # the first stays the reject's rule
    assert len(failed) >= 2 and "gopher_quality/min_words" in failed
    counts = rule_failures(LocalDataRoot(str(folder)))
    for rule in failed:
        assert counts[(STAGE, rule)] >= 1
    assert counts[(STAGE, "gopher_quality/min_words")] == 3  # web/1, web/2, web/3
    assert counts[(STAGE, "c4/too_few_sentences")] == 2  # web/1 and web/2, neither its first failure
    assert dict(stats.dropped) == {"gopher_quality/min_words": 3}  # each document once, under its first rule


def test_compare_summarises_what_one_threshold_did(tmp_path, capsys):
    a, stats_a = write_heuristic_root(tmp_path / "a", min_words=50)
    b, stats_b = write_heuristic_root(tmp_path / "b", min_words=5)
    result = compare_roots(a, b)
    stage = next(r for r in result.funnel["stages"] if r["name"] == STAGE)
    assert (stage["a_docs"], stage["b_docs"]) == (stats_a.docs_out, stats_b.docs_out) == (1, 2)
    assert (stage["a_bytes"], stage["b_bytes"]) == (stats_a.bytes_out, stats_b.bytes_out)
    rules = {r["name"].split(" ")[1]: r for r in result.funnel["rules"]}
    for rule in set(stats_a.dropped) | set(stats_b.dropped):  # first failing rule: the funnel's own count
        assert (rules[rule]["a_first"], rules[rule]["b_first"]) == (stats_a.dropped[rule], stats_b.dropped[rule])
    # At min_words 5, C4's sentence count takes web/1 over: the rule it already failed becomes its first.
    assert (rules["c4/too_few_sentences"]["a_first"], rules["c4/too_few_sentences"]["b_first"]) == (0, 1)
    assert (rules["c4/too_few_sentences"]["a_failing"], rules["c4/too_few_sentences"]["b_failing"]) == (2, 2)
    assert (rules["gopher_quality/min_words"]["a_failing"], rules["gopher_quality/min_words"]["b_failing"]) == (3, 1)
    assert refinery(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert out.index("Funnel, A -> B") < out.index("Removals per stage and rule") < out.index("Files:")
    assert f"{STAGE} gopher_quality/min_words" in out and f"{STAGE} c4/too_few_sentences" in out
    stage_row = next(line for line in out.splitlines() if line.startswith(f"{STAGE} "))
    assert stage_row.split()[1:4] == ["1", "2", "+1"]  # docs A, B, change
    assert refinery(["compare", str(a), str(b), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["funnel"]["stages"][-1]["b_docs"] == 2


def test_compare_refuses_a_root_against_itself(tmp_path, capsys):
    a, _ = write_heuristic_root(tmp_path / "a", min_words=50)
    (tmp_path / "link").symlink_to(a)
    assert refinery(["compare", str(a), str(tmp_path / "link")]) == 2
    assert "are one folder" in capsys.readouterr().err
