"""The ablation report (refinery/ablations/report.py, stats.py): paired verdicts from seeds with a
bootstrap interval over documents, the unpaired figure beside them, verdicts only on the languages
the config keeps, the table and the plot."""

from __future__ import annotations

import math

import numpy as np
import pytest

from refinery.ablations.report import (NOT_KEPT, OTHER_LANGUAGES, build_report, format_report, markdown_table,
                                       report_png)
from refinery.ablations.stats import (ONE_SEED, DocumentScores, bootstrap_interval, compare, paired_t, t_critical,
                                      t_two_sided_p, welch)

from helpers.ablation_report import COUNTS, result


@pytest.mark.parametrize("t, df", [(12.7062, 1), (4.302653, 2), (2.776445, 4), (2.228139, 10), (1.959964, 1e7)])
def test_the_t_test_p_value_matches_the_t_table_at_its_95_percent_points(t, df):
    assert t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-6)
    assert t_critical(0.05, df) == pytest.approx(t, rel=1e-5)


def test_the_paired_test_on_a_hand_made_case_returns_the_hand_computed_statistic():
    variant, funnel = {0: 1.40, 1: 1.43, 2: 1.41}, {0: 1.50, 1: 1.52, 2: 1.53}
    # differences -0.10, -0.09, -0.12: mean -0.103333, sd 0.0152753, se 0.0088192, t -11.717 at 2 df,
    # where P(|T| >= t) = 1 - t / sqrt(t^2 + 2) exactly
    d = [-0.10, -0.09, -0.12]
    sd = math.sqrt(sum((x - sum(d) / 3) ** 2 for x in d) / 2)
    t = (sum(d) / 3) / (sd / math.sqrt(3))
    assert t == pytest.approx(-11.717, abs=1e-3)
    c = compare(variant, funnel)
    assert c.diff == pytest.approx(-0.103333, abs=1e-6)
    assert c.p == pytest.approx(1 - abs(t) / math.sqrt(t * t + 2), rel=1e-6)
    assert c.p == pytest.approx(0.00719, abs=5e-5) and c.verdict == "better" and c.seeds == (0, 1, 2)
    assert c.detectable == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-5)
    # the same runs as independent samples stand beside it
    assert c.p_unpaired == pytest.approx(welch(list(variant.values()), list(funnel.values())).p)


def test_pairing_resolves_what_the_unpaired_test_cannot_when_the_seeds_luck_is_shared():
    luck = [0.00, 0.05, -0.04, 0.03]
    funnel = {s: 1.5 + x for s, x in enumerate(luck)}
    variant = {s: 1.49 + x + e for s, x, e in zip(range(4), luck, (0.001, -0.001, 0.0, 0.0005))}
    c = compare(variant, funnel)
    assert c.verdict == "better" and c.p < 0.01 and c.p_unpaired > 0.5
    assert c.detectable < 0.005 < 0.05 < c.detectable_unpaired


def test_a_variant_whose_seeds_are_missing_on_one_side_gets_no_verdict():
    full = {0: 1.5, 1: 1.51, 2: 1.49}
    assert compare({0: 1.2, 1: 1.21}, full).verdict == "n/a: seeds [2] missing on one side"
    assert compare({1: 1.2, 2: 1.21, 3: 1.2}, full).verdict == "n/a: seeds [0, 3] missing on one side"
    assert compare({5: 1.2, 6: 1.2}, full).p is None
    assert compare({0: 1.2}, {0: 1.5}).verdict == ONE_SEED  # never a call from one pair
    assert compare({0: 1.4, 1: 1.4}, {0: 1.5, 1: 1.5}).verdict == "better"  # no spread: the difference decides
    assert compare({0: 1.5, 1: 1.5}, {0: 1.5, 1: 1.5}).verdict == "within noise"
    assert paired_t([0.1]).p is None


def scores(nats: list[float], size: int = 100) -> DocumentScores:
    return DocumentScores(np.array(nats, dtype=np.float64), np.full(len(nats), float(size)))


def test_the_bootstrap_interval_resamples_documents_the_same_way_for_every_run():
    rng = np.random.default_rng(3)
    base = [scores(list(rng.uniform(50, 150, 40))) for _ in range(3)]
    same = bootstrap_interval(base, base)
    assert same == (0.0, 0.0)  # the same runs: every resample's difference is zero
    better = [DocumentScores(b.nats * 0.9, b.bytes) for b in base]
    lo, hi = bootstrap_interval(better, base)
    assert lo < hi < 0.0 and bootstrap_interval(better, base) == (lo, hi)
    mean_diff = np.mean([v.bpb - b.bpb for v, b in zip(better, base)])
    assert lo < mean_diff < hi
    # one document carries the whole difference: the documents do not agree, so no call
    steady = [DocumentScores(base[0].nats * (1 + 0.001 * s), base[0].bytes) for s in range(3)]
    lucky = [DocumentScores(np.concatenate([b.nats[:1] * 0.01, b.nats[1:]]), b.bytes) for b in steady]
    base = steady
    c = compare({s: r.bpb for s, r in enumerate(lucky)}, {s: r.bpb for s, r in enumerate(base)},
                ({s: r for s, r in enumerate(lucky)}, {s: r for s, r in enumerate(base)}))
    assert c.p is not None and c.p < 0.05 and c.interval[1] >= 0.0 > c.interval[0]
    assert c.verdict == "within noise" and c.detectable >= (c.interval[1] - c.interval[0]) / 2


