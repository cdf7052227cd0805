"""Rewriting is visible: the bytes a stage cuts from the documents it keeps are counted apart from
the bytes of the documents it drops (StageStats, `refinery funnel`, funnel_report), and every C4
line rule, the rules that rewrite kept documents, is switched off by name like a document rule."""

import json
import re
from collections import Counter

import polars as pl
import pytest

from orchestration.cli import main
from refinery.config import ConfigError, HeuristicConfig, parse_config
from refinery.config.stages import LINE_RULES
from refinery.reports.funnel import StageTotals, build_report, format_report
from refinery.stages.heuristic import HeuristicFilter
from refinery.stages.pii import PiiRedactor
from refinery.stages.stats import BucketCounts, StageStats, count_in_out
from refinery.storage import LocalDataRoot

from helpers.funnel_stats import write_funnel_config
from helpers.rewriting import (DE, DE_BODY, DROPPED, EN, EN_BODY, JA, JA_BODY, JS_NOTICE, KEPT, LOREM, PAGES, SHORT_JA,
                               pages_frame)


def _run(cfg: HeuristicConfig = HeuristicConfig(), source_rules_off: list[str] = ()):
    return HeuristicFilter(cfg, list(source_rules_off)).run(pages_frame())


def _kept_texts(out) -> dict[str, str]:
    return dict(zip(out.documents["url"], out.documents["text"]))


def _bytes(pages) -> int:
    return sum(len(p.text.encode()) for p in pages)


# ---- what the stage counts ---------------------------------------------------------------------------


def test_kept_pages_are_rewritten_and_the_bytes_cut_are_counted_apart_from_dropped_pages():
    out = _run()
    assert _kept_texts(out) == {p.url: p.kept for p in KEPT}
    assert dict(zip(out.rejects["url"], out.rejects["rule"])) == {
        LOREM.url: "c4/lorem_ipsum", SHORT_JA.url: "gopher_quality/min_words"}
    s = out.stats
    rewritten = EN.cut_bytes + DE.cut_bytes + JA.cut_bytes
    assert (EN.cut_bytes, DE.cut_bytes, JA.cut_bytes) == (82, 41, 36)
    assert s.bytes_rewritten == rewritten == 159
    assert s.bytes_dropped == _bytes(DROPPED) == 634
    assert s.bytes_in == _bytes(PAGES) and s.bytes_out == sum(len(p.kept.encode()) for p in KEPT)
    assert s.bytes_in == s.bytes_out + s.bytes_dropped + s.bytes_rewritten
    assert s.by_bucket["web"] == BucketCounts(5, 3, s.bytes_in, s.bytes_out, rewritten)
    assert s.by_bucket["web"].bytes_dropped == 634
    assert s.counters == {"c4_lines/too_few_words": 6, "c4_lines/javascript": 1}


def test_a_stage_that_keeps_texts_as_they_are_rewrites_nothing():
    out = _run(source_rules_off=LINE_RULES)
    assert (out.stats.bytes_rewritten, out.stats.bytes_dropped) == (0, _bytes(DROPPED))
    skipped = HeuristicFilter(HeuristicConfig()).skipped(pages_frame())
    assert (skipped.stats.bytes_rewritten, skipped.stats.bytes_dropped) == (0, 0)


def test_pii_placeholders_count_as_rewritten_bytes_either_way():
    frame = pages_frame((EN, DE))
    shorter = "Write to anna.schmidt@example.de for the file."  # 23 bytes of address, 7 of <EMAIL>
    longer = "Mail a@b.io now."  # 6 bytes of address
    out = PiiRedactor().run(frame.with_columns(pl.Series("text", [shorter, longer])))
    assert out.documents["text"].to_list() == ["Write to <EMAIL> for the file.", "Mail <EMAIL> now."]
    assert (out.stats.bytes_rewritten, out.stats.bytes_dropped) == (16 - 1, 0)
    assert out.stats.by_bucket["web"].bytes_rewritten == 15


def test_a_table_without_doc_ids_that_loses_rows_is_refused():
    before = pl.DataFrame({"bucket": ["web", "web"], "text": ["a", "b"]})
    stats = StageStats(stage="shout_filtered")
    count_in_out(stats, before, before)
    assert (stats.bytes_rewritten, stats.bytes_dropped) == (0, 0)
    with pytest.raises(ValueError, match="shout_filtered: without a doc_id column, which of 2 documents are the 1"):
        count_in_out(stats, before, before.head(1))


