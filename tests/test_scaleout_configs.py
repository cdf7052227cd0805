"""The scale-out configs under deploy/ load, validate against Dagster's schemas, and resolve the job
with the k8s executor, as far as that goes without a cluster or a Postgres server."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
TORCHRUN = REPO / "deploy" / "torchrun"

pytest.importorskip("dagster_k8s", reason="install the test extra: pip install -e '.[test]' (dagster-k8s)")
pytest.importorskip("dagster_postgres", reason="install the test extra: pip install -e '.[test]' (dagster-postgres)")

PG_ENV = {"DAGSTER_PG_HOST": "postgres", "DAGSTER_PG_DB": "dagster", "DAGSTER_PG_USER": "dagster",
          "DAGSTER_PG_PASSWORD": "pg-secret"}


@pytest.fixture
def pg_env(monkeypatch):
    for name, value in PG_ENV.items():
        monkeypatch.setenv(name, value)


def test_instance_yaml_validates_with_postgres_and_the_k8s_run_launcher(tmp_path, pg_env):
    from dagster._core.instance.config import dagster_instance_config

    shutil.copy(K8S / "dagster.yaml", tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert set(config["storage"]) == {"postgres"}
    text = (K8S / "dagster.yaml").read_text()
    assert "pg-secret" not in text and "password: {env: DAGSTER_PG_PASSWORD}" in text


def test_the_launcher_and_postgres_storage_accept_their_config(pg_env):
    from dagster._config import process_config
    from dagster_k8s import K8sRunLauncher
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    instance = yaml.safe_load((K8S / "dagster.yaml").read_text())
    launcher = process_config(K8sRunLauncher.config_type(), instance["run_launcher"]["config"])
    assert launcher.success, launcher.errors
    for storage in (PostgresRunStorage, PostgresEventLogStorage):
        checked = process_config(storage.config_type(), instance["storage"]["postgres"])
        assert checked.success, checked.errors


def test_s3_config_loads_and_keeps_secrets_out():
    from refinery.config import load_config

    cfg = load_config(K8S / "refinery-s3.yaml")
    assert cfg.data_root.startswith("s3://")
    assert cfg.stages.exact_dedup.hash_ranges == 64
    assert (cfg.stages.near_dedup.bands, cfg.stages.near_dedup.rows) == (14, 8)
    text = (K8S / "refinery-s3.yaml").read_text().lower()
    assert "aws_secret" not in text and "secret_key" not in text


@pytest.fixture
def k8s_defs(monkeypatch):
    monkeypatch.setenv("REFINERY_CONFIG", str(K8S / "refinery-s3.yaml"))
    monkeypatch.syspath_prepend(str(REPO))
    return runpy.run_path(str(K8S / "refinery_k8s.py"))["defs"]


def test_jobs_resolve_with_the_k8s_executor_and_the_run_config(k8s_defs):
    from dagster._core.system_config.objects import ResolvedRunConfig

    run_config = yaml.safe_load((K8S / "executor.yaml").read_text())
    graph = k8s_defs.resolve_asset_graph()
    assets_by_partitioning: dict[int, list] = {}
    for key in graph.materializable_asset_keys:
        assets_by_partitioning.setdefault(id(graph.get(key).partitions_def), []).append(key)
    # One job per partitioning, as the embedded run does it; each runs a pod per step.
    for keys in assets_by_partitioning.values():
        job = k8s_defs.resolve_implicit_job_def_def_for_assets(keys)
        assert job.executor_def.name == "k8s"
        ResolvedRunConfig.build(job, run_config)
    step_names = {key.to_python_identifier() for key in graph.materializable_asset_keys}
    per_step = set(run_config["execution"]["config"]["per_step_k8s_config"])
    assert per_step <= step_names, f"per_step_k8s_config names steps the graph lacks: {sorted(per_step - step_names)}"


def test_a_bad_executor_setting_is_rejected(k8s_defs):
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster._core.system_config.objects import ResolvedRunConfig

    graph = k8s_defs.resolve_asset_graph()
    job = k8s_defs.resolve_implicit_job_def_def_for_assets([next(iter(graph.materializable_asset_keys))])
    with pytest.raises(DagsterInvalidConfigError, match="max_concurent"):
        ResolvedRunConfig.build(job, {"execution": {"config": {"max_concurent": 4}}})


def test_trainer_job_and_launcher_agree():
    service, job = list(yaml.safe_load_all((TORCHRUN / "trainer-job.yaml").read_text()))
    spec = job["spec"]
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert spec["completionMode"] == "Indexed"
    assert spec["parallelism"] == spec["completions"] == int(env["NNODES"])
    assert env["RDZV_HOST"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert spec["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert (REPO / container["command"][0].removeprefix("/app/")).is_file()
    assert (REPO / env["REFINERY_CONFIG"].removeprefix("/app/")).is_file()

    out = subprocess.run(
        [str(TORCHRUN / "launch.sh"), "--json"], capture_output=True, text=True, timeout=30,
        env={**os.environ, **env, "DRY_RUN": "1", "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert out.returncode == 0, out.stderr
    argv = out.stdout.split()
    assert argv[0] == "torchrun"
    assert "--nnodes=4" in argv and "--nproc-per-node=8" in argv and "--rdzv-endpoint=trainer-0.trainer:29400" in argv
    assert argv[-4:] == ["train", "--config", env["REFINERY_CONFIG"], "--json"]


def test_launcher_names_what_is_missing():
    out = subprocess.run([str(TORCHRUN / "launch.sh")], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"]})
    assert out.returncode != 0 and "REFINERY_CONFIG" in out.stderr
