"""configs/demo.yaml with an `ablations` section (issue 47): `refinery demo` materializes the main
graph first, training included and not refused, then the ablation assets, and exits 0 with the
report's verdict rows stored. A budget the demo's data cannot fill, asked for afterwards, plans
only the ablation assets and fails their first step (exit 4) naming `ablations.tokens` and the
largest budget that fits; the main graph's runs and the stored report are left as they were."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from helpers.configs import demo_config, write_config
from orchestration.cli import main as refinery
from refinery.ablations.report import REPORT_KEY
from refinery.config import load_config
from refinery.storage import LocalDataRoot
from training.phase_runs import phase_names, phase_run_dir
from training.status import read_status

# Small enough to add about two minutes to the demo on a 2-core machine: two variants, two seeds
# (the fewest a verdict needs), 40 optimizer steps of a one-layer model 32 wide.
SECTION = {"variants": {"funnel": {}, "raw": {"base": "raw"}}, "seeds": 2, "seq_len": 64, "micro_batch_size": 4,
           "tokens": 40 * 4 * 64, "warmup_steps": 4, "model": {"n_layer": 1, "n_head": 2, "n_embd": 32}}
VERDICTS = {"better", "worse", "within noise"}


def trained_phases(cfg) -> dict[str, str]:
    """Phase -> the state its run's status records."""
    return {phase: (read_status(phase_run_dir(cfg, phase)) or {}).get("state", "none") for phase in phase_names(cfg)}


@pytest.mark.slow
def test_the_demo_with_an_ablations_section_exits_0_trained_and_with_verdicts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    data = demo_config(tmp_path / "out")
    config = write_config(tmp_path, {**data, "ablations": SECTION})

    assert refinery(["demo", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    steps = [line.split(":")[0].strip() for line in out.split("\n") if " partition(s) in " in line]
    # the main graph's training ran before any ablation asset, and was not refused
    assert steps.index("training_run") < steps.index("ablation_variants") < steps.index("ablation_runs")
    cfg = load_config(config)
    assert trained_phases(cfg) == {"warmup": "completed", "main": "completed", "reasoning": "completed",
                                   "anneal": "completed"}
    assert "state: completed at step" in out and "refused" not in out

    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    report = root.read_json(REPORT_KEY)
    assert report["baseline"] == "funnel" and report["kept_languages"] == ["en"]
    rows = {(r["variant"], r["domain"]): r for r in report["domains"]}
    # raw against the funnel on every evaluation domain: each bucket the demo feeds, and its eval set
    domains = {"all", "web", "code", "math", "books", "wiki", "demo_eval"}
    assert {d for v, d in rows if v == "raw"} >= domains
    for domain in domains:
        row = rows[("raw", domain)]
        assert row["seeds"] == 2 and row["verdict"] in VERDICTS and row["interval"] is not None, row
        # the paired figure: the mean over seeds of raw's minus the funnel's
        funnel = rows[("funnel", domain)]["bpb_by_seed"]
        assert row["diff"] == pytest.approx(sum(row["bpb_by_seed"][s] - funnel[s] for s in ("0", "1")) / 2, abs=1e-9)
    assert rows[("funnel", "all")]["verdict"] == "baseline"
    status = {p: (phase_run_dir(cfg, p) / "status.json").read_bytes() for p in phase_names(cfg)}

    # A budget the data cannot fill: only the ablation assets are planned, and their first step fails
    # naming the field (what a variant can fill is known only once the variants are selected).
    config = write_config(tmp_path, {**data, "ablations": {**SECTION, "tokens": 4 * 64 * 100_000}})
    assert refinery(["demo", "--config", str(config), "--changed"]) == 4
    captured = capsys.readouterr()
    assert "ablations.tokens: 25,600,000 tokens, more than variant(s) can fill" in captured.err
    assert "lower ablations.tokens to at most" in captured.err
    plan = captured.out.split("Will materialize", 1)[1].split("\n")[1:]
    planned = [line.split(":")[0].strip() for line in itertools.takewhile(lambda line: line.startswith("  "), plan)]
    assert planned == ["ablation_variants", "ablation_runs", "ablation_report"]
    assert {p: (phase_run_dir(cfg, p) / "status.json").read_bytes() for p in phase_names(cfg)} == status
    assert json.loads((root.root / REPORT_KEY).read_text()) == report
