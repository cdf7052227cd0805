"""Workers that live for a run, not a step: the local engine's pool (refinery/fanout.py) serves every
step of the run's process, and the Ray engine's detached actors (refinery/ray_pool.py) every step's
driver, each step with a cache of its own; both are replaced when the config (or, on Ray, the code)
changes; no worker outlives its run, whether the run ends or is SIGKILLed, on the local pool or on
Ray (the session's three-node cluster, within the lease's bound)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from refinery import fanout, ray_pool
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
    else:
        process.stdin.close()
    process.wait(timeout=60)
    for pid in workers + [pids["fork_server"]]:
        assert ended_within(pid, 30), f"process {pid} of the run outlived it ({then})"


def test_a_ray_pool_is_named_per_data_root_and_version(tmp_path, monkeypatch):
    (tmp_path / "again").mkdir()
    one = RefineryResource(config_path=str(write_config(tmp_path, seed=1)))
    same = RefineryResource(config_path=str(write_config(tmp_path / "again", seed=1)))
    two = RefineryResource(config_path=str(write_config(tmp_path, seed=2)))
    root, version = ray_pool.pool_names(one)
    assert version.startswith(root) and ray_pool.pool_names(one) == (root, version)
    assert ray_pool.pool_names(two)[0] == root and ray_pool.pool_names(two)[1] != version, "a changed config"
    assert ray_pool.pool_names(same)[0] != root, "another data root"
    monkeypatch.setattr(ray_pool, "_code_digest", ["another checkout"])
    assert ray_pool.pool_names(one) == (root, ray_pool.pool_names(one)[1]) != (root, version), "changed code"


def ray_config(folder: Path, cluster, seed: int = 0) -> str:
    return str(write_config(folder, {"engine": "ray", "address": cluster.address}, workers=1, seed=seed))


@pytest.mark.slow  # the session's Ray cluster (about 30 s to start, once a session)
def test_ray_steps_reuse_the_run_workers_until_the_version_changes(tmp_path, ray_cluster):
    refinery = RefineryResource(config_path=ray_config(tmp_path, ray_cluster, seed=1))
    try:
        first = fanout.map_tasks(refinery, list(range(6)), count_in_cache)
        workers = {slot.pid: slot.node for slot in ray_pool._pool.slots}
        second = fanout.map_tasks(refinery, list(range(6)), count_in_cache)
        with fanout.task_pool(refinery) as run_tasks:
            third = run_tasks(pid_of_worker, list(range(6)))
        # One worker per node of the three (one CPU each), the same actors in every step.
        assert len(workers) == 3 and set(workers.values()) == set(ray_cluster.node_ids())
        assert {pid for pid, _ in first} | {pid for pid, _ in second} | set(third) <= set(workers)
        assert {slot.pid for slot in ray_pool._pool.slots} == set(workers)
        assert os.getpid() not in workers
        for results in (first, second):  # a step's cache starts empty in each worker
            per_worker: dict[int, list[int]] = {}
            for pid, held in results:
                per_worker.setdefault(pid, []).append(held)
            assert all(held == list(range(1, len(held) + 1)) for held in per_worker.values())
        # A changed config is another version: new workers, the old ones killed.
        changed = RefineryResource(config_path=ray_config(tmp_path, ray_cluster, seed=2))
        fanout.map_tasks(changed, list(range(3)), pid_of_worker)
        renewed = {slot.pid for slot in ray_pool._pool.slots}
        assert len(renewed) == 3 and not renewed & set(workers)
        for pid in workers:
            assert ended_within(pid, 30), f"worker {pid} of the old config outlived its replacement"
    finally:
        ray_pool.close()  # as `refinery demo` does when it ends
    for pid in renewed:
        assert ended_within(pid, 30), f"worker {pid} outlived the close at the run's end"


@pytest.mark.slow  # the session's Ray cluster (about 30 s to start, once a session)
@pytest.mark.parametrize("then", ["exit", "sigkill"])
def test_no_ray_worker_outlives_its_run(tmp_path, ray_cluster, then):
    config = ray_config(tmp_path, ray_cluster)
    process, pids = start_run_that_fans_out(config, then)
    workers = pids["workers"]
    # Three steps, one worker per node (one CPU each) serving all of them.
    assert len(workers) == 3 and all(alive(pid) for pid in workers)
    if then == "exit":  # the next step's driver, a process of its own as under Dagster's multiprocess executor
        process.stdin.close()
        process.wait(timeout=60)
        process, pids = start_run_that_fans_out(config, then)
        assert pids["workers"] == workers, "the next driver reused the run's workers"
    if then == "sigkill":
        process.send_signal(signal.SIGKILL)
    else:
        process.stdin.close()
    process.wait(timeout=60)
    bound = ray_pool.LEASE_S + ray_pool.WATCH_S
    for pid in workers:  # the lease, no longer renewed, ends them
        assert ended_within(pid, bound + 15), f"Ray worker {pid} outlived its run by over {bound:g} s ({then})"
