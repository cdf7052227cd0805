"""Trainer processes that do not outlive their launcher, and SIGTERM as the way to stop one.

`SigtermFlag` turns SIGTERM into a flag the training loop reads after each step: the step
finishes, the trainer checkpoints and exits, so an orchestrator resumes it.

Killing torchrun's agent with SIGKILL leaves its rank processes training: nothing tells them. Two
guards, both ending in the trainer's SIGTERM path (finish the step, checkpoint, exit):

- `PR_SET_PDEATHSIG` (Linux prctl): the kernel sends SIGTERM the moment the parent dies. It is tied
  to the parent *thread*, so it is armed only for rank processes torchrun launched
  (`LOCAL_RANK` set), whose agent thread lives as long as the agent.
- `ParentWatch`: a daemon thread that polls `os.getppid()` and, once the parent is gone (the
  process was re-parented), sends SIGTERM to this process; if the process is still alive
  `grace_s` later (a collective waiting for a dead peer), it exits hard with `ORPHAN_EXIT`.
  A trainer meant to outlive its shell (`nohup refinery train ... &`) sets
  `REFINERY_EXIT_WITH_PARENT=0`, which turns both guards off.

Loader workers (`training.loader`) run `worker_init`: they ignore SIGTERM (a process group signal
reaches workers too, and a worker that died of it would fail the trainer before it can checkpoint)
and die with SIGKILL when their trainer dies.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from refinery.parent_death import set_parent_death_signal

EXIT_WITH_PARENT_ENV = "REFINERY_EXIT_WITH_PARENT"  # "0": keep training when the launcher exits
ORPHAN_EXIT = 75  # EX_TEMPFAIL: the launcher died; the run resumes from its checkpoint
POLL_S = 0.2


def launched_by_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ


class ParentWatch:
    """Watches the process that was this one's parent when it was made (make it early: a parent that
    dies before is never seen). Under torchrun it also arms PR_SET_PDEATHSIG at once, so a rank whose
    agent dies while it is still setting up (rendezvous, loading data) is terminated then and there."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.parent = os.getppid()
        self.enabled = os.environ.get(EXIT_WITH_PARENT_ENV, "1") != "0"
        if self.enabled and launched_by_torchrun():
            set_parent_death_signal(signal.SIGTERM)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ParentWatch":
        if not self.enabled:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="refinery-parent-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            if os.getppid() != self.parent:
                print(f"refinery train: the launcher (pid {self.parent}) died; checkpointing and exiting "
                      f"({EXIT_WITH_PARENT_ENV}=0 keeps training)", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                if not self._stop.wait(self.grace_s):
                    print(f"refinery train: still running {self.grace_s:g}s after the launcher died; exiting",
                          file=sys.stderr, flush=True)
                    os._exit(ORPHAN_EXIT)
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class SigtermFlag:
    """`raised` once SIGTERM arrived between `install()` and `restore()` (which puts back the
    handler found). Installed explicitly, and SIGTERM unblocked in this thread: a process may
    inherit SIGTERM ignored or blocked (a signal mask survives fork and exec), and then a preemption
    would go unseen."""

    def __init__(self):
        self.raised = False
        self._previous = None

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum, frame) -> None:
        self.raised = True


def worker_init(worker_id: int) -> None:
    """For each loader worker: the trainer decides when to stop, and its workers die with it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_parent_death_signal(signal.SIGKILL)
