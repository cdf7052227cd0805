"""The Pipes message reader of a local trainer launch: the file the child's default Pipes writer
appends to, tailed, and only complete lines handed over.

Why not Dagster's `PipesTempFileMessageReader`: it hands each `readline()` to `json.loads`, and at
the end of the file `readline()` returns a line the writer has not finished (one `write()` of a
message can be seen half done). The partial line fails to parse, the reader thread dies, and every
later message of the launch is lost (seen in a proxy run: `JSONDecodeError: Unterminated string`,
then "did not receive closed message from external process"). Here a line without its newline
waits for the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import dagster as dg
from dagster_pipes import PipesDefaultMessageWriter

POLL_S = 0.01  # how often the tail looks for more of the file


def complete_lines(path: str, should_stop: Callable[[], bool]) -> Iterator[str]:
    """The lines appended to `path`, each once it ends in a newline, until `should_stop()` holds at
    the end of the file (the writer is done: the session closes after the child exits). A last line
    without its newline then is left out: the writer always ends a message with one."""
    pending = ""
    with open(path, encoding="utf-8") as f:
        while True:
            piece = f.readline()
            if piece:
                pending += piece
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif should_stop():
                return
            else:
                time.sleep(POLL_S)


class WholeLineMessages(dg.PipesMessageReader):
    """Messages from a temporary file that the child's default Pipes writer appends to."""

    def __init__(self) -> None:
        self.path: str | None = None

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        folder = tempfile.mkdtemp(prefix="refinery-pipes-")
        self.path = os.path.join(folder, "messages.jsonl")
        open(self.path, "w", encoding="utf-8").close()
        done = threading.Event()

        def read() -> None:
            try:
                for line in complete_lines(self.path, done.is_set):
                    handler.handle_message(json.loads(line))
            except Exception:
                handler.report_pipes_framework_exception(f"{type(self).__name__} reader thread", sys.exc_info())

        thread = threading.Thread(target=read, name="refinery-pipes-messages", daemon=True)
        thread.start()
        try:
            yield {PipesDefaultMessageWriter.FILE_PATH_KEY: self.path}
        finally:
            done.set()
            thread.join()
            shutil.rmtree(folder, ignore_errors=True)

    def no_messages_debug_text(self) -> str:
        return f"Messages are read from {self.path}, which the trainer's Pipes writer appends to."
