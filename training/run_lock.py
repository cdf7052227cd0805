"""One trainer per run directory: an exclusive `flock` on `<run_dir>/trainer-rank<r>.lock`.

Two trainers writing one run directory interleave their metrics and consumption logs and race on
checkpoints, so a second one is refused with the holder's pid, host and start time (written into
the lock file by the holder). The kernel drops a flock when its holder dies, so a lock left by a
crashed trainer is stale by construction: the next trainer takes it and says whose it was. Each
rank locks its own file, so every rank of a second torchrun job is refused, not only rank 0 (a lone
refused rank 0 would leave the others waiting in a collective), and `lock_all_ranks` refuses every
rank when any one is refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from training.checkpoint import ResumeRefused


class RunLocked(RuntimeError):
    """Another live trainer holds the run directory; the message names it."""


class RunDirBusy(ResumeRefused, RunLocked):
    """Another trainer holds the run directory."""


def lock_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"trainer-rank{rank}.lock"


def _read_holder(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        holder = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process that has not written its details yet"
    return f"pid {holder.get('pid')} on host {holder.get('host')} (started {holder.get('started')})"


class RunLock:
    """Held from `acquire()` to `release()` (or process exit); `previous` is the holder of a stale
    lock taken over, or None."""

    def __init__(self, run_dir: str | Path, rank: int = 0):
        self.path = lock_path(run_dir, rank)
        self.fd: int | None = None
        self.previous: dict[str, Any] | None = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLocked(
                f"{self.path.parent} is in use by another trainer: {_describe(holder)} holds {self.path}. "
                "Wait for it to finish or stop it, or train into another --run-dir"
            ) from None
        holder = _read_holder(fd)
        self.previous = holder or None  # a lock file with details but no flock: its holder died
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me, sort_keys=True).encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        """Clear the details and unlock; the file stays, so a waiting trainer never races an unlink."""
        if self.fd is None:
            return
        os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_all_ranks(run_dir: str | Path, rank: int, any_rank: Callable[[bool], bool]) -> RunLock:
    """This rank's lock on the run directory; every rank is refused (RunDirBusy) when any one is, so
    none is left waiting in a collective for a rank that gave up. `any_rank(flag)`: whether `flag`
    holds on some rank."""
    lock, refusal = RunLock(run_dir, rank), None
    try:
        lock.acquire()
    except RunLocked as err:
        refusal = str(err)
    if any_rank(refusal is not None) and refusal is None:
        lock.release()
        refusal = f"{run_dir}: another rank's lock is held by another trainer (see its message)"
    if refusal is not None:
        raise RunDirBusy(refusal)
    return lock
