"""A child process that dies with its parent: Linux's `PR_SET_PDEATHSIG`, asked through prctl.

In the library so the fan-out's pool workers (refinery/fanout.py) and the trainer's processes
(training/lifeline.py) arm it the same way.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send `sig` when the parent dies; False where prctl is unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
