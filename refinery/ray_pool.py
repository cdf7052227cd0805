"""The Ray engine's workers for a run, not a step: a pool of detached actors on the cluster, one per
CPU of each node, that every step's driver of a run reuses (refinery/ray_engine.py sends them the
step's tasks).

Why: a Ray worker process belongs to one job, and every driver is a job. Under the Ray engine each
step process of a Dagster run (and each `refinery demo`) is a driver, so plain Ray tasks start a
worker on every node per driver, and each worker starts (Ray's own start, most of it `import ray`:
1.2-1.4 CPU-s), imports the task modules (polars, the stages: about 0.4) and builds the stages
(fastText, the rules) again (bench/RESULTS.md, 2026-12-07). A detached actor belongs
to no job: the pool's actors are started by the first driver that needs them and found by name by
every later one, with the modules imported and the stages built (`fanout.built_stage`) once.

- **Named per data root and version.** An actor's name is `refinery-pool-<root>-<version>-<node>-<slot>`
  in the `refinery` namespace: `<root>` a digest of the data root, `<version>` one of the code (every
  .py file of assets/, refinery/, training/ and orchestration/), the whole config and the worker
  settings. A driver gets each slot's actor or creates it (`get_if_exists`), pinned to its node
  (node affinity, not soft). When a driver creates the pool of a version, it kills the actors of any
  other version of the same data root: a changed code or config gets new workers.
- **A lease, so none are left behind.** The pool's lease is a key in Ray's internal KV that every
  driver using the pool rewrites every RENEW_S while its process lives. Each actor's watchdog thread
  reads the key every WATCH_S and exits its process when the key is gone or has not changed for
  LEASE_S. So the actors outlive the last driver that used them (ended, crashed or SIGKILLed) by at
  most LEASE_S + WATCH_S (32 s), long enough for the next step process of a Dagster run to find them
  (the multiprocess executor takes 7-10 s to start a step), and no longer.
- **Killed at a run's end.** `close` (called when `refinery demo` ends, and when a process switches
  to another pool) kills the pool's actors at once and deletes the lease.
- **Resources.** An actor holds no CPU (a Ray trainer or another job can still be placed) but holds
  a task's memory (`task_memory_bytes`), and a node gets as many actors as it has CPUs and memory
  for. Each actor runs one task at a time, and the driver keeps one task in flight per actor, so a
  node runs at most its CPU count of tasks, as with Ray tasks of one CPU each.
- **Retries.** A task whose actor died (its process or its node) is sent to another actor of the
  pool, up to `execution.max_retries` times; the pool gets its missing actors back, on the nodes
  still alive, at the next step. A task writes under a temporary name and renames, so a rerun
  writes the same bytes to the same keys.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from refinery.run_context import Run, WorkerRun
from refinery.config import task_memory_bytes

NAMESPACE = "refinery"  # the Ray namespace of every driver (ray_engine.connect) and of the pool
PREFIX = "refinery-pool"
LEASE_S = 30.0  # an actor whose lease did not change for this long exits
RENEW_S = 5.0  # a driver rewrites its pool's lease this often
WATCH_S = 2.0  # an actor reads its lease this often
# How long a driver waits for the actors it created to be placed and started (a node may be busy
# or short of memory for one; an autoscaler may be adding a node).
START_TIMEOUT_S = 300.0
CODE_PACKAGES = ("assets", "refinery", "training", "orchestration")
REPO = Path(__file__).resolve().parents[1]


class PoolWorker:
    """One worker of the pool (a detached Ray actor): runs a step's tasks one at a time, keeps the
    modules they import and the stages they build for its whole life, and a cache per runner (one
    step's fan-out), as a local pool worker does (`fanout._run_in_worker`)."""

    def __init__(self, settings: tuple, lease_key: str):
        self.settings = settings
        self.resource: Run | None = None
        self.runner: str | None = None
        self.cache: dict = {}
        threading.Thread(target=watch_lease, args=(lease_key,), name="refinery-lease", daemon=True).start()

    def pid(self) -> int:
        """This worker's process id; answering it also says the actor has started."""
        return os.getpid()

    def run(self, runner: str, task: Callable[[Run, Any, dict], Any], item: Any) -> Any:
        if self.resource is None:
            self.resource = WorkerRun(*self.settings)
        if self.runner != runner:  # a cache is valid for one runner only
            self.runner, self.cache = runner, {}
        return task(self.resource, item, self.cache)


def watch_lease(key: str) -> None:
    """Exit this process when the lease `key` is deleted or has not changed for LEASE_S (a GCS that
    does not answer counts as no change)."""
    from ray.experimental.internal_kv import _internal_kv_get

    seen, since = b"", time.monotonic()
    while True:
        time.sleep(WATCH_S)
        try:
            value = _internal_kv_get(key, namespace=NAMESPACE)
        except Exception:  # noqa: BLE001 (any failure to read the lease is "not renewed")
            value = seen
        if value is None:
            os._exit(0)
        if value != seen:
            seen, since = value, time.monotonic()
        elif time.monotonic() - since > LEASE_S:
            os._exit(0)


_code_digest: list[str] = []


def code_digest() -> str:
    """A digest of every .py file of the packages a worker runs (made once a process)."""
    if not _code_digest:
        h = hashlib.sha256()
        for package in CODE_PACKAGES:
            for path in sorted((REPO / package).rglob("*.py")):
                h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
        _code_digest.append(h.hexdigest())
    return _code_digest[0]


def pool_names(refinery: Run) -> tuple[str, str]:
    """(the prefix of every pool of this data root, the prefix of this version's pool: also its
    lease key)."""
    cfg = refinery.config
    root = hashlib.sha256(str(cfg.resolve(cfg.data_root)).encode()).hexdigest()[:12]
    version = hashlib.sha256("\0".join([code_digest(), cfg.model_dump_json(), repr(refinery.worker_settings())])
                             .encode()).hexdigest()[:12]
    return f"{PREFIX}-{root}-", f"{PREFIX}-{root}-{version}"


@dataclass
class Slot:
    node: str
    name: str
    actor: Any
    pid: int


@dataclass
class WorkerPool:
    """This process's handles on one pool (the actors may be shared with other drivers)."""

    address: str
    root_prefix: str
    name: str
    settings: tuple
    memory: int
    slots: list[Slot] = field(default_factory=list)
    starting: dict[str, tuple[str, Any, Any]] = field(default_factory=dict)  # name -> (node, actor, its pid's ref)

    def refresh(self) -> None:
        """Get or create the actor of every slot of every live node (its CPUs, as many as its memory
        holds) and drop the slots of nodes that left. With no slot yet, wait up to START_TIMEOUT_S
        for the new actors; with some, take those already started and leave the others (a node that
        died but is not yet declared dead, one still busy) to a later refresh."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = {n["NodeID"]: n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")}
        self.slots = [s for s in self.slots if s.node in alive]
        self.starting = {name: new for name, new in self.starting.items() if new[0] in alive}
        have = {s.name for s in self.slots} | set(self.starting)
        for node, resources in sorted(alive.items()):
            for k in range(min(int(resources.get("CPU", 0)), int(resources.get("memory", 0) // self.memory))):
                name = f"{self.name}-{node[:16]}-{k}"
                if name in have:
                    continue
                actor = remote_class().options(
                    name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
                    memory=self.memory, max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(self.settings, self.name)
                self.starting[name] = (node, actor, actor.pid.remote())
        if not self.starting:
            return
        refs = [ref for _, _, ref in self.starting.values()]
        started, _ = ray.wait(refs, num_returns=len(refs), timeout=0 if self.slots else START_TIMEOUT_S)
        for name, (node, actor, ref) in list(self.starting.items()):
            if ref not in started:
                continue
            del self.starting[name]
            try:
                self.slots.append(Slot(node, name, actor, ray.get(ref)))
            except ray.exceptions.RayError:
                continue  # it died or could not be placed (its node left): a later refresh makes it again
        if not self.slots:
            raise TimeoutError(f"none of the Ray engine's workers {sorted(self.starting)} started within "
                               f"{START_TIMEOUT_S:g} s: each asks its node for {self.memory} bytes of memory "
                               f"(execution.task_memory_mb)")

    def map(self, runner: str, task: Callable, items: list, max_retries: int) -> list[tuple[str, Any]]:
        """(node, result) of `task(resource, item, cache)` for every item, in item order, one task in
        flight per actor. A task whose actor died goes to another actor (`max_retries` times at most);
        a task's own exception is raised here as itself."""
        import ray

        done: list[Any] = [None] * len(items)
        tries = [0] * len(items)
        todo = deque(range(len(items)))
        idle = list(self.slots)
        in_flight: dict[Any, tuple[Slot, int]] = {}
        while todo or in_flight:
            if not idle and not in_flight:
                self.refresh()
                idle = list(self.slots)
                if not idle:
                    raise RuntimeError("the Ray cluster has no live node with a CPU and a task's memory for a worker")
            while todo and idle:
                slot, index = idle.pop(), todo.popleft()
                in_flight[slot.actor.run.remote(runner, task, items[index])] = (slot, index)
            # As long as the task runs (its records are bounded by stages.record_timeout_s); an
            # actor that dies answers at once with RayActorError.
            [ref], _ = ray.wait(list(in_flight), num_returns=1)
            slot, index = in_flight.pop(ref)
            try:
                done[index] = (slot.node, ray.get(ref))
            except ray.exceptions.RayTaskError as err:
                raise err.as_instanceof_cause() from None
            except ray.exceptions.RayActorError:
                self.slots = [s for s in self.slots if s is not slot]
                tries[index] += 1
                if tries[index] > max_retries:
                    raise
                todo.appendleft(index)
                continue
            idle.append(slot)
        return done


_actor_class: list[Any] = []


def remote_class() -> Any:
    """PoolWorker as a Ray actor class, made once a process."""
    import ray

    if not _actor_class:
        _actor_class.append(ray.remote(PoolWorker))
    return _actor_class[0]


_pool: WorkerPool | None = None
_lock = threading.Lock()
_renewer: list[threading.Thread] = []


def pool_for(refinery: Run, address: str) -> WorkerPool:
    """This run's pool on the cluster this process joined at `address`: the one it used last while
    the data root, code, config and settings are the same, else found or made anew (the actors of
    other versions of the data root killed), its lease renewed from here on."""
    global _pool
    root_prefix, name = pool_names(refinery)
    if _pool is not None and _pool.address == address and _pool.name == name:
        _pool.refresh()
        return _pool
    if _pool is not None:
        close()
    cfg = refinery.config
    pool = WorkerPool(address, root_prefix, name, refinery.worker_settings(),
                      task_memory_bytes(cfg.execution, cfg.stages.extract.batch_bytes, cfg.stages.extract.max_record_bytes))
    renew(pool.name)
    kill_other_versions(root_prefix, name)
    with _lock:
        _pool = pool
    if not _renewer:
        _renewer.append(threading.Thread(target=renew_while_alive, name="refinery-pool-lease", daemon=True))
        _renewer[0].start()
    pool.refresh()
    return pool


def renew(key: str) -> None:
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, uuid.uuid4().bytes, namespace=NAMESPACE)