def constructed() -> list[dict]:
    rows = []
    for seed, noise in enumerate((0.0, 0.004, -0.004)):
        rows.append(result("funnel", seed, {("docs", "en"): 1.50 + noise, ("docs", "de"): 1.70 + noise,
                                             ("web", "en"): 2.00 + noise, ("web", "fr"): 2.5 + noise}))
        rows.append(result("raw", seed, {("docs", "en"): 1.60 + noise, ("docs", "de"): 1.80 + noise,
                                          ("web", "en"): 1.90 + noise, ("web", "fr"): 1.5 + noise}))
        rows.append(result("no_dedup", seed, {("docs", "en"): 1.50 - noise, ("docs", "de"): 1.70 + 2 * noise,
                                               ("web", "en"): 2.00 + noise, ("web", "fr"): 2.5}))
    rows.append(result("top_half", 0, {("docs", "en"): 1.3, ("docs", "de"): 1.5, ("web", "en"): 1.8,
                                       ("web", "fr"): 2.5}))
    return rows


def test_the_report_has_a_row_per_variant_and_domain_with_mean_spread_and_verdict():
    report = build_report(constructed(), COUNTS)
    rows = {(r["variant"], r["domain"]): r for r in report["domains"]}
    assert [(r["variant"], r["domain"]) for r in report["domains"][:4]] == [
        ("funnel", "all"), ("funnel", "docs"), ("funnel", "web"), ("funnel", OTHER_LANGUAGES)]
    docs = rows[("raw", "docs")]
    # docs = en and de together, bits over bytes: (1.6 + 1.8) / 2 on seed 0
    assert docs["bpb_by_seed"]["0"] == pytest.approx(1.7) and docs["bpb"] == pytest.approx(1.7)
    assert docs["spread"] == pytest.approx(0.004) and docs["seeds"] == 3
    assert docs["diff"] == pytest.approx(0.1) and docs["verdict"] == "worse"
    assert docs["interval"][0] <= 0.1 <= docs["interval"][1]
    assert rows[("raw", "web")]["verdict"] == "better"
    assert rows[("no_dedup", "web")]["verdict"] == "within noise"  # the same figures as funnel
    top = rows[("top_half", "docs")]  # seed 0 alone: funnel's seeds 1 and 2 have no pair
    assert top["verdict"] == "n/a: seeds [1, 2] missing on one side" and top["spread"] is None
    assert rows[("funnel", "all")]["verdict"] == "baseline"
    languages = {(r["variant"], r["language"]): r for r in report["languages"]}
    assert languages[("raw", "de")]["bpb"] == pytest.approx(1.8) and languages[("raw", "de")]["verdict"] == "worse"
    assert report["variants"]["top_half"]["seeds"] == [0]


def test_an_evaluation_page_in_a_language_the_config_does_not_keep_gets_no_part_in_a_verdict():
    report = build_report(constructed(), COUNTS)
    assert report["kept_languages"] == ["de", "en"]
    rows = {(r["variant"], r["domain"]): r for r in report["domains"]}
    # raw is 1.0 better on the French page the funnel drops on purpose, and that moves no verdict:
    # `all` and `web` are en and de only (web: en alone, 1.90 against 2.00)
    assert rows[("raw", "web")]["diff"] == pytest.approx(-0.1)
    assert rows[("raw", "all")]["bpb"] == pytest.approx((1.6 + 1.8 + 1.9) / 3)
    other = rows[("raw", OTHER_LANGUAGES)]
    assert other["bpb"] == pytest.approx(1.5) and other["verdict"] == NOT_KEPT and other["diff"] is None
    languages = {(r["variant"], r["language"]): r for r in report["languages"]}
    assert languages[("raw", "fr")]["verdict"] == NOT_KEPT
    changed = constructed()
    for r in changed:
        if r["variant"] == "raw":  # raw's French pages now score 9 bits per byte
            docs = r["documents"]
            docs["nats"] = [n * 6 if lang == "fr" else n for n, lang in zip(docs["nats"], docs["language"])]
    again = {(r["variant"], r["domain"]): r for r in build_report(changed, COUNTS)["domains"]}
    assert again[("raw", "all")]["diff"] == pytest.approx(rows[("raw", "all")]["diff"])
    assert again[("raw", "all")]["p"] == pytest.approx(rows[("raw", "all")]["p"])


def test_the_table_prints_every_variant_with_its_counts_and_calls():
    report = build_report(constructed(), COUNTS)
    text = format_report(report)
    lines = text.splitlines()
    assert "Every proxy run trains 40,960 tokens" in lines[2]
    assert "languages the config keeps (de, en)" in lines[1]
    counts = next(line for line in lines if line.startswith("raw ") and "%" in line)
    assert counts.split()[:4] == ["raw", "50,000", "3,000", "100.0%"] and "docs 40.0%" in counts and "docs 2" in counts
    raw = next(line for line in lines if line.split()[:2] == ["raw", "all"])
    # every seed says worse (+0.0333), the documents do not (docs +0.1, web -0.1): the interval holds zero
    assert raw.split()[2:6] == ["1.7667", "0.0040", "3", "+0.0333"] and "[-0.0333, +0.1000]" in raw
    assert "within noise (p=" in raw and "p=" in raw.split("within noise")[1]
    assert any(line.split()[:2] == ["top_half", "all"] and "missing on one side" in line for line in lines)
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
