"""The Ray engine: a step's tasks on a cluster (`execution: {engine: ray, address: ...}`).

`refinery.fanout.map_tasks` and `task_pool` send here what they would otherwise hand their local
pool. The tasks go to the run's workers on the cluster (refinery/ray_pool.py: detached actors, one per
CPU of each node, reused by every step's driver and replaced when the code or config changes). Each
worker makes the run's resource from the config path (the same path on every node) and reads and
writes the data root itself; only a task's small result comes back, with the node that ran it. A
task whose worker process or node dies goes to another worker (`execution.max_retries`); its
outputs are written under a temporary name and renamed, so a retried task leaves no partial table,
and a retry writes the same bytes to the same keys (no duplicate row).

Why our own tasks and not dagster-ray's `ray_executor` (one Ray job per Dagster step): a step here
is a batch of many files, a bucket's key ranges or a phase's tables, and the unit that must spread
over machines is the file or range within it (docs/scale-out.md). `ray` is imported only here and
in refinery/ray_pool.py, and only when the engine is Ray: the default install has no Ray.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

from refinery.run_context import Run
from refinery.config.execution import resolve_address, unreachable

# The nodes that ran the tasks of the step being recorded (`recording_nodes`), one entry a task.
_nodes_of_step: ContextVar[list[str] | None] = ContextVar("nodes_of_step", default=None)

_connected_to: str | None = None


@contextmanager
def recording_nodes() -> Iterator[list[str]]:
    """Collect, in task order, the id of the node that ran each Ray task started within the block
    (nothing under the local engine)."""
    nodes: list[str] = []
    token = _nodes_of_step.set(nodes)
    try:
        yield nodes
    finally:
        _nodes_of_step.reset(token)


def node_summary(nodes: list[str]) -> dict[str, int]:
    """Tasks per node id, the node ids sorted."""
    return dict(sorted(Counter(nodes).items()))


def connect(address: str) -> None:
    """Join the cluster at `address` once per process (again when the address changes), and say on
    stderr which one (its address, nodes and CPUs) before any task goes there. A head that does not
    answer within PROBE_TIMEOUT_S raises ConnectionError naming the address instead of hanging in
    `ray.init`; `host-cluster` is resolved to the address this host registered and joined as that."""
    global _connected_to
    import ray

    from refinery import ray_pool

    if ray.is_initialized() and _connected_to == address:
        return
    if ray.is_initialized():
        ray_pool.forget()
        ray.shutdown()
    resolved = resolve_address(address)
    why = unreachable(resolved)
    if why is not None:
        raise ConnectionError(f"execution.address: no Ray cluster answers at {resolved}: {why}")
    # log_to_driver off: a task's log lines would interleave with the step's on the run's stdout.
    ray.init(address=resolved, namespace=ray_pool.NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    _connected_to = address
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = sum(n.get("Resources", {}).get("CPU", 0) for n in nodes)
    print(f"refinery: joined the Ray cluster at {ray.get_runtime_context().gcs_address} "
          f"(execution.address {address}): {len(nodes)} node(s), {cpus:g} CPU(s)", file=sys.stderr, flush=True)


def new_runner() -> str:
    """A fresh runner id: tasks of one runner share a cache in each worker, runners never do."""
    return uuid.uuid4().hex


def map_tasks(refinery: Run, items: list, task: Callable[[Run, Any, dict], Any],
              runner: str) -> list:
    """Run `task(resource, item, cache)` for every item on the run's workers (refinery/ray_pool.py) and
    return the results in item order; the node of each task goes to the block of `recording_nodes`,
    if any. A task's exception is raised here as itself."""
    from refinery import ray_pool

    cfg = refinery.config
    connect(cfg.execution.address)
    done = ray_pool.pool_for(refinery, cfg.execution.address).map(runner, task, items, cfg.execution.max_retries)
    recorded = _nodes_of_step.get()
    if recorded is not None:
        recorded.extend(node for node, _ in done)
    return [result for _, result in done]