def renew_while_alive() -> None:
    """Rewrite the lease of this process's pool every RENEW_S, for as long as the process lives."""
    while True:
        time.sleep(RENEW_S)
        with _lock:
            key = _pool.name if _pool is not None else None
        if key is not None:
            try:
                renew(key)
            except Exception:  # noqa: BLE001 (a GCS hiccup: the next renewal, within the lease, may pass)
                pass


def kill_other_versions(root_prefix: str, name: str) -> None:
    """Kill the actors of every other version's pool of this data root, and delete their leases."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_del

    for other in ray.util.list_named_actors():
        if other.startswith(root_prefix) and not other.startswith(name + "-"):
            try:
                ray.kill(ray.get_actor(other, namespace=NAMESPACE), no_restart=True)
            except ValueError:
                pass  # it ended meanwhile
            _internal_kv_del(other.rsplit("-", 2)[0], namespace=NAMESPACE)


def close() -> None:
    """Kill this process's pool (its actors on every node, whichever driver made them) and delete its
    lease; nothing when this process has none."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is None:
        return
    import ray
    from ray.experimental.internal_kv import _internal_kv_del

    if not ray.is_initialized():
        return  # disconnected: the lease, no longer renewed from here, ends the actors
    _internal_kv_del(pool.name, namespace=NAMESPACE)
    for other in ray.util.list_named_actors():
        if other.startswith(pool.name + "-"):
            try:
                ray.kill(ray.get_actor(other, namespace=NAMESPACE), no_restart=True)
            except ValueError:
                pass


def forget() -> None:
    """Drop this process's handles without killing anything (it is leaving the cluster: the lease,
    no longer renewed from here, ends the actors unless another driver renews it)."""
    global _pool
    with _lock:
        _pool = None
