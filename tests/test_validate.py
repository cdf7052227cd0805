"""`refinery validate`: the printed contract, --json, --inventory, the schedule PNG and exit codes."""

import json

import pytest

from orchestration.cli import main
from refinery.storage import LocalDataRoot

from helpers.configs import demo_config, write_config
from helpers.final_shards import DOCS_PER_BUCKET, config_dict, sample_docs, write_curriculum_config, write_final_shards

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv):
    code = main(["validate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_without_shards_prints_schedule_and_unknown_inventory(tmp_path, capsys):
    code, out, _ = run(capsys, "--config", write_curriculum_config(tmp_path))
    assert code == 0
    assert "curriculum: 2 phases, 4,096 tokens (total_tokens 4,096, temperature 1)" in out
    lines = out.splitlines()
    main_row = next(line for line in lines if line.startswith("main "))
    assert main_row.split() == ["main", "3,072", "75.0%", "128", "1", "0", "-", "2,304", "768"]
    assert next(line for line in lines if line.startswith("web ")).split() == ["web", "2,842", "unknown", "1", "unknown", "unknown"]
    assert "mean seq_len (share-weighted): 160.0" in out
    assert "attention compute saved by length warmup vs all at 256: 56.2% (2.29x less; per token 1.60x)" in out
    assert "warning: inventory: unknown (no final shards yet)" in out
    assert "OK: the curriculum is valid" in out
    assert (tmp_path / "root" / "curriculum" / "schedule.png").read_bytes()[:8] == PNG_MAGIC


def test_json_with_final_shards(tmp_path, capsys):
    root = LocalDataRoot(tmp_path / "root")
    for b, n in DOCS_PER_BUCKET.items():
        write_final_shards(root, b, sample_docs(b, n))
    plot = tmp_path / "plots" / "schedule.png"
    code, out, _ = run(capsys, write_curriculum_config(tmp_path), "--json", "--plot", str(plot))
    assert code == 0
    data = json.loads(out)
    assert data["ok"] and data["errors"] == [] and data["plot"] == str(plot)
    web = data["contract"]["buckets"]["web"]
    assert web["inventory_tokens"] == sum(n for _, n, _ in sample_docs("web", 40))
    assert web["effective_epochs"] == pytest.approx(web["tokens"] / web["inventory_tokens"])
    assert plot.read_bytes()[:8] == PNG_MAGIC
    assert not (tmp_path / "root" / "curriculum").exists()  # --plot replaces the data-root copy


def test_plot_bytes_are_deterministic(tmp_path, capsys):
    cfg = write_curriculum_config(tmp_path)
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    run(capsys, cfg, "--plot", str(a))
    run(capsys, cfg, "--plot", str(b))
    assert a.read_bytes() == b.read_bytes()


def test_inventory_file_and_blocking_error_exit_code(tmp_path, capsys):
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"web": 2000, "math": 10_000}))
    code, out, _ = run(capsys, write_curriculum_config(tmp_path), "--inventory", str(inventory))
    assert code == 1
    assert "error: curriculum.buckets.web.max_epochs: bucket 'web' needs 2,842 tokens but holds 2,000" in out
    assert "FAILED: 1 blocking error(s)" in out
    code, out, _ = run(capsys, write_curriculum_config(tmp_path, allow_bucket_exhaustion=True), "--inventory", str(inventory), "--json")
    assert code == 0 and json.loads(out)["warnings"][0].startswith("curriculum.buckets.web.max_epochs")


def test_bad_inventory_file(tmp_path, capsys):
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"web": 2000, "poetry": 5}))
    code, _, err = run(capsys, write_curriculum_config(tmp_path), "--inventory", str(inventory))
    assert code == 2 and "unknown buckets ['poetry']; the config declares ['web', 'math']" in err
    inventory.write_text("{not json")
    code, _, err = run(capsys, write_curriculum_config(tmp_path), "--inventory", str(inventory))
    assert code == 2 and "not valid JSON" in err
    code, _, err = run(capsys, write_curriculum_config(tmp_path), "--inventory", str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json: inventory file not found" in err


def test_schedule_that_cannot_be_computed_reports_errors_without_plot(tmp_path, capsys):
    cfg = config_dict(tmp_path)
    cfg["curriculum"]["phases"][0]["weights"] = {"web": -0.5, "math": 1.5}
    path = write_config(tmp_path, cfg, "bad.yaml")
    code, out, _ = run(capsys, str(path))
    assert code == 1
    assert "error: curriculum.phases[0].weights.math" not in out
    assert "error: curriculum.phases[0].weights.web: weight -0.5 is negative" in out
    assert not (tmp_path / "root" / "curriculum").exists()


def test_config_without_curriculum_and_missing_config(tmp_path, capsys):
    cfg = config_dict(tmp_path)
    del cfg["curriculum"]
    path = write_config(tmp_path, cfg, "plain.yaml")
    code, _, err = run(capsys, str(path))
    assert code == 2 and "no curriculum declared; add a `curriculum:` section" in err
    code, _, err = run(capsys, str(tmp_path / "nope.yaml"))
    assert code == 2 and "config file not found" in err
    code, _, err = run(capsys)
    assert code == 2 and "give the config" in err


def test_demo_curriculum_schedule_is_valid(tmp_path, capsys):
    demo = demo_config(tmp_path / "root")  # no final shards there: the schedule alone is checked
    path = write_config(tmp_path, demo, "demo.yaml")
    code, out, _ = run(capsys, str(path), "--json")
    data = json.loads(out)
    assert code == 0, data["errors"]
    phases = data["contract"]["phases"]
    assert [p["name"] for p in phases] == ["warmup", "main", "reasoning", "anneal"]
    assert [p["seq_len"] for p in phases] == [128, 128, 256, 512]
    assert phases[-1]["quality_top_fraction"] is not None
