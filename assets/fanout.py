"""One file at a time: a per-batch asset's work on each input file of its batches, fanned out over
`partitions.workers` processes (or Ray tasks on a cluster: assets/ray_engine.py), and what each
file's step hands back to the asset. The same pool runs the tasks a per-bucket or global step splits
into (`task_pool`: the shuffle's and the lineage index's passes).

A partition is a batch of input files (assets/partitions.py). A file's step reads the file's input
table, runs a pure stage from `refinery.stages`, writes that file's kept documents, rejects and
stats to the data root (each atomically), and returns a `FileResult`: the tables stay in the data
root, only stats, hashes, settings and a few sample rows travel back.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context
from typing import Any, Callable, Iterator

import polars as pl

from assets import ray_engine
from assets.resource import RefineryResource
from refinery.config import RefineryConfig
from refinery.documents import InputShard
from refinery.stages.base import Stage, StageOutput, skips
from refinery.stages.stats import StageStats
from refinery.tasks import RunTasks, Task


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
FileTask = Callable[[RefineryResource, InputShard, dict], FileResult]

# Builds the stage for one source's files (built once per source and fan-out worker).
StageBuilder = Callable[[RefineryConfig, str], Stage]

_worker: dict[str, Any] = {}  # in a pool worker process: its resource and cache


def _init_worker(config_path: str, s3: dict[str, Any] | None) -> None:
    _worker["refinery"] = RefineryResource.from_worker_settings(config_path, s3)
    _worker["cache"] = {}


def _run_in_worker(task: Callable[[RefineryResource, Any, dict], Any], item: Any) -> Any:
    return task(_worker["refinery"], item, _worker["cache"])


def map_tasks(refinery: RefineryResource, items: list, task: Callable[[RefineryResource, Any, dict], Any]) -> list:
    """Run `task(resource, item, cache)` on every item, in `partitions.workers` processes (in this
    one when 1), or as Ray tasks under `execution.engine: ray`, and return the results in item
    order whatever order the workers finish in."""
    if refinery.config.execution.engine == "ray":
        return ray_engine.map_tasks(refinery, items, task, ray_engine.new_runner())
    workers = min(refinery.config.partitions.workers, len(items))
    if workers <= 1:
        cache: dict = {}
        return [task(refinery, item, cache) for item in items]
    # spawn, not fork: the run's process has Dagster's threads, which a fork would copy mid-lock.
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=refinery.worker_settings()) as pool:
        return list(pool.map(partial(_run_in_worker, task), items))


def map_files(refinery: RefineryResource, shards: list[InputShard], task: FileTask) -> list[FileResult]:
    """`map_tasks` over input files: each file's step, results in file order."""
    return map_tasks(refinery, shards, task)


def _on_root(task: Task, refinery: RefineryResource, item: Any, cache: dict) -> Any:
    return task(refinery.root, item, cache)


@contextmanager
def task_pool(refinery: RefineryResource, on_this_machine: bool = False) -> Iterator[RunTasks]:
    """A `refinery.tasks.RunTasks` that fans a step's tasks out like the per-file steps: over
    `partitions.workers` spawned processes, each with its own resource and data root, one pool
    (started on the first call that has more than one task) serving every call in the block, so a
    step's passes pay the workers' start once. With one worker, tasks run in this process. Under
    `execution.engine: ray` the calls of the block are Ray tasks of one runner (sharing a cache in
    each Ray worker, as the pool's workers do), unless `on_this_machine`: tasks that share a folder
    of this machine run in the local pool whatever the engine."""
    if refinery.config.execution.engine == "ray" and not on_this_machine:
        runner = ray_engine.new_runner()
        yield lambda task, items: ray_engine.map_tasks(refinery, items, partial(_on_root, task), runner)
        return
    workers = refinery.config.partitions.workers
    pool: ProcessPoolExecutor | None = None
    cache: dict = {}

    def run(task: Task, items: list) -> list:
        nonlocal pool
        if pool is None and min(workers, len(items)) <= 1:
            return [task(refinery.root, item, cache) for item in items]
        if pool is None:  # spawned, as in map_tasks
            pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                                       initargs=refinery.worker_settings())
        return list(pool.map(partial(_run_in_worker, partial(_on_root, task)), items))

    try:
        yield run
    finally:
        if pool is not None:
            pool.shutdown()


def run_stage(stage: Stage, cfg: RefineryConfig, shard: InputShard, docs: pl.DataFrame) -> StageOutput:
    """One shard through one stage, with the config's per-record time budget and the shard's
    source's `skip:` list applied."""
    stage.record_timeout_s = cfg.stages.record_timeout_s
    return stage.run_for_source(docs, cfg.source(shard.source).skip)


def stage_config_summary(stage: Stage, cfg: RefineryConfig, shard: InputShard) -> dict[str, Any]:
    skipped = skips(cfg.source(shard.source).skip, stage.skip_key)
    return {"skipped_by_source": shard.source} if skipped else stage.config_summary()
