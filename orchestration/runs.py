"""The Dagster runs `refinery demo` starts, as state it can trust: whose process each belongs to,
what a dead one still holds, and what a failed one says.

Every run the demo starts is tagged with this host and process id (`run_tags`). A demo SIGKILLed in
the middle of a run leaves that run STARTED in the instance, and a step of it holding a pool slot
(training_run's `training_accelerator`, limit 1) keeps the slot forever: every later run of the step
would wait on it in silence. So before its first run a demo marks each tagged run of this host whose
process is gone as failed and frees its slots (`release_dead_runs`), and before a step that needs a
pool it waits for a free slot at most `POOL_WAIT_S`, saying which run holds it (`wait_for_pools`).
A run started elsewhere (the UI, a daemon) is never touched: only its wait is bounded.

A failed run is summarised one line per failed step (`failure_lines`): asset, partition, the
reason in one sentence, and the file holding the whole error with its tracebacks.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import dagster as dg

PID_TAG, HOST_TAG = "refinery/pid", "refinery/host"
POOL_WAIT_S = 60.0
POLL_S = 0.5
FAILURES_DIR = "failures"  # under the instance directory: one file per failed run, its whole errors
# Errors whose message is the whole story: the config or an input is wrong (exit 2, as the preflight).
INPUT_PROBLEMS = ("ConfigError", "InputColumnError", "NoCredentialsError", "PartialCredentialsError")


def run_tags() -> dict[str, str]:
    """The tags that name this process as the owner of a run."""
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has that pid: alive
        return True
    return True


def dead_owner(run: dg.DagsterRun) -> int | None:
    """The pid of the process on this host that started `run` when that process is gone, else None
    (a live owner, another host's run, or a run the demo did not start)."""
    pid, host = run.tags.get(PID_TAG), run.tags.get(HOST_TAG)
    if pid is None or host != socket.gethostname() or int(pid) == os.getpid():
        return None
    return None if process_alive(int(pid)) else int(pid)


def release_dead_runs(instance: dg.DagsterInstance, log: Callable[[str], None] = print) -> list[str]:
    """Mark every unfinished run whose demo process is gone as failed and free its pool slots;
    returns their run ids."""
    import dagster as dg
    from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES

    released = []
    for run in instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED_STATUSES)):
        pid = dead_owner(run)
        if pid is None:
            continue
        why = f"the process that ran it (pid {pid} on {run.tags[HOST_TAG]}) is gone"
        instance.report_run_failed(run, message=f"refinery demo: {why}")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        log(f"Marked run {run.run_id} failed and freed its pool slots: {why}")
        released.append(run.run_id)
    return released


def run_warnings(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """One line per warning a run logged (`  warning: <step>: <message>`)."""
    import logging

    return [f"  warning: {entry.step_key or 'run'}: {' '.join(entry.user_message.split())}"
            for entry in instance.all_logs(run_id) if entry.level == logging.WARNING and entry.user_message]


class PoolBusy(RuntimeError):
    """A pool slot stayed held by another run for the whole wait."""


def slot_holders(instance: dg.DagsterInstance, pool: str) -> list[str]:
    """`run <id> (<step>, <status>)` for each run holding a slot of `pool`, when every slot is held;
    empty when one is free."""
    info = instance.event_log_storage.get_concurrency_info(pool)
    if info.limit is None or len(info.claimed_slots) < info.limit:
        return []
    out = []
    for slot in info.claimed_slots:
        run = instance.get_run_by_id(slot.run_id)
        status = run.status.value if run is not None else "unknown to this instance"
        out.append(f"run {slot.run_id} ({slot.step_key}, {status})")
    return out


def wait_for_pools(instance: dg.DagsterInstance, pools: set[str], log: Callable[[str], None] = print,
                   timeout_s: float = POOL_WAIT_S) -> None:
    """Return once every pool in `pools` has a free slot, saying what it waits for; raise PoolBusy
    naming the holders after `timeout_s`. An instance that keeps no pool slots never waits."""
    if not instance.event_log_storage.supports_global_concurrency_limits:
        return
    for pool in sorted(pools):
        deadline = time.monotonic() + timeout_s
        holders = slot_holders(instance, pool)
        if holders:
            log(f"  waiting up to {timeout_s:.0f}s for a slot of pool {pool!r}, held by {'; '.join(holders)}")
        while holders:
            if time.monotonic() > deadline:
                raise PoolBusy(
                    f"pool {pool!r} stayed full for {timeout_s:.0f}s, held by {'; '.join(holders)}; wait for it to "
                    f"finish, or free it in the UI (Deployment, Concurrency) if that run is gone")
            time.sleep(POLL_S)
            holders = slot_holders(instance, pool)


@dataclass
class FailedStep:
    """One failed step of a run: what failed, why in one sentence, and its error in full."""

    asset: str
    partitions: str
    reason: str
    error: str
    input_problem: bool

    @property
    def name(self) -> str:
        return f"{self.asset}[{self.partitions}]" if self.partitions else self.asset

    def line(self, log_file: Path) -> str:
        return f"FAILED {self.name}: {self.reason} (log: {log_file})"


def innermost(error) -> object:
    """The innermost cause of a serialized error: the user's exception under Dagster's wrappers."""
    while error.cause is not None:
        error = error.cause
    return error


def failed_steps(result: dg.ExecuteInProcessResult, partitions: str) -> list[FailedStep]:
    """Each failed step of an in-process run over `partitions` (a key, a range `a..b`, or "" for an
    unpartitioned run)."""
    out = []
    for event in result.get_step_failure_events():
        data = event.step_failure_data
        error = data.error
        deepest = innermost(error) if error is not None else None
        user = data.user_failure_data
        if user is not None and user.description:
            reason = user.description
        elif deepest is not None:
            reason = deepest.message.strip()
        else:
            reason = "failed with no error recorded"
        reason = " ".join(reason.split())
        full = error.to_string() if error is not None else reason
        kinds = set()
        while error is not None:
            kinds.add(error.cls_name)
            error = error.cause
        out.append(FailedStep(event.step_key, partitions, reason, full, bool(kinds & set(INPUT_PROBLEMS))))
    return out


class StepsFailed(RuntimeError):
    """A run of the graph failed: one summary line per failed step, each naming its log file."""

    def __init__(self, steps: list[FailedStep], run_id: str, log_file: Path):
        self.steps, self.run_id, self.log_file = steps, run_id, log_file
        self.lines = [s.line(log_file) for s in steps] or [f"FAILED run {run_id} (log: {log_file})"]
        super().__init__("\n".join(self.lines))

    @property
    def input_problem(self) -> bool:
        return bool(self.steps) and all(s.input_problem for s in self.steps)


def record_failure(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult, partitions: str) -> StepsFailed:
    """Write a failed run's errors in full to `<instance>/failures/<run id>.log`; the exception that
    summarises them."""
    steps = failed_steps(result, partitions)
    folder = Path(instance.root_directory) / FAILURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    log_file = folder / f"{result.run_id}.log"
    text = "".join(f"== {s.name} (run {result.run_id})\n{s.error}\n" for s in steps)
    log_file.write_text(text or f"run {result.run_id} failed with no step failure recorded\n")
    return StepsFailed(steps, result.run_id, log_file)