def test_stats_round_trip_merge_and_read_files_written_before_the_count():
    a = _run().stats
    b = StageStats.from_dict(json.loads(json.dumps(a.to_dict())))
    assert b.to_dict() == a.to_dict() and b.bytes_rewritten == 159
    merged = a + b
    assert (merged.bytes_rewritten, merged.bytes_dropped) == (2 * 159, 2 * 634)
    assert merged.by_bucket["web"].bytes_rewritten == 2 * 159
    old = a.to_dict()
    del old["bytes_rewritten"]
    for counts in old["by_bucket"].values():
        del counts["bytes_rewritten"]
    before = StageStats.from_dict(old)
    assert before.bytes_rewritten == 0 and before.bytes_dropped == a.bytes_in - a.bytes_out
    assert before.by_bucket["web"].bytes_dropped == a.bytes_in - a.bytes_out


# ---- switching the line rules off ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["source", "stage", "language"])
def test_every_line_rule_off_keeps_the_kept_texts_byte_for_byte(how):
    if how == "source":
        out = _run(source_rules_off=LINE_RULES)
    elif how == "stage":
        out = _run(HeuristicConfig(rules_off=list(LINE_RULES)))
    else:
        out = _run(HeuristicConfig(languages={lang: {"rules_off": list(LINE_RULES)} for lang in ("en", "de", "ja")}))
    kept = _kept_texts(out)
    assert {url: text.encode() for url, text in kept.items()} == {p.url: p.text.encode() for p in KEPT}
    assert out.stats.counters == {}
    assert out.rejects["url"].to_list() == [p.url for p in DROPPED]


def test_each_line_rule_switches_off_alone_per_source_stage_and_language():
    # stage-wide: the JavaScript notice stays, the crumbs still go
    en = _kept_texts(_run(HeuristicConfig(rules_off=["c4_lines/javascript"])))[EN.url]
    assert en == "\n".join([*EN_BODY[:3], JS_NOTICE, *EN_BODY[3:]])
    # per language: Japanese keeps its crumbs, English and German lose theirs
    texts = _kept_texts(_run(HeuristicConfig(languages={"ja": {"rules_off": ["c4_lines/too_few_words"]}})))
    assert texts[JA.url] == JA.text and (texts[EN.url], texts[DE.url]) == (EN.kept, DE.kept)
    # per source: lines keep their own breaks and spaces, the crumbs still go
    texts = _kept_texts(_run(source_rules_off=["c4_lines/whitespace"]))
    assert texts[DE.url] == "\r\n".join(DE_BODY) + "  \r\n"
    assert texts[EN.url] == "  " + "\n".join(EN_BODY) + "\n"
    assert texts[JA.url] == "\n".join(JA_BODY)
    # the citation mark stays; the line is still judged without it
    assert _kept_texts(_run(source_rules_off=["c4_lines/citation"]))[EN.url] == EN.kept.replace(
        EN_BODY[0], EN_BODY[0] + "[1]", 1)
    # no_terminal_punct is off by default (FineWeb); switched on, rules_off still switches it off
    cfg = HeuristicConfig(c4={"filter_no_terminal_punct": True})
    removed = Counter()
    text, drop = HeuristicFilter(cfg).apply(EN.kept + "\nA closing line without an end mark", None, removed, "en")
    assert (text, drop, removed) == (EN.kept, None, {"c4_lines/no_terminal_punct": 1})
    text, _ = HeuristicFilter(cfg, ["c4_lines/no_terminal_punct"]).apply(
        EN.kept + "\nA closing line without an end mark", None, Counter(), "en")
    assert text == EN.kept + "\nA closing line without an end mark"
    cfg = HeuristicConfig(c4={"max_word_length": 20})
    long_word = EN.kept + "\nThe word supercalifragilisticexpialidocious is long."
    assert HeuristicFilter(cfg).apply(long_word, None, Counter(), "en")[0] == EN.kept
    assert HeuristicFilter(cfg, ["c4_lines/too_long_word"]).apply(long_word, None, Counter(), "en")[0] == long_word
    policy = EN.kept + "\nRead our privacy policy before you sign up for the newsletter."
    assert HeuristicFilter(HeuristicConfig()).apply(policy, None, Counter(), "en")[0] == EN.kept
    assert HeuristicFilter(HeuristicConfig(), ["c4_lines/policy"]).apply(policy, None, Counter(), "en")[0] == policy


