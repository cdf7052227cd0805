"""Workers that live for a run, not a step (assets/fanout.py): the local engine's pool serves every
step of the run's process, each step with a cache of its own, and is replaced when the config
changes; no worker outlives its run, whether the run ends or is SIGKILLed, on the local pool or on
Ray (the session's three-node cluster)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from assets import fanout
from assets.resource import RefineryResource

from helpers import configs
from helpers.processes import alive, ended_within, pid_of_worker, start_run_that_fans_out


def write_config(folder: Path, execution: dict | None = None, workers: int = 2, seed: int = 0) -> Path:
    return configs.write_config(folder, {
        "seed": seed, "data_root": str(folder / "out"), "buckets": ["web"],
        "sources": [{"name": "web", "path": str(folder / "*.jsonl"), "format": "jsonl", "bucket": "web"}],
        "partitions": {"workers": workers}, "execution": execution or {"engine": "local"},
    }, f"run-{seed}.yaml")


def count_in_cache(refinery, item, cache) -> tuple[int, int]:
    cache[item] = True
    return os.getpid(), len(cache)


@pytest.fixture
def pool_closed():
    yield
    fanout.close_run_pool()


def test_one_pool_serves_every_step_each_with_its_own_cache(tmp_path, pool_closed):
    refinery = RefineryResource(config_path=str(write_config(tmp_path)))
    first = fanout.map_tasks(refinery, list(range(6)), count_in_cache)
    pool = fanout.run_pool(refinery, 2)
    second = fanout.map_tasks(refinery, list(range(6)), count_in_cache)
    assert fanout.run_pool(refinery, 2) is pool, "the second step reused the first one's pool"
    workers = {pid for pid, _ in first + second}
    assert os.getpid() not in workers and 1 <= len(workers) <= 2
    # A step's cache starts empty: each worker's counts restart at 1 in the second step.
    for results in (first, second):
        per_worker: dict[int, list[int]] = {}
        for pid, held in results:
            per_worker.setdefault(pid, []).append(held)
        assert all(held == list(range(1, len(held) + 1)) for held in per_worker.values())
    with fanout.task_pool(refinery) as run_tasks:
        assert set(run_tasks(pid_of_worker, list(range(4)))) <= workers


def test_a_changed_config_replaces_the_pool(tmp_path, pool_closed):
    one = RefineryResource(config_path=str(write_config(tmp_path, seed=1)))
    two = RefineryResource(config_path=str(write_config(tmp_path, seed=2)))
    pool = fanout.run_pool(one, 2)
    assert fanout.run_pool(two, 2) is not pool
    assert fanout.run_pool(two, 2) is fanout.run_pool(two, 2)


@pytest.mark.parametrize("then", ["exit", "sigkill"])
def test_no_pool_worker_outlives_its_run(tmp_path, then):
    process, pids = start_run_that_fans_out(str(write_config(tmp_path)), then)
    workers = pids["workers"]
    assert workers and all(alive(pid) for pid in workers + [pids["fork_server"]])
    if then == "sigkill":
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    for pid in workers + [pids["fork_server"]]:
        assert ended_within(pid, 30), f"process {pid} of the run outlived it ({then})"


@pytest.mark.slow  # the session's Ray cluster (about 30 s to start, once a session)
@pytest.mark.parametrize("then", ["exit", "sigkill"])
def test_no_ray_worker_outlives_its_run(tmp_path, ray_cluster, then):
    config = write_config(tmp_path, {"engine": "ray", "address": ray_cluster.address}, workers=1)
    process, pids = start_run_that_fans_out(str(config), then)
    workers = pids["workers"]
    assert workers and all(alive(pid) for pid in workers)
    if then == "sigkill":
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    for pid in workers:
        assert ended_within(pid, 60), f"Ray worker {pid} outlived its run ({then})"
