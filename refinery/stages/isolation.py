"""Per-record isolation: one record's failure or overrun costs that record only.

Two ways, for two kinds of work:

- In the stage's own process (`record_alarm`, `guarded`): a record whose handling raises becomes
  `<family>/error`, one that runs past its budget `<family>/timeout` (a `Drop` the stage turns into
  the record's reject), and the rest of the table goes on. The budget is `record_timeout_s`
  (`stages.record_timeout_s` in the config; DEFAULT_RECORD_TIMEOUT_S otherwise).
- In a worker process (`IsolatedWorker`), for work that a signal cannot interrupt (C code that
  never returns to the interpreter, such as resiliparse's HTML parser): the parent sends a batch,
  the child answers item by item, and the parent waits at most `budget_s` for each answer. When an
  item overruns, the child is killed, that item is reported as timed out, and a fresh child takes
  the rest of the batch. A child that dies on an item (a crash in C) costs that item only, in the
  same way.

The child is a fresh interpreter (a fork would copy the parent's polars and Dagster threads) that
imports only refinery/stages/isolated_child.py and the function's module, so its start costs a
Python start-up plus that import (not a `multiprocessing` spawn, which imports the parent's main
module too: all of Ray in a Ray worker); it is kept for every later batch of the process.
"""

from __future__ import annotations

import atexit
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any, Callable, Literal

from refinery.stages.isolated_child import CHILD_CODE
from refinery.stages.stats import Drop

DEFAULT_RECORD_TIMEOUT_S = 5.0
ERROR_DETAIL_CHARS = 300


# --------------------------------------------------------------------------------------------------
# In the stage's process: an alarm per record
# --------------------------------------------------------------------------------------------------


class RecordTimeout(Exception):
    """A record ran past its time budget (raised by the budget's alarm inside the record's work)."""


def error_drop(family: str, err: BaseException) -> Drop:
    """`<family>/error`, with the exception's type and message as the detail."""
    return Drop(f"{family}/error", None, f"{type(err).__name__}: {err}"[:ERROR_DETAIL_CHARS])


def timeout_drop(family: str, elapsed: float, budget: float) -> Drop:
    return Drop(f"{family}/timeout", round(elapsed, 3), f"ran past the {budget:g} s budget per record")


def _on_alarm(signum: int, frame: Any) -> None:
    raise RecordTimeout()


@contextmanager
def record_alarm(budget: float | None) -> Iterator[bool]:
    """Installs the SIGALRM handler that turns an overrun into `RecordTimeout` for the duration of a
    stage run; yields whether the alarm is armed. Signals reach only the main thread, so in any
    other thread (or with no budget) records are timed, not interrupted: an overrun is still
    rejected, once the record finishes. Code in C that never returns to the interpreter (a parser
    deep inside one call) is not interrupted either; such work runs in an `IsolatedWorker` process."""
    if not budget or threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def guarded(family: str, budget: float | None, armed: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or the Drop that rejects the record: `<family>/error` when it raises,
    `<family>/timeout` when it runs past `budget` seconds."""
    start = time.perf_counter()
    try:
        try:
            if armed:
                signal.setitimer(signal.ITIMER_REAL, budget)
            result = fn(*args)
        finally:
            if armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except RecordTimeout:
        return timeout_drop(family, time.perf_counter() - start, budget or 0.0)
    except Exception as err:  # noqa: BLE001 - any failure of one record is that record's reject
        return error_drop(family, err)
    if budget and time.perf_counter() - start > budget:
        return timeout_drop(family, time.perf_counter() - start, budget)
    return result


# --------------------------------------------------------------------------------------------------
# In a worker process that can be killed in the middle of an item
# --------------------------------------------------------------------------------------------------

Status = Literal["ok", "error", "timeout"]
# A child gets this long to start and import its function before the first item's budget begins.
STARTUP_TIMEOUT_S = 120.0
# Characters of string items sent to the child at once: bounds the copies a batch of large pages makes.
MAX_SEND_CHARS = 32 * 1024 * 1024


class IsolatedWorker:
    """`map(items)` -> one `(status, value)` per item: ("ok", fn(item)), ("error", "Type: message"),
    or ("timeout", seconds waited). `fn` must be picklable (a module-level function or a partial)."""

    def __init__(self, fn: Callable[[Any], Any], budget_s: float):
        self.fn = fn
        self.budget_s = budget_s
        self.process: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.restarts = 0

    def _start(self) -> Connection:
        parent, child = Pipe()
        self.process = subprocess.Popen([sys.executable, "-c", CHILD_CODE, str(child.fileno())],
                                        pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
        child.close()
        parent.send(sys.path)
        parent.send(self.fn)
        if not parent.poll(STARTUP_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"the isolated worker for {self.fn} did not start within {STARTUP_TIMEOUT_S:g} s")
        parent.recv()
        self.conn = parent
        return parent

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn = None, None

    def map(self, items: list[Any]) -> list[tuple[Status, Any]]:
        results: list[tuple[Status, Any]] = []
        for chunk in _chunks(items, MAX_SEND_CHARS):
            results += self._map_chunk(chunk)
        return results

    def _map_chunk(self, items: list[Any]) -> list[tuple[Status, Any]]:
        results: list[tuple[Status, Any]] = []
        while len(results) < len(items):
            conn = self.conn or self._start()
            try:
                conn.send(items[len(results):])
            except (BrokenPipeError, OSError):  # the child died between batches; a fresh one retries
                self.close()
                self.restarts += 1
                continue
            while len(results) < len(items):
                start = time.perf_counter()
                try:
                    ready = conn.poll(self.budget_s)
                    answer = conn.recv() if ready else None
                except (EOFError, OSError):  # the child died on this item
                    code = None
                    if self.process is not None:
                        try:
                            code = self.process.wait(5)
                        except subprocess.TimeoutExpired:
                            pass
                    self.close()
                    self.restarts += 1
                    results.append(("error", f"WorkerDied: the worker process exited with code {code}"))
                    break
                if answer is None:
                    self.close()
                    self.restarts += 1
                    results.append(("timeout", time.perf_counter() - start))
                    break
                results.append(answer)
        return results


def _chunks(items: list[Any], max_chars: int) -> list[list[Any]]:
    """`items` cut into runs whose string lengths add up to at most `max_chars` (an item longer
    than that is a run of its own), so no send holds many large pages at once."""
    chunks: list[list[Any]] = [[]]
    size = 0
    for item in items:
        n = len(item) if isinstance(item, (str, bytes)) else 0
        if chunks[-1] and size + n > max_chars:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += n
    return [c for c in chunks if c]


_workers: dict[Any, IsolatedWorker] = {}


def shared_worker(fn: Callable[[Any], Any], budget_s: float) -> IsolatedWorker:
    """One worker per function and budget for the whole process, closed at exit."""
    key = (fn, budget_s)
    if key not in _workers:
        if not _workers:
            atexit.register(lambda: [w.close() for w in _workers.values()])
        _workers[key] = IsolatedWorker(fn, budget_s)
    return _workers[key]
