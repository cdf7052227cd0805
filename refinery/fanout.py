"""One file at a time: a per-batch asset's work on each input file of its batches, fanned out over
`partitions.workers` processes (or Ray tasks on a cluster: refinery/ray_engine.py), and what each
file's step hands back to the asset. The same pool runs the tasks a per-bucket or global step splits
into (`task_pool`: the shuffle's and the lineage index's passes).

A partition is a batch of input files (assets/partitions.py). A file's step reads the file's input
table, runs a pure stage from `refinery.stages`, writes that file's kept documents, rejects and
stats to the data root (each atomically), and returns a `FileResult`: the tables stay in the data
root, only stats, hashes, settings and a few sample rows travel back.
"""

from __future__ import annotations

import atexit
import hashlib
import multiprocessing.forkserver
import os
import signal
import uuid
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context
from typing import Any, Callable, Iterator

import polars as pl

from refinery import ray_engine
from refinery.run_context import Run, WorkerRun
from refinery.config import RefineryConfig
from refinery.documents import InputShard
from refinery.stages.base import Stage, StageOutput, skips
from refinery.stages.stats import StageStats
from refinery.tasks import RunTasks, Task
from refinery.parent_death import set_parent_death_signal


@dataclass
class FileResult:
    """What one input file's step returns to the asset: its stats, the hashes of what it wrote, the
    settings it ran with and a few sample rows (never the whole table, which stays in the data root)."""

    shard: str
    source: str
    stats: StageStats
    hashes: dict[str, str]
    settings: dict[str, Any]
    sample: pl.DataFrame | None = None


# A file's step: (resource, file, cache) -> its FileResult. The cache lives as long as the fan-out
# and holds what is expensive to build once per source (a stage with its model). A module-level
# function (or a partial of one) so a worker process can unpickle it.
FileTask = Callable[[Run, InputShard, dict], FileResult]

# Builds the stage for one source's files (built once per source and fan-out worker).
StageBuilder = Callable[[RefineryConfig, str], Stage]

_worker: dict[str, Any] = {}  # in a pool worker process: its resource, and the current runner's cache

# The heavy modules a pool worker's tasks import (polars, the stages and models they build): the
# fork server imports them once a run, and each worker is forked from it with them loaded, instead
# of importing them again. Only modules below this one: a task module (which imports this one) is
# imported by the worker when it unpickles its first task, so the list names none of its callers.
WORKER_PRELOAD = ["polars", "refinery.stages.language", "refinery.stages.heuristic", "refinery.models.quality",
                  "refinery.global_steps.dedup_compute", "refinery.global_steps.tokenize"]


def _init_worker(config_path: str, s3: dict[str, Any] | None) -> None:
    # A worker dies with the fork server that made it, and the fork server leaves when this run's
    # process does (even SIGKILLed: the last writer of the server's liveness pipe is gone), so no
    # worker outlives the run. A forked worker holds a copy of that writer, which would keep the
    # server, and so the worker, alive: it is closed here.
    set_parent_death_signal(signal.SIGKILL)
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    _worker["refinery"] = WorkerRun(config_path, s3)
    _worker["runner"], _worker["cache"] = None, {}


def _run_in_worker(task: Callable[[Run, Any, dict], Any], runner: str, item: Any) -> Any:
    if _worker["runner"] != runner:  # a cache is valid for one runner (one step's fan-out) only
        _worker["runner"], _worker["cache"] = runner, {}
    return task(_worker["refinery"], item, _worker["cache"])


@dataclass
class _RunPool:
    """The process's pool of workers, kept from one step to the next while the settings and config
    it was made for stay the same."""

    key: tuple
    pool: ProcessPoolExecutor


_pool: _RunPool | None = None


def run_pool(refinery: Run, workers: int) -> ProcessPoolExecutor:
    """The pool of `workers` processes for this run's resource, made on first use and reused by
    every later step of this process (the demo's and a Dagster run's in-process steps) while the
    config and worker count are the same; a changed config or count replaces it. Workers are forked
    from a fork server (not from this process, whose Dagster threads a fork would copy mid-lock),
    which imports `WORKER_PRELOAD` once."""
    global _pool
    key = (refinery.worker_settings(), workers, config_digest(refinery.config))
    if _pool is not None and _pool.key == key and not _pool_broken(_pool.pool):
        return _pool.pool
    close_run_pool()
    context = get_context("forkserver")
    context.set_forkserver_preload(WORKER_PRELOAD)
    _pool = _RunPool(key, ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                              initargs=refinery.worker_settings()))
    return _pool.pool


