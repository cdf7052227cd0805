"""Schedule variants and anneal branches (refinery/ablations/schedules.py, schedule_runs.py,
training/schedule_run.py): the tables derived from the curriculum, their preflight, and proxy runs
of them on a two-bucket funnel variant: iid against the curriculum, an anneal branch from the
curriculum's pre-anneal checkpoint, killed and resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.kill_hook import kill_at_step_env
from helpers.schedule_runs import BUDGET, WINDOW, copy_folder, schedule_folder, train, with_schedules
from orchestration.cli import main
from refinery.ablations.schedule_runs import prepare_run, run_config
from refinery.ablations.schedules import (ANNEAL, SCHEDULE, anneal_phases, check_fill, curriculum_phases, funnel_demand,
                                         schedule_of, variant_phases)
from refinery.config import ConfigError, load_config
from refinery.storage import LocalDataRoot, sha256_file
from training.phase_runs import phase_run_dir, resume_argument
from training.proxy_run import trained_model
from training.status import read_status
from training.schedule_run import pre_anneal_checkpoint

REPO = Path(__file__).resolve().parents[1]


def served(vcfg) -> dict[str, int]:
    """Tokens served per bucket over every phase of a finished run, from its last phase's status."""
    status = read_status(phase_run_dir(vcfg, vcfg.curriculum.phases[-1].name))
    totals: dict[str, int] = {}
    for buckets in status["summary"].values():
        for bucket, acc in buckets.items():
            totals[bucket] = totals.get(bucket, 0) + int(acc["tokens"])
    return totals


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A folder whose curriculum and iid schedules are trained for seed 0."""
    folder = tmp_path_factory.mktemp("schedules")
    cfg = load_config(schedule_folder(folder))
    assert train(cfg, SCHEDULE, "curriculum") == 0 and train(cfg, SCHEDULE, "iid") == 0
    return folder, cfg


def test_the_tables_keep_the_budget_and_scale_seq_len_to_the_proxy_window(tmp_path):
    cfg = load_config(schedule_folder(tmp_path))
    cur = curriculum_phases(cfg, BUDGET)
    assert [(p.name, p.tokens, p.seq_len) for p in cur] == [
        ("warmup", 256, 16), ("main", 1280, 16), ("reasoning", 640, 32), ("anneal", 384, 32)]
    for name in cfg.ablations.schedules:
        phases = variant_phases(cfg, name, BUDGET)
        assert sum(p.tokens for p in phases) == BUDGET and all(p.tokens % (2 * WINDOW) == 0 for p in phases)
    no_anneal = variant_phases(cfg, "no_anneal", BUDGET)
    assert no_anneal[-1].weights == cur[1].weights and no_anneal[-1].tokens == cur[-1].tokens
    assert [p.seq_len for p in variant_phases(cfg, "no_length_warmup", BUDGET)] == [32] * 4
    assert variant_phases(cfg, "web_anneal", BUDGET)[-1].weights == {"web": 0.6, "docs": 0.4}
    iid = variant_phases(cfg, "iid", BUDGET)
    assert len({tuple(sorted(p.weights.items())) for p in iid}) == 1 and {p.seq_len for p in iid} == {WINDOW}
    assert [p.tokens for p in iid] == [BUDGET - cur[-1].tokens, cur[-1].tokens]  # the LR decays where anneal starts
    planned_cur, planned_iid = schedule_of(cfg, cur).bucket_tokens(), schedule_of(cfg, iid).bucket_tokens()
    assert planned_iid == pytest.approx(planned_cur)


def test_iid_serves_every_bucket_the_curriculums_tokens_within_one_row_in_one_mixture(trained):
    folder, cfg = trained
    root = LocalDataRoot(folder / "main")
    cur, iid = (served(run_config(root, cfg, SCHEDULE, name, 0)) for name in ("curriculum", "iid"))
    assert cur.keys() == iid.keys() == {"web", "docs"} and sum(cur.values()) == sum(iid.values()) == BUDGET
    assert all(abs(cur[b] - iid[b]) <= WINDOW for b in cur), (cur, iid)
    # the curriculum's mixture moves (warmup web-heavy, anneal docs-heavy); iid's does not
    status = read_status(phase_run_dir(run_config(root, cfg, SCHEDULE, "curriculum", 0), "s_curriculum__anneal"))
    shares = {p: b["docs"]["tokens"] / sum(a["tokens"] for a in b.values()) for p, b in status["summary"].items()}
    assert shares["s_curriculum__warmup"] < 0.2 < 0.7 < shares["s_curriculum__anneal"]


def test_an_anneal_branch_starts_from_the_pre_anneal_checkpoint_and_never_rewrites_it(trained, tmp_path):
    folder, _ = trained
    cfg = load_config(copy_folder(folder, tmp_path / "copy"))
    root = LocalDataRoot(tmp_path / "copy" / "main")
    curriculum = run_config(root, cfg, SCHEDULE, "curriculum", 0)
    start = pre_anneal_checkpoint(curriculum)
    base = phase_run_dir(curriculum, "s_curriculum__warmup").parent
    before = {p: sha256_file(p) for p in base.rglob("*") if p.is_file()}
    stamp = start.stat().st_mtime_ns
    assert train(cfg, ANNEAL, "docs_only") == 0
    branch = run_config(root, cfg, ANNEAL, "docs_only", 0)
    assert resume_argument(branch, "a_docs_only__anneal") == "auto"  # it has checkpoints of its own now
    after = {p: sha256_file(p) for p in base.rglob("*") if p.is_file()}
    assert {p: h for p, h in after.items() if p in before} == before and start.stat().st_mtime_ns == stamp
    own = phase_run_dir(branch, "a_docs_only__anneal")
    assert all(p.is_relative_to(own) for p in set(after) - set(before))
    results = json.loads((root.root / "ablations/results/anneal.docs_only/seed-0.json").read_text())
    assert results["start_checkpoint_sha256"] == sha256_file(start)
    steps = [json.loads(line)["step"] for line in (own / "metrics.jsonl").read_text().splitlines()]
    boundary = int(start.stem.split("-")[1])
    assert steps == list(range(boundary + 1, boundary + 7))  # only the anneal phase: 384 tokens of 64
    status = read_status(own)
    assert set(status["summary"]["a_docs_only__anneal"]) == {"docs"}  # the mixture trained is the branch's
    # a finished branch is not trained again
    metrics = (own / "metrics.jsonl").read_bytes()
    assert train(cfg, ANNEAL, "docs_only") == 0 and (own / "metrics.jsonl").read_bytes() == metrics


def test_a_sigkilled_anneal_branch_resumes_to_the_uninterrupted_ones_model(trained, tmp_path):
    folder, _ = trained
    whole = load_config(copy_folder(folder, tmp_path / "whole"))
    assert train(whole, ANNEAL, "even") == 0
    path = copy_folder(folder, tmp_path / "killed")
    killed = load_config(path)
    root = LocalDataRoot(tmp_path / "killed" / "main")
    prepare_run(root, killed, ANNEAL, "even")
    branch = run_config(root, killed, ANNEAL, "even", 0)
    start = pre_anneal_checkpoint(branch)
    boundary = int(start.stem.split("-")[1])
    env = {**os.environ, **kill_at_step_env(boundary + 4), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    child = subprocess.run([sys.executable, "-m", "training.schedule_run", "--config", str(path), "--kind", "anneal",
                            "--name", "even", "--seed", "0", "--phase", "a_even__anneal", "--resume", str(start)],
                           env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr
    own = phase_run_dir(branch, "a_even__anneal")
    assert not (root.root / "ablations/results/anneal.even").exists()
    assert resume_argument(branch, "a_even__anneal") == "auto"  # its own checkpoint, not the curriculum's again
    assert train(killed, ANNEAL, "even") == 0
    steps = [json.loads(line)["step"] for line in (own / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(boundary + 1, boundary + 7))
    uninterrupted = run_config(LocalDataRoot(tmp_path / "whole" / "main"), whole, ANNEAL, "even", 0)
    assert trained_model(branch)[1] == trained_model(uninterrupted)[1]
    ours = json.loads((root.root / "ablations/results/anneal.even/seed-0.json").read_text())
    theirs = json.loads((tmp_path / "whole/main/ablations/results/anneal.even/seed-0.json").read_text())
    assert ours == theirs


def test_a_table_the_funnel_variant_cannot_fill_is_refused_naming_the_variant_and_bucket(tmp_path):
    cfg = load_config(schedule_folder(tmp_path))
    froot = LocalDataRoot(tmp_path / "main/ablations/variants/funnel")
    summary = froot.read_json("summary.json")
    stored = {**summary["stored"], "bucket_tokens": {**summary["stored"]["bucket_tokens"], "docs": 600}}
    froot.write_json("summary.json", {**summary, "stored": stored})
    with pytest.raises(ConfigError, match=r"ablations.schedules.curriculum: plans 1,0\d\d tokens of bucket 'docs'"):
        prepare_run(LocalDataRoot(tmp_path / "main"), cfg, SCHEDULE, "curriculum")
    assert not froot.exists("manifests/s_curriculum__warmup.json")


def test_the_funnel_variant_is_bounded_by_what_every_schedule_and_anneal_mixture_reads(tmp_path):
    """funnel_demand is, per bucket, the most any declared table plans plus check_fill's slack, so a
    funnel variant that stores it fills every one, a docs-only anneal included; a row less of a
    bucket is refused."""
    path = with_schedules(tmp_path, {"curriculum": {}, "iid": {}, "no_anneal": {}, "no_length_warmup": {}},
                          {"mixtures": {"wiki_only": {"wiki": 1.0}, "web": {"web": 1.0}}})
    cfg = load_config(path)
    budget = 64 * cfg.ablations.micro_batch_size * cfg.ablations.seq_len
    demand = funnel_demand(cfg, budget)
    tables = {("schedule", n): variant_phases(cfg, n, budget) for n in cfg.ablations.schedules}
    tables |= {("anneal", m): anneal_phases(cfg, m, budget) for m in ("wiki_only", "web")}
    for (kind, name), phases in tables.items():
        check_fill(cfg, kind, name, phases, demand)
    wiki_only = tables[("anneal", "wiki_only")]
    assert demand["wiki"] == max(
        int(-(-schedule_of(cfg, t).bucket_tokens().get("wiki", 0) // 1)) + len(t) * max(p.seq_len for p in t)
        for t in tables.values() if schedule_of(cfg, t).bucket_tokens().get("wiki", 0) > 0)
    with pytest.raises(ConfigError, match="ablations.anneal_search.mixtures.wiki_only: plans"):
        check_fill(cfg, "anneal", "wiki_only", wiki_only, {**demand, "wiki": demand["wiki"] - 1})


def test_the_issue_schedules_pass_the_preflight(tmp_path):
    path = with_schedules(tmp_path, {"curriculum": {}, "iid": {}, "no_anneal": {}, "no_length_warmup": {},
                                     "math_anneal": {"base": "curriculum", "phases": {"anneal": {"weights": {
                                         "web": 0.1, "code": 0.2, "math": 0.5, "books": 0.1, "wiki": 0.1}}}}},
                          {"mixtures": {"code_math": {"code": 0.5, "math": 0.5}, "web": {"web": 1.0}}})
    assert main(["validate", "--config", str(path)]) == 0


@pytest.mark.parametrize("schedules, anneal, field", [
    ({"curriculum": {}, "late": {"base": "curriculum", "phases": {"cooldown": {"lr_scale": 0.5}}}}, None,
     "ablations.schedules.late.phases.cooldown: no phase 'cooldown'"),
    ({"curriculum": {}, "fish": {"base": "curriculum", "phases": {"anneal": {"weights": {"web": 0.5, "fish": 0.5}}}}},
     None, "ablations.schedules.fish.phases.anneal.weights.fish: unknown bucket 'fish'"),
    ({"curriculum": {}, "short": {"base": "curriculum", "phases": {"anneal": {"weights": {"web": 0.5, "math": 0.4}}}}},
     None, "ablations.schedules.short.phases.anneal.weights: the weights sum to 0.9, not 1"),
    ({"curriculum": {}, "iid": {"phases": {"anneal": {"lr_scale": 0.5}}}}, None,
     "ablations.schedules.iid.phases.anneal: no phase 'anneal' in the iid table"),
    ({"curriculum": {}, "mine": {}}, None, "ablations.schedules.mine.base: 'mine' is no built-in schedule"),
    ({"curriculum": {}}, {"mixtures": {"fishy": {"fish": 1.0}}},
     "ablations.anneal_search.mixtures.fishy.fish: unknown bucket 'fish'"),
    ({"iid": {}}, {"mixtures": {"web": {"web": 1.0}}},
     "ablations.anneal_search: every mixture branches from the `curriculum` schedule run"),
    ({"curriculum": {}, "long": {"base": "curriculum", "phases": {"main": {"seq_len": 1024}}}}, None,
     "ablations.schedules.long.phases.main.seq_len: 1024 is longer than the curriculum's longest phase (512)"),
])
def test_a_schedule_naming_an_unknown_phase_or_bucket_exits_2_naming_the_field(tmp_path, capsys, schedules, anneal,
                                                                               field):
    assert main(["validate", "--config", str(with_schedules(tmp_path, schedules, anneal))]) == 2
    assert field in capsys.readouterr().err


def test_the_assets_train_a_schedule_and_a_branch_through_pipes_and_plot_their_curves(trained, tmp_path):
    import dagster as dg

    from assets import ablation_schedules
    from helpers.materialize import materialize, module_assets

    folder, _ = trained
    path = copy_folder(folder, tmp_path / "assets")
    assets = module_assets(ablation_schedules, path)
    assert set(assets) == {"ablation_schedule_runs", "ablation_anneal_runs", "ablation_schedule_report"}
    run = materialize([assets["ablation_schedule_runs"]], path, dg.MultiPartitionKey({"schedule": "no_anneal", "seed": "1"}))
    meta = run.asset_materializations_for_node("ablation_schedule_runs")[0].metadata
    stored = json.loads((tmp_path / "assets/main/ablations/results/schedule.no_anneal/seed-1.json").read_text())
    assert meta["bpb"].value == pytest.approx(stored["bpb"], abs=1e-6) and stored["tokens_trained"] == BUDGET
    assert "s_no_anneal__anneal" in meta["phases"].value
    branch = materialize([assets["ablation_anneal_runs"]], path, dg.MultiPartitionKey({"mixture": "even", "seed": "0"}))
    meta = branch.asset_materializations_for_node("ablation_anneal_runs")[0].metadata
    assert meta["share_of_run"].value == pytest.approx(384 / BUDGET)
    report = materialize([assets["ablation_schedule_report"]], path)
    meta = report.asset_materializations_for_node("ablation_schedule_report")[0].metadata
    assert set(meta["runs"].value) == {"schedule.curriculum", "schedule.iid", "anneal.even"}  # seed 0
    assert (tmp_path / "assets/main/ablations/schedule_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_the_schedule_report_judges_against_the_curriculum_and_states_mixture_and_compute(trained):
    from refinery.ablations.schedule_report import format_schedule_report, schedule_report

    folder, cfg = trained
    report = schedule_report(LocalDataRoot(folder / "main"), cfg)
    assert report["baseline"] == "schedule.curriculum"
    assert set(report["variants"]) >= {"schedule.curriculum", "schedule.iid"}
    rows = {(r["variant"], r["domain"]): r for r in report["domains"]}
    assert rows[("schedule.curriculum", "all")]["verdict"] == "baseline"
    assert rows[("schedule.iid", "all")]["verdict"] == "n/a: one seed"  # one seed trained
    cur, iid = report["variants"]["schedule.curriculum"], report["variants"]["schedule.iid"]
    assert cur["tokens"] == iid["tokens"] == BUDGET and cur["weights"] == pytest.approx(iid["weights"])
    # the same tokens, iid at the full window: the attention term makes it dearer
    n_layer, d = 1, 32
    assert cur["token_flops"] == 6 * 12 * n_layer * d**2 * BUDGET + 6 * n_layer * d * (1536 * 16 + 1024 * 32)
    assert iid["token_flops"] > cur["token_flops"] and cur["mean_seq_len"] == pytest.approx(22.4)
    text = format_schedule_report(report)
    assert "schedule.iid" in text and "token-FLOPs" in text and "vs curriculum" in text
