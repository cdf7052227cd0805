"""A step's workers import the library and what their task needs, never Dagster (issue 50): the
local engine's pool workers and the Ray engine's actors each make their run from the config path
(`refinery.run_context.WorkerRun`), and the task modules live under refinery/."""

from __future__ import annotations

import os

import pytest

from assets.resource import RefineryResource
from refinery import fanout, ray_pool

from helpers import configs
from helpers.processes import dagster_in_worker


def write_config(folder, execution: dict, workers: int) -> str:
    return str(configs.write_config(folder, {
        "data_root": str(folder / "out"), "buckets": ["web"],
        "sources": [{"name": "web", "path": str(folder / "*.jsonl"), "format": "jsonl", "bucket": "web"}],
        "partitions": {"workers": workers}, "execution": execution,
    }))


def test_a_local_pool_worker_has_not_imported_dagster(tmp_path):
    refinery = RefineryResource(config_path=write_config(tmp_path, {"engine": "local"}, workers=2))
    try:
        answers = fanout.map_tasks(refinery, list(range(4)), dagster_in_worker)
    finally:
        fanout.close_run_pool()
    assert {pid for pid, _ in answers}.isdisjoint({os.getpid()}), "the tasks ran in the pool's workers"
    assert [imported for _, imported in answers] == [False] * 4


@pytest.mark.slow  # the session's Ray cluster (about 30 s to start, once a session)
def test_a_ray_worker_has_not_imported_dagster(tmp_path, ray_cluster):
    refinery = RefineryResource(config_path=write_config(tmp_path, {"engine": "ray", "address": ray_cluster.address},
                                                         workers=1))
    try:
        answers = fanout.map_tasks(refinery, list(range(6)), dagster_in_worker)
    finally:
        ray_pool.close()
    assert len({pid for pid, _ in answers}) >= 2, "the tasks ran on several of the cluster's workers"
    assert [imported for _, imported in answers] == [False] * 6
