"""A FIFO that tells whether anything opened it: the target of a symlink that must never be read.

Opening a FIFO to write blocks until a reader opens it, so a thread that opens it to write wakes
exactly when the code under test opens it to read (and then sees an empty file, never a hang).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def watched_fifo(path: Path) -> Iterator[threading.Event]:
    """Make a FIFO at `path`; the event is set once anything has opened it to read."""
    os.mkfifo(path)
    opened = threading.Event()
    done = threading.Event()

    def wait_for_reader() -> None:
        with open(path, "wb"):
            if not done.is_set():
                opened.set()

    writer = threading.Thread(target=wait_for_reader, daemon=True)
    writer.start()
    try:
        yield opened
    finally:
        done.set()
        # Be the reader ourselves, so the writer thread returns.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        writer.join(timeout=5)
        os.close(fd)
