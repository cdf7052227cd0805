"""The ablation assets (assets/ablations.py) on a crafted verdict corpus: partitions from the
config, a variant built, a proxy run launched through Pipes as training_run launches, the report
with its table and plot, and `refinery ablations` printing the table from the stored results."""

from __future__ import annotations

import json
import math

import dagster as dg
import pytest
import yaml

from assets import ablations
from assets.partitions import Partitions
from assets.provenance import MARKDOWN_INLINE_CHARS
from helpers.kill_hook import kill_at_step_env
from helpers.materialize import materialize, module_assets
from helpers.verdict_corpus import write_verdict_corpus
from orchestration.cli import main
from orchestration.definitions import build_definitions as build_workspace
from refinery.ablations import build
from refinery.ablations.report import REPORT_KEY, results_key
from refinery.config import load_config
from training.proxy_run import main as proxy_main
from training.proxy_run import run_proxy

VARIANTS = {"funnel": {}, "raw": {"base": "raw"}, "no_heuristic": {"without": ["heuristic"]}}
PROXY = {"seeds": 2, "tokens": 2048, "model": {"n_layer": 1, "n_head": 2, "n_embd": 32}}


def test_the_partitions_come_from_the_config(tmp_path):
    c = write_verdict_corpus(tmp_path, variants=VARIANTS, **PROXY)
    assets = module_assets(ablations, c.config_path)
    assert sorted(assets) == ["ablation_report", "ablation_runs", "ablation_variants"]
    keys = assets["ablation_variants"].partitions_def.get_partition_keys()
    assert keys == list(c.cfg.ablations.variants) and sorted(keys) == sorted(VARIANTS)
    runs = assets["ablation_runs"].partitions_def
    assert sorted((k.keys_by_dimension["variant"], k.keys_by_dimension["seed"]) for k in runs.get_partition_keys()) == \
        sorted((v, s) for v in VARIANTS for s in ("0", "1"))
    assert assets["ablation_report"].partitions_def is None
    workspace = build_workspace(str(c.config_path)).resolve_asset_graph()  # CONFIG_READ covers them
    assert {"ablation_variants", "ablation_runs", "ablation_report"} <= {
        k.to_user_string() for k in workspace.materializable_asset_keys}
    data = yaml.safe_load(c.config_path.read_text())
    del data["ablations"]
    c.config_path.write_text(yaml.safe_dump(data))
    cfg = load_config(c.config_path)
    assert not ablations.build_definitions(cfg, Partitions.from_config(cfg)).assets


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Both variants built by the asset; their four proxy runs in process (what the asset's Pipes
    child runs), then the report."""
    c = write_verdict_corpus(tmp_path_factory.mktemp("assets"), variants={"funnel": {}, "raw": {"base": "raw"}}, **PROXY)
    assets = module_assets(ablations, c.config_path)
    built = {v: materialize([assets["ablation_variants"]], c.config_path, v) for v in ("funnel", "raw")}
    for variant, seed in (("funnel", 0), ("funnel", 1), ("raw", 0), ("raw", 1)):
        assert run_proxy(c.cfg, variant, seed) == 0
    report = materialize([assets["ablation_report"]], c.config_path)
    return c, assets, built, report


def metadata(result, name):
    return result.asset_materializations_for_node(name)[0].metadata


def test_a_variant_records_its_counts_and_hashes(ran):
    c, _, built, _ = ran
    meta = metadata(built["raw"], "ablation_variants")
    summary = meta["summary"].value
    # raw: every page but the held-out ones' copies, which share a 13-gram with the evaluation set
    assert meta["documents"].value == summary["documents"] and 0.85 < summary["raw_byte_share"] < 1.0
    assert meta["stored_documents"].value == summary["stored"]["documents"] <= summary["documents"]
    assert meta["budget_tokens"].value == metadata(built["funnel"], "ablation_variants")["budget_tokens"].value
    assert set(meta["content_hashes"].value) == {"ablations/variants/raw/summary.json",
                                                  "ablations/variants/raw/manifests/ablation.json",
                                                  "ablations/eval/documents.parquet"}
    for key in ("docs_out", "bytes_out", "wall_s", "config", "code_version"):
        assert key in meta, key


def test_the_report_carries_the_table_and_the_plot(ran):
    c, _, _, report = ran
    meta = metadata(report, "ablation_report")
    assert meta["runs"].value == 4 and meta["runs_missing"].value == 0
    assert meta["plot"].value.startswith("![bits per byte per variant and domain](")
    table = meta["table"].value
    assert table.splitlines()[0].startswith("| variant | domain | bpb | spread |")
    assert [line.split(" | ")[:2] for line in table.splitlines()[2:]] == [["| funnel", "all"], ["| raw", "all"]]
    assert len(table) < MARKDOWN_INLINE_CHARS  # drawn in place, as the plot is
    by_domain = meta["table_by_domain"].value.splitlines()
    # every bucket a domain; `not kept`: the held-out pages in a language the config does not keep
    assert {line.split(" | ")[1] for line in by_domain[2:]} == {"all", "web", "wiki", "bench", "extra", "not kept"}
    assert c.root.read_json(REPORT_KEY) == meta["report"].value


def test_the_command_prints_the_table_from_the_stored_results(ran, capsys):
    c, _, _, _ = ran
    assert main(["ablations", "--config", str(c.config_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    def kept_bpb(seed: int) -> float:  # `all` pools the documents in a kept language
        docs = c.root.read_json(results_key("raw", seed))["documents"]
        kept = [i for i, k in enumerate(docs["kept"]) if k]
        return sum(docs["nats"][i] for i in kept) / math.log(2) / sum(docs["bytes"][i] for i in kept)

    raw = next(line for line in lines if line.split()[:2] == ["raw", "all"])
    assert raw.split()[:3] == ["raw", "all", f"{(kept_bpb(0) + kept_bpb(1)) / 2:.4f}"]
    assert raw.split()[4] == "2" and ("better" in raw or "worse" in raw or "within noise" in raw)
    assert any(line.split()[:2] == ["funnel", "all"] and "baseline" in line for line in lines)
    assert main(["ablations", "--config", str(c.config_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == c.root.read_json(REPORT_KEY)


@pytest.mark.slow
def test_a_run_through_the_asset_is_the_proxy_run_and_says_what_it_stored(ran):
    """The partition launched as training_run launches (a Pipes subprocess, relaunch loop) trains
    and scores exactly what the in-process run did."""
    c, assets, _, _ = ran
    key = results_key("raw", 1)
    before = c.root.read_bytes(key)
    c.root.delete("ablations/variants/raw/runs/seed-1")
    c.root.delete(key)
    run = materialize([assets["ablation_runs"]], c.config_path, dg.MultiPartitionKey({"variant": "raw", "seed": "1"}))
    assert c.root.read_bytes(key) == before
    meta = metadata(run, "ablation_runs")
    stored = json.loads(before)
    assert meta["bpb"].value == round(stored["bpb"], 6) and meta["state"].value == "completed"
    assert meta["tokens_trained"].value == stored["tokens_trained"] == 2048 and meta["launch_attempts"].value == 1
    assert set(meta["bpb_by_domain"].value) == {"web", "wiki", "bench", "extra"} == {c["domain"] for c in stored["cells"]}
    assert meta["content_hashes"].value == {key: c.root.sha256(key)}
    assert "loss_plot" in meta and meta["model_sha256"].value == stored["model_sha256"]


def test_the_command_says_what_to_run_first(tmp_path, capsys):
    c = write_verdict_corpus(tmp_path, variants={"funnel": {}}, **PROXY)
    assert main(["ablations", "--config", str(c.config_path)]) == 1
    assert "materialize ablation_runs" in capsys.readouterr().err
    data = yaml.safe_load(c.config_path.read_text())
    del data["ablations"]
    c.config_path.write_text(yaml.safe_dump(data))
    assert main(["ablations", "--config", str(c.config_path)]) == 2
    assert "has no `ablations` section" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_on_a_ray_node_killed_midway_is_relaunched_to_the_same_figures(tmp_path, monkeypatch, ray_cluster):
    """With `training.launch: ray` the proxy run goes to a node of the cluster as training_run's
    trainer does; SIGKILLed after a checkpoint, it is relaunched from it and ends with the figures of
    an uninterrupted run in process."""
    c = write_verdict_corpus(tmp_path, variants={"funnel": {}}, **PROXY)
    data = yaml.safe_load(c.config_path.read_text())
    data["training"] = {"launch": "ray", "resume_backoff_s": 0.01, "checkpoint_interval": 8}
    data["execution"] = {"address": ray_cluster.address}
    c.config_path.write_text(yaml.safe_dump(data))
    cfg = load_config(c.config_path)
    build.build_variant(c.root, cfg, "funnel")
    assert run_proxy(cfg, "funnel", 1) == 0  # the reference, uninterrupted, in process
    reference = c.root.read_json(results_key("funnel", 1))
    c.root.delete(results_key("funnel", 1))
    c.root.delete("ablations/variants/funnel/runs/seed-1")
    for name, value in kill_at_step_env(16).items():  # REFINERY_* settings travel with the launch
        monkeypatch.setenv(name, value)
    run = materialize([module_assets(ablations, c.config_path)["ablation_runs"]], c.config_path,
                      dg.MultiPartitionKey({"variant": "funnel", "seed": "1"}))
    meta = metadata(run, "ablation_runs")
    assert [a["exit_code"] for a in meta["attempts"].value] == [-9, 0] and "ray_nodes" in meta
    assert c.root.read_json(results_key("funnel", 1)) == reference


def test_a_proxy_run_of_a_variant_not_built_exits_2_naming_it(tmp_path, capsys):
    c = write_verdict_corpus(tmp_path, variants={"funnel": {}}, **PROXY)
    assert proxy_main(["--config", str(c.config_path), "--variant", "funnel", "--seed", "0"]) == 2
    assert "ablations.variants.funnel: not built yet" in capsys.readouterr().err
