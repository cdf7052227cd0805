"""The ablation report (refinery/ablations/report.py): Welch verdicts from seeds on constructed
results, the table and the plot, and `refinery ablations` over stored results."""

from __future__ import annotations

import math

import pytest

from refinery.ablations.report import (ONE_SEED, build_report, format_report, markdown_table, report_png,
                                       t_two_sided_p, verdict)


def result(variant: str, seed: int, bpb: dict[tuple[str, str], float], bytes_per_cell: int = 1000) -> dict:
    """A stored run's results whose cell (domain, language) scores `bpb` over `bytes_per_cell` bytes."""
    return {"variant": variant, "seed": seed, "cells": [
        {"domain": d, "language": lang, "documents": 2, "tokens": 300, "bytes": bytes_per_cell,
         "nats": value * bytes_per_cell * math.log(2)} for (d, lang), value in bpb.items()]}


@pytest.mark.parametrize("t, df", [(12.7062, 1), (4.302653, 2), (2.776445, 4), (2.228139, 10), (1.959964, 1e7)])
def test_the_t_test_p_value_matches_the_t_table_at_its_95_percent_points(t, df):
    assert t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-6)


def test_verdicts_come_from_the_seeds():
    funnel = [1.500, 1.502, 1.498]
    assert verdict([1.400, 1.402, 1.398], funnel)[2] == "better"
    assert verdict([1.600, 1.605, 1.597], funnel)[2] == "worse"
    diff, p, call = verdict([1.49, 1.52, 1.50], funnel)  # the seeds overlap
    assert call == "within noise" and p > 0.05 and diff == pytest.approx(0.0033333, abs=1e-6)
    assert verdict([1.2], funnel) == (pytest.approx(-0.3), None, ONE_SEED)  # never a call from one run
    assert verdict([1.2, 1.21], [1.5])[2] == ONE_SEED
    assert verdict([1.4, 1.4], [1.5, 1.5])[2] == "better"  # no spread on either side: the difference decides
    assert verdict([1.5, 1.5], [1.5, 1.5])[2] == "within noise"


def constructed() -> list[dict]:
    rows = []
    for seed, noise in enumerate((0.0, 0.004, -0.004)):
        rows.append(result("funnel", seed, {("docs", "en"): 1.50 + noise, ("docs", "de"): 1.70 + noise,
                                             ("web", "en"): 2.00 + noise}))
        rows.append(result("raw", seed, {("docs", "en"): 1.60 + noise, ("docs", "de"): 1.80 + noise,
                                          ("web", "en"): 1.90 + noise}))
        rows.append(result("no_dedup", seed, {("docs", "en"): 1.50 - noise, ("docs", "de"): 1.70 + 2 * noise,
                                               ("web", "en"): 2.00 + noise}))
    rows.append(result("top_half", 0, {("docs", "en"): 1.3, ("docs", "de"): 1.5, ("web", "en"): 1.8}))
    return rows


COUNTS = {"funnel": {"documents": 1200, "tokens": 50000, "raw_byte_share": 0.41, "budget_tokens": 40960},
          "raw": {"documents": 3000, "tokens": 50000, "raw_byte_share": 1.0},
          "no_dedup": {"documents": 1500, "tokens": 50000, "raw_byte_share": 0.52},
          "top_half": {"documents": 600, "tokens": 50000, "raw_byte_share": 0.2}}


def test_the_report_has_a_row_per_variant_and_domain_with_mean_spread_and_verdict():
    report = build_report(constructed(), COUNTS)
    rows = {(r["variant"], r["domain"]): r for r in report["domains"]}
    assert [(r["variant"], r["domain"]) for r in report["domains"][:3]] == [
        ("funnel", "all"), ("funnel", "docs"), ("funnel", "web")]
    docs = rows[("raw", "docs")]
    # docs = en and de together, bits over bytes: (1.6 + 1.8) / 2 on seed 0
    assert docs["bpb_by_seed"]["0"] == pytest.approx(1.7) and docs["bpb"] == pytest.approx(1.7)
    assert docs["spread"] == pytest.approx(0.004) and docs["seeds"] == 3
    assert docs["diff"] == pytest.approx(0.1) and docs["verdict"] == "worse"
    assert rows[("raw", "web")]["verdict"] == "better"
    assert rows[("no_dedup", "web")]["verdict"] == "within noise"  # the same figures as funnel
    assert rows[("top_half", "docs")]["verdict"] == ONE_SEED and rows[("top_half", "docs")]["spread"] is None
    assert rows[("funnel", "all")]["verdict"] == "baseline"
    languages = {(r["variant"], r["language"]): r for r in report["languages"]}
    assert languages[("raw", "de")]["bpb"] == pytest.approx(1.8) and languages[("raw", "de")]["verdict"] == "worse"
    assert report["variants"]["top_half"]["seeds"] == [0]


def test_the_table_prints_every_variant_with_its_counts_and_calls():
    report = build_report(constructed(), COUNTS)
    text = format_report(report)
    lines = text.splitlines()
    assert "Every proxy run trains 40,960 tokens" in lines[1]
    raw = next(line for line in lines if line.startswith("raw "))
    assert raw.split()[:5] == ["raw", "all", "1.7667", "0.0040", "3"]
    assert "50,000" in raw and "3,000" in raw and "100.0%" in raw and "worse (p=" in raw
    assert any(line.split()[:2] == ["top_half", "all"] and ONE_SEED in line for line in lines)
    assert any(line.split()[:3] == ["no_dedup", "de", "1.7000"] for line in lines)  # the per-language block
    table = markdown_table(report)
    assert table.count("\n") == 2 + len(report["domains"]) - 1 and "| raw | web | 1.9000 |" in table
    assert markdown_table(report, {"all"}).count("\n") == 2 + len(COUNTS) - 1
    png = report_png(report)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and report_png(report) == png


def test_a_variant_without_a_funnel_run_gets_no_verdict():
    report = build_report([result("raw", 0, {("web", "en"): 2.0}), result("raw", 1, {("web", "en"): 2.1})],
                          {"raw": {}})
    assert {r["verdict"] for r in report["domains"]} == {"n/a: no funnel run"}
