"""Independent tasks over a data root, and the one call that runs a list of them.

A step that splits its work (the shuffle's passes, the lineage index's passes) hands a `RunTasks`
a module-level task function and the tasks' inputs; it gets the results back in input order. The
asset side runs them in a process pool of `partitions.workers` (refinery/fanout.py, `task_pool`);
`in_process` runs them here, one after another. A task's result may depend only on its input and
the data root, never on which worker ran it or what ran before, so the step's output is the same
bytes whatever runs the tasks.
"""

from __future__ import annotations

from typing import Any, Callable

from refinery.storage import DataRoot

# (data root, the task's input, a cache that lives as long as the runner in one worker) -> the task's
# result. Module-level (picklable), and inputs and results small and picklable. A task keeps in the
# cache only what stays valid for the runner's life (parts written before the call that reads them).
Task = Callable[[DataRoot, Any, dict], Any]
RunTasks = Callable[[Task, list], list]


def in_process(root: DataRoot) -> RunTasks:
    """Run tasks in this process, in order, sharing one cache."""
    cache: dict = {}

    def run(task: Task, inputs: list) -> list:
        return [task(root, item, cache) for item in inputs]

    return run
