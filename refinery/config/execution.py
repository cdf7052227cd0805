"""Where the heavy steps' tasks run: the local pool (the default; no Ray needed) or a Ray cluster.

Neither changes an output byte: a task reads its input from the data root and writes its output
there, so the engine only decides which machine does the work."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from refinery.config.section import Section

# host:port (a GCS address, `ray start --head --port`) or ray://host:port (Ray Client).
_RAY_ADDRESS = re.compile(r"^(?P<scheme>ray://)?(?P<host>[A-Za-z0-9_.\-\[\]:]+):(?P<port>[0-9]{1,5})\Z")
# The one value that joins the cluster this host registered (what Ray calls `auto`): written out so
# that a copied config never joins another job's cluster by accident.
HOST_CLUSTER = "host-cluster"
# How long the preflight and the connect wait for the head to answer before refusing.
PROBE_TIMEOUT_S = 3.0

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
    file must be readable at the same path on every node. The tasks run on the run's workers, kept
    on the cluster from one step to the next: one per CPU of each node, as many as the node's
    memory holds at `task_memory_mb` each (default: 512 MiB plus four batches of
    `stages.extract.batch_bytes` or `max_record_bytes`, whichever is larger), each running one
    task at a time. A task whose worker or node dies is sent to another worker, up to
    `max_retries` times (outputs are written under a temporary name and renamed, so a retry leaves
    no partial file)."""

    engine: Literal["local", "ray"] = "local"
    address: str | None = None
    max_retries: int = Field(default=3, ge=0, le=100)
    task_memory_mb: int | None = Field(default=None, ge=64, le=1024 * 1024)

    @field_validator("address")
    @classmethod
    def _ray_address(cls, v: str | None) -> str | None:
        if v is None or v == HOST_CLUSTER:
            return v
        if v == "auto":
            raise ValueError(f"auto joins whichever cluster this host registered last (RAY_ADDRESS, or the last "
                             f"`ray start` here), which may be another job's; write the head's host:port, or "
                             f"{HOST_CLUSTER} to join this host's cluster on purpose")
        problem = address_syntax_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _ray_needs_an_address(self) -> "ExecutionConfig":
        if self.engine == "ray" and self.address is None:
            raise ValueError(f"engine: ray needs `address` (host:port of the head, ray://host:port or {HOST_CLUSTER}); "
                             "without one every step would start a Ray instance of its own")
        return self


def address_syntax_problem(address: str) -> str | None:
    """Why `address` is not host:port or ray://host:port with a port of 1-65535 (None: it is)."""
    m = _RAY_ADDRESS.match(address)
    if m is None:
        return (f"{address!r} is not a Ray address; write host:port (the head's `ray start --head --port`), "
                f"ray://host:port (Ray Client) or {HOST_CLUSTER} (the cluster this host's `ray start` joined)")
    if not 1 <= int(m["port"]) <= 65535:
        return f"{address!r}: port {int(m['port'])} is not a TCP port (1-65535)"
    return None


def resolve_address(address: str) -> str:
    """The host:port (or ray://host:port) that `address` names: itself, or for HOST_CLUSTER the
    cluster this host registered (RAY_ADDRESS, else the address file of the last `ray start`, as Ray
    reads them). Raises ValueError naming where it looked when there is none or it is malformed."""
    if address != HOST_CLUSTER:
        return address
    found, where = os.environ.get("RAY_ADDRESS", ""), "RAY_ADDRESS"
    if not found:
        temp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
        where = os.path.join(temp, "ray", "ray_current_cluster")
        try:
            with open(where, encoding="utf-8", errors="replace") as f:
                found = f.read(1024).strip()
        except OSError:
            raise ValueError(f"{HOST_CLUSTER}: no Ray cluster is registered on this host (RAY_ADDRESS is unset and "
                             f"{where} does not exist); start one with `ray start --head`, or write the head's "
                             f"host:port") from None
    problem = address_syntax_problem(found)
    if problem:
        raise ValueError(f"{HOST_CLUSTER}: {where} holds {problem}")
    return found


def unreachable(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why no Ray head answers at `address` (host:port or ray://host:port) within `timeout_s`
    seconds, or None when one does: one gRPC call of a method only Ray serves (the GCS's cluster id,
    or the Ray Client server's cluster info), with a deadline. A closed port, a host that drops the
    packets, another server on that port and a proxy answering for any address are all refused here
    instead of hanging in `ray.init`. Needs `grpc` (Ray's dependency: only a Ray config calls it)."""
    import grpc

    m = _RAY_ADDRESS.match(address)
    method = "/ray.rpc.RayletDriver/ClusterInfo" if m["scheme"] else "/ray.rpc.NodeInfoGcsService/GetClusterId"
    with grpc.insecure_channel(f"{m['host']}:{m['port']}") as channel:
        try:
            channel.unary_unary(method)(b"", timeout=timeout_s)
        except grpc.RpcError as err:
            code = err.code()
            # UNAUTHENTICATED: a Ray head with token authentication answered; ray.init brings the token.
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return f"no answer within {timeout_s:g}s"
            if code == grpc.StatusCode.UNAVAILABLE:
                return f"nothing listens there ({(err.details() or '').split(': ')[-1]})"
            return f"the server there is not a Ray {'client server' if m['scheme'] else 'head'} ({code.name})"
    return None


def task_memory_bytes(execution: ExecutionConfig, batch_bytes: int, max_record_bytes: int) -> int:
    """What one task reserves on a Ray node: `task_memory_mb` when set, else the base plus
    BATCH_COPIES batches of the larger of `batch_bytes` and `max_record_bytes`."""
    if execution.task_memory_mb is not None:
        return execution.task_memory_mb * 1024 * 1024
    return TASK_BASE_BYTES + BATCH_COPIES * max(batch_bytes, max_record_bytes)
