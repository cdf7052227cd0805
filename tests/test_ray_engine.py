"""The Ray engine on a real three-node cluster on 127.0.0.1 (the session's `ray_cluster`): the funnel
through dedup and `pii_redacted`, materialized through Dagster with `execution.engine: ray`, writes
the bytes the local engine writes, and still does when a worker node is SIGKILLed mid-run."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from orchestration.definitions import build_definitions
from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph
from refinery.config import load_config
from refinery.storage import LocalDataRoot

from helpers import configs
from helpers.texts import PROSE

pytestmark = pytest.mark.slow  # a Ray cluster (about 30 s to start, once a session) and three funnel runs

THROUGH_PII = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "dedup_signatures",
               "exact_deduped", "near_deduped", "near_dup_clusters", "deduped", "quality_model", "quality_scored",
               "pii_redacted"]


def write_corpus(folder: Path, files: int = 9, docs: int = 30) -> None:
    """Files of distinct prose, each with an exact copy of another file's document (exact dedup), a
    near copy (near dedup), an e-mail address (PII) and a broken line (a counted reject)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        rows = [{"text": f"Story {f}.{d}. {PROSE} Chapter {f * 100 + d} ends here.", "url": f"https://f{f}.example/{d}"}
                for d in range(docs)]
        rows.append({"text": f"Story {(f + 1) % files}.0. {PROSE} Chapter {((f + 1) % files) * 100} ends here.",
                     "url": f"https://copy.example/{f}"})
        rows.append({"text": f"Story {f}.1. {PROSE} Chapter {f * 100 + 1} ends here!", "url": f"https://near.example/{f}"})
        rows.append({"text": f"Write to reader{f}@example.com. {PROSE}", "url": f"https://mail.example/{f}"})
        lines = [json.dumps(r) for r in rows] + ["{broken"]
        (folder / f"part-{f:02d}.jsonl").write_text("\n".join(lines) + "\n")


def write_config(tmp_path: Path, name: str, execution: dict) -> Path:
    config = {
        "seed": 3,
        "data_root": f"out-{name}",
        "buckets": ["web"],
        "sources": [{"name": "web", "path": "web/*.jsonl", "format": "jsonl", "bucket": "web"}],
        "partitions": {"by": "hash", "count": 2},
        "execution": execution,
        "stages": {"quality": {"enabled": False}},
    }
    return configs.write_config(tmp_path, config, f"{name}.yaml")


def run_through_pii(config: Path, instance: dg.DagsterInstance) -> None:
    materialize_graph(build_definitions(str(config)), instance, [dg.AssetKey(k) for k in THROUGH_PII],
                      log=lambda _: None, run_config=QUIET_RUN_CONFIG)


def written(config: Path) -> dict[str, str]:
    """sha256 of every table, dedup file and stats-free output under the data root (stats carry
    wall times)."""
    cfg = load_config(config)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    return {k: root.sha256(k) for k in root.list("") if not k.endswith(".json") or "/stats/" not in f"/{k}"}


def leftovers(config: Path) -> list[str]:
    """Files under the data root still under a temporary name."""
    cfg = load_config(config)
    return sorted(str(p) for p in Path(cfg.resolve(cfg.data_root)).rglob(".*.tmp"))


def ray_nodes_named(instance: dg.DagsterInstance) -> set[str]:
    """Every node id that a materialization's `ray_nodes` metadata names."""
    named: set[str] = set()
    for asset in THROUGH_PII:
        for record in instance.fetch_materializations(dg.AssetKey(asset), limit=100).records:
            md = record.asset_materialization.metadata
            if "ray_nodes" in md:
                named |= set(md["ray_nodes"].value)
    return named


@pytest.fixture(scope="module")
def local_engine_bytes(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    workdir = tmp_path_factory.mktemp("ray-engine")
    write_corpus(workdir / "web")
    config = write_config(workdir, "local", {"engine": "local"})
    with dg.DagsterInstance.ephemeral() as instance:
        run_through_pii(config, instance)
    return workdir, written(config)


def test_the_ray_engine_writes_the_local_engines_bytes_on_three_nodes(ray_cluster, local_engine_bytes):
    workdir, expected = local_engine_bytes
    assert any("pii_redacted" in k for k in expected) and any(k.startswith("dedup/") for k in expected)
    config = write_config(workdir, "ray", {"engine": "ray", "address": ray_cluster.address})
    with dg.DagsterInstance.ephemeral() as instance:
        run_through_pii(config, instance)
        named = ray_nodes_named(instance)
    assert written(config) == expected
    assert leftovers(config) == []
    assert len(named) >= 2 and named <= set(ray_cluster.node_ids()), "the per-file tasks ran on several nodes"


def test_a_worker_node_killed_mid_run_costs_retries_not_bytes(ray_cluster, local_engine_bytes):
    workdir, expected = local_engine_bytes
    config = write_config(workdir, "ray-kill", {"engine": "ray", "address": ray_cluster.address, "max_retries": 5})
    root = Path(load_config(config).resolve(load_config(config).data_root))
    outcome: dict[str, BaseException | None] = {}

    def run() -> None:
        try:
            with dg.DagsterInstance.ephemeral() as instance:
                run_through_pii(config, instance)
                outcome["named"] = ray_nodes_named(instance)
            outcome["error"] = None
        except BaseException as err:  # noqa: BLE001 (handed to the test's thread)
            outcome["error"] = err

    nodes_before = set(ray_cluster.node_ids())
    runner = threading.Thread(target=run)
    runner.start()
    try:
        # The kill lands while the first step's tasks are spread over the nodes: as soon as the
        # first extracted table is written, with language ID and the rest of the batch still to run.
        deadline = time.monotonic() + 300
        while not list(root.glob("documents/extracted_text/*.parquet")):
            assert runner.is_alive() and time.monotonic() < deadline, "the run ended before any file was extracted"
            time.sleep(0.05)
        killed = ray_cluster.kill_worker(1)
        runner.join(timeout=600)
        assert not runner.is_alive()
    finally:
        if ray_cluster.workers[1].process.poll() is not None:
            ray_cluster.replace_worker(1)  # joins while the assertions run; the next test waits for it
    assert outcome["error"] is None, outcome["error"]
    assert written(config) == expected
    assert leftovers(config) == []
    assert killed in nodes_before and len(outcome["named"]) >= 2 and outcome["named"] <= nodes_before | set(
        ray_cluster.node_ids())
