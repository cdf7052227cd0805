"""Live processes found by an argument of their command line, read from /proc (no psutil here): the
tests that kill what a Ray actor started on a node of the local test cluster."""

from __future__ import annotations

import glob
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
