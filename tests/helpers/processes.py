"""Live processes found by an argument of their command line, read from /proc (no psutil here): the
tests that kill what a Ray actor started on a node of the local test cluster; and a run that fans
tasks out to worker processes, for the tests that no worker outlives its run."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path


def with_argument(argument: str) -> list[tuple[int, int]]:
    """(pid, parent pid) of every live process with `argument` as one of its command-line arguments."""
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        proc = Path(cmdline).parent
        try:
            if argument.encode() not in Path(cmdline).read_bytes().split(b"\0"):
                continue
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # it ended while we looked
        found.append((int(proc.name), parent))
    return found


def wait_for_argument(argument: str, timeout_s: float = 120.0) -> tuple[int, int]:
    """(pid, parent pid) of the one process with `argument`, once it runs."""
    deadline = time.monotonic() + timeout_s
    while not (found := with_argument(argument)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no process with argument {argument!r} within {timeout_s:g}s")
        time.sleep(0.1)
    [one] = found
    return one


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def ended_within(pid: int, timeout_s: float) -> bool:
    """Whether `pid` ends (or is a zombie) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def pid_of_worker(refinery, item, cache) -> int:
    """A fan-out task (refinery/fanout.py) that answers with the id of the process that ran it."""
    return os.getpid()


def imported_here(module: str) -> bool:
    """Whether `module` is imported in the process that runs this (given to an isolated worker,
    refinery/stages/isolation.py: this module imports nothing beyond the standard library)."""
    return module in sys.modules


# The library's task modules, whose tasks every step's workers run (assets/ only names them).
TASK_MODULES = ("refinery.stage_file_tasks", "refinery.dedup_tasks", "refinery.contamination_tasks", "refinery.tasks")


def dagster_in_worker(refinery, item, cache) -> tuple[int, bool]:
    """A fan-out task that imports the library's task modules, touches the worker's run (config and
    data root), and answers (its process id, whether Dagster was imported in that process)."""
    import importlib

    for name in TASK_MODULES:
        importlib.import_module(name)
    refinery.root, refinery.config.seed
    return os.getpid(), "dagster" in sys.modules


# A run that fans tasks out (`refinery.fanout.map_tasks` on the config in argv[1]), prints the ids of
# every process that ran them (and the local pool's fork server) as one JSON line, then waits to be
# killed, or leaves at once when argv[2] is "exit".
RUN_THAT_FANS_OUT = textwrap.dedent("""
    import json, multiprocessing.forkserver, os, sys, time
    from refinery.fanout import map_tasks
    from assets.resource import RefineryResource
    from helpers.processes import pid_of_worker

    refinery = RefineryResource(config_path=sys.argv[1])
    pids = set()
    for step in range(3):  # three steps, as a run's assets would fan out one after another
        pids |= set(map_tasks(refinery, list(range(8)), pid_of_worker))
    pids.discard(os.getpid())
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    print(json.dumps({"workers": sorted(pids), "fork_server": server}), flush=True)
    if sys.argv[2] == "exit":
        sys.stdin.readline()  # the test has seen its workers alive: it closes stdin, the run ends
    else:
        time.sleep(600)
""")


def start_run_that_fans_out(config: str, then: str) -> tuple[subprocess.Popen, dict]:
    """`RUN_THAT_FANS_OUT` in a fresh process (this checkout and tests/ on its path); the process and
    the ids it printed, once it printed them. With `then` "exit" it ends once its stdin is closed,
    so a test can see its workers alive first."""
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", RUN_THAT_FANS_OUT, config, then], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env, cwd=tests.parent)
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=60)
        raise RuntimeError(f"the run that fans out left without printing (exit {process.returncode})")
    return process, json.loads(line)
