"""Where the heavy steps' tasks run: the local pool (the default; no Ray needed) or a Ray cluster.

Neither changes an output byte: a task reads its input from the data root and writes its output
there, so the engine only decides which machine does the work."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from refinery.config.section import Section

# host:port (a GCS address, `ray start --head --port`), ray://host:port (Ray Client) or `auto`
# (the cluster this machine's `ray start` joined, or RAY_ADDRESS).
_RAY_ADDRESS = re.compile(r"^(auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5})\Z")

# A task's reservation besides its records: the interpreter, polars, the stage's model (fastText
# lid.176 is 1 MB, the quality classifier a few MB), measured at 250-390 MiB a file step
# (bench/RESULTS.md, stage_scale), rounded up.
TASK_BASE_BYTES = 512 * 1024 * 1024
# A file step holds one input batch, its documents and rejects and a writer's buffers at once.
BATCH_COPIES = 4


class ExecutionConfig(Section):
    """Where the per-file work of every per-batch stage and the tasks of the steps after the funnel
    (dedup ranges and bands, tokenize, shuffle, scans, lineage index) run. `engine: local` (the
    default) is a pool of `partitions.workers` processes on the run's machine. `engine: ray` sends
    every task to the Ray cluster at `address`; each task reads and writes the data root itself (a
    folder every node mounts at the same path, or S3) and returns only its stats, and the config
    file must be readable at the same path on every node. A task whose worker or node dies is
    retried up to `max_retries` times (outputs are written under a temporary name and renamed, so
    a retry leaves no partial file). Each task reserves `task_memory_mb` of the node's memory
    (default: 512 MiB plus four batches of `stages.extract.batch_bytes` or `max_record_bytes`,
    whichever is larger) and one CPU, so Ray packs no more tasks on a node than fit."""

    engine: Literal["local", "ray"] = "local"
    address: str | None = None
    max_retries: int = Field(default=3, ge=0, le=100)
    task_memory_mb: int | None = Field(default=None, ge=64, le=1024 * 1024)

    @field_validator("address")
    @classmethod
    def _ray_address(cls, v: str | None) -> str | None:
        if v is not None and not _RAY_ADDRESS.match(v):
            raise ValueError(f"{v!r} is not a Ray address; write host:port (the head's `ray start --head --port`), "
                             f"ray://host:port (Ray Client) or auto (the cluster this machine joined)")
        return v

    @model_validator(mode="after")
    def _ray_needs_an_address(self) -> "ExecutionConfig":
        if self.engine == "ray" and self.address is None:
            raise ValueError("engine: ray needs `address` (host:port of the head, ray://host:port or auto); "
                             "without one every step would start a Ray instance of its own")
        return self


def task_memory_bytes(execution: ExecutionConfig, batch_bytes: int, max_record_bytes: int) -> int:
    """What one task reserves on a Ray node: `task_memory_mb` when set, else the base plus
    BATCH_COPIES batches of the larger of `batch_bytes` and `max_record_bytes`."""
    if execution.task_memory_mb is not None:
        return execution.task_memory_mb * 1024 * 1024
    return TASK_BASE_BYTES + BATCH_COPIES * max(batch_bytes, max_record_bytes)