def _pool_broken(pool: ProcessPoolExecutor) -> bool:
    return bool(getattr(pool, "_broken", False))


def close_run_pool() -> None:
    """Shut the run's pool down (its workers leave once their tasks are done); at the latest when
    the process exits."""
    global _pool
    if _pool is not None:
        _pool.pool.shutdown()
        _pool = None


atexit.register(close_run_pool)


def config_digest(cfg: RefineryConfig) -> str:
    """A digest of every config value: what the run pool and the run's stages were made for."""
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()


def map_tasks(refinery: Run, items: list, task: Callable[[Run, Any, dict], Any]) -> list:
    """Run `task(resource, item, cache)` on every item, in the run's pool of `partitions.workers`
    processes (in this one when 1), or as Ray tasks under `execution.engine: ray`, and return the
    results in item order whatever order the workers finish in. The cache is the call's own."""
    if refinery.config.execution.engine == "ray":
        return ray_engine.map_tasks(refinery, items, task, ray_engine.new_runner())
    workers = min(refinery.config.partitions.workers, len(items))
    if workers <= 1:
        cache: dict = {}
        return [task(refinery, item, cache) for item in items]
    pool = run_pool(refinery, refinery.config.partitions.workers)
    return list(pool.map(partial(_run_in_worker, task, uuid.uuid4().hex), items))


# This process's stages, built once per (stage, source) for the config they were built from: a
# worker of the run's pool (or the run's own process) keeps its models from step to step and from
# one partition to the next. Bounded by the stages times the sources of one config.
_stages: dict[tuple[str, str], Stage] = {}
_stages_config: list[str] = [""]


def built_stage(cfg: RefineryConfig, name: str, source: str, build: StageBuilder) -> Stage:
    """`build(cfg, source)` for stage `name`, made once in this process while the config is the
    same (a stage is built from the config alone)."""
    digest = config_digest(cfg)
    if _stages_config[0] != digest:
        _stages.clear()
        _stages_config[0] = digest
    if (name, source) not in _stages:
        _stages[name, source] = build(cfg, source)
    return _stages[name, source]


def map_files(refinery: Run, shards: list[InputShard], task: FileTask) -> list[FileResult]:
    """`map_tasks` over input files: each file's step, results in file order."""
    return map_tasks(refinery, shards, task)


def _on_root(task: Task, refinery: Run, item: Any, cache: dict) -> Any:
    return task(refinery.root, item, cache)


@contextmanager
def task_pool(refinery: Run, on_this_machine: bool = False) -> Iterator[RunTasks]:
    """A `refinery.tasks.RunTasks` that fans a step's tasks out like the per-file steps: over
    the run's pool of `partitions.workers` processes (`run_pool`), each with its own resource and
    data root, the calls of the block sharing a cache in each worker (from the first call that has
    more than one task on). With one worker, tasks run in this process. Under
    `execution.engine: ray` the calls of the block are Ray tasks of one runner (sharing a cache in
    each Ray worker, as the pool's workers do), unless `on_this_machine`: tasks that share a folder
    of this machine run in the local pool whatever the engine."""
    if refinery.config.execution.engine == "ray" and not on_this_machine:
        runner = ray_engine.new_runner()
        yield lambda task, items: ray_engine.map_tasks(refinery, items, partial(_on_root, task), runner)
        return
    workers = refinery.config.partitions.workers
    runner = uuid.uuid4().hex
    pooled = False
    cache: dict = {}

    def run(task: Task, items: list) -> list:
        nonlocal pooled
        if not pooled and min(workers, len(items)) <= 1:
            return [task(refinery.root, item, cache) for item in items]
        pooled = True  # from here on in the pool, whose workers keep this block's cache
        pool = run_pool(refinery, workers)
        return list(pool.map(partial(_run_in_worker, partial(_on_root, task), runner), items))

    yield run


def run_stage(stage: Stage, cfg: RefineryConfig, shard: InputShard, docs: pl.DataFrame) -> StageOutput:
    """One shard through one stage, with the config's per-record time budget and the shard's
    source's `skip:` list applied."""
    stage.record_timeout_s = cfg.stages.record_timeout_s
    return stage.run_for_source(docs, cfg.source(shard.source).skip)


def stage_config_summary(stage: Stage, cfg: RefineryConfig, shard: InputShard) -> dict[str, Any]:
    skipped = skips(cfg.source(shard.source).skip, stage.skip_key)
    return {"skipped_by_source": shard.source} if skipped else stage.config_summary()