def _config(stages: dict, **source) -> dict:
    return {
        "data_root": "out",
        "buckets": ["web"],
        "sources": [{"name": "docs", "path": "x/*.jsonl", "format": "jsonl", "bucket": "web", **source}],
        "stages": stages,
    }


def test_line_rule_names_are_checked_like_document_rule_names():
    cfg = parse_config(_config({"heuristic": {"rules_off": ["c4_lines/citation"],
                                              "languages": {"ja": {"rules_off": ["c4_lines/too_few_words"]}}}},
                               rules_off=list(LINE_RULES)))
    assert cfg.sources[0].rules_off == list(LINE_RULES)
    for stages, source, where, name in (
        ({}, {"rules_off": ["c4_lines/too_few_word"]}, "sources[0].rules_off", "c4_lines/too_few_word"),
        ({"heuristic": {"rules_off": ["c4_lines/whitespaces"]}}, {}, "stages.heuristic: rules_off",
         "c4_lines/whitespaces"),
        ({"heuristic": {"languages": {"ja": {"rules_off": ["c4_line/citation"]}}}}, {}, "languages.ja.rules_off",
         "c4_line/citation"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config(_config(stages, **source))
        message = str(err.value)
        assert where in message and f"unknown rule(s) ['{name}']" in message
        assert all(f"'{rule}'" in message for rule in LINE_RULES), "the valid names are listed"
    with pytest.raises(ValueError, match=r"rules_off: unknown rule\(s\) \['c4_lines/javascrpt'\]"):
        HeuristicFilter(HeuristicConfig(), ["c4_lines/javascrpt"])


# ---- the funnel ------------------------------------------------------------------------------------


def test_refinery_funnel_and_funnel_report_show_dropped_and_rewritten_bytes(tmp_path, capsys):
    root = LocalDataRoot(tmp_path / "out")
    heuristic = _run()
    pii = PiiRedactor().run(heuristic.documents.with_columns(
        pl.Series("text", ["Write to anna.schmidt@example.de for the file.", *heuristic.documents["text"][1:]])))
    pii.stats.stage = "pii_redacted"
    for stats in (heuristic.stats, pii.stats):
        root.write_json(f"stats/{stats.stage}/docs-0.json", stats.to_dict())
    config = write_funnel_config(tmp_path)

    assert main(["funnel", "--config", config, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    stages = {row["stage"]: row for row in report["stages"]}
    heuristic_row = stages["heuristic_filtered"]
    assert (heuristic_row["bytes_dropped"], heuristic_row["bytes_rewritten"]) == (634, 159)
    assert stages["pii_redacted"]["bytes_dropped"] == 0
    assert stages["pii_redacted"]["bytes_rewritten"] == 16  # anna.schmidt@example.de for <EMAIL>
    bucket = report["buckets"]["web"]["stages"]["heuristic_filtered"]
    assert (bucket["bytes_dropped"], bucket["bytes_rewritten"]) == (634, 159)

    assert main(["funnel", "--config", config]) == 0
    table = capsys.readouterr().out.split("\n")
    assert table[0] == "Funnel"
    spans = [m.span() for m in re.finditer("-+", table[2])]  # the rule under the header marks the columns
    header, row = ([line[a:b].strip() for a, b in spans] for line in (table[1], table[3]))
    h = heuristic.stats
    assert dict(zip(header, row)) == {
        "stage": "heuristic_filtered", "parts": "1", "docs in": "5", "docs out": "3", "kept": "60.0%",
        "bytes in": f"{h.bytes_in / 1000:,.2f} KB", "dropped": "634.00 B", "rewritten": "159.00 B",
        "bytes out": f"{h.bytes_out / 1000:,.2f} KB", "bytes kept": f"{h.byte_retention:.1%}"}
    assert dict(zip(header, [table[4][a:b].strip() for a, b in spans]))["rewritten"] == "16.00 B"
    assert table[5].startswith("dropped: bytes of the documents a stage removed; rewritten: bytes it cut from the "
                               "documents it kept")

    # the funnel_report asset's metadata is this report and this table
    totals = {"heuristic_filtered": StageTotals(heuristic.stats, 1), "pii_redacted": StageTotals(pii.stats, 1)}
    built = build_report(totals, 1_000, (4.0, "as given"))
    assert [(row["bytes_dropped"], row["bytes_rewritten"]) for row in built["stages"]] == [(634, 159), (0, 16)]
    assert format_report(built).split("\n")[3] == table[3]
